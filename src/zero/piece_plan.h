// How the NVMe optimizer cuts each chunk's shard into pieces (sub-groups), and whether
// stage-3 parameters are published behind the step or read from the optimizer state.
// A pure function of the configuration and the layout: it allocates nothing, so it is
// tested (and can be planned ahead of a run) on its own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "strata/config.h"
#include "strata/dtype.h"
#include "zero/layout.h"

namespace strata::zero {

// The NVMe optimizer steps a chunk's shard in pieces of at most this much state
// (master | m | v): small enough that even a tight host budget holds several staging
// sets, so reads run ahead and writes behind while a piece steps; large enough (16
// requests of the default 1 MiB block) that each piece keeps the disk's queue full.
inline constexpr uint64_t kPieceStateBytes = 16ull << 20;

// Where a chunk's shard is cut into pieces, for whoever reads or writes them: the NVMe
// optimizer, the gathers that read parameters from its master, checkpoints.
struct PieceShape {
  int64_t opt_elems = 0;    // elements of a chunk this rank steps
  int64_t piece_elems = 0;  // elements per piece (the last one may have fewer)
  int pieces = 1;           // per chunk
  // By Key(chunk, piece): 0 for a piece wholly in a chunk's padding (e.g. a small module
  // alone in a chunk); its state stays zero, so it is never read, stepped or written.
  // Empty: every piece is live.
  std::vector<uint8_t> live;

  int64_t Elems(int p) const { return std::min<int64_t>(piece_elems, opt_elems - p * piece_elems); }
  // One piece's master | m | v, as a staging set and an NVMe slot hold it.
  uint64_t Bytes(int p) const { return (3 * Elems(p) * 4 + 4095) / 4096 * 4096; }
  // One piece of `elem_bytes` per element as a swap slot or pinned buffer holds it, and a
  // chunk's shard as a swap of such slots holds it (piece_swap.h).
  uint64_t SlotBytes(size_t elem_bytes) const { return (piece_elems * elem_bytes + 4095) / 4096 * 4096; }
  uint64_t ShardSlotBytes(size_t elem_bytes) const {
    uint64_t bytes = 0;
    for (int p = 0; p < pieces; ++p) bytes += (Elems(p) * elem_bytes + 4095) / 4096 * 4096;
    return bytes;
  }
  int Key(int chunk, int p) const { return chunk * pieces + p; }
  bool Live(int chunk, int p) const { return live.empty() || live[Key(chunk, p)]; }
};

struct PieceInputs {
  const Layout* layout = nullptr;
  int stage = 0;
  bool optimizer_on_nvme = false;
  bool params_on_nvme = false;  // stage 3's shards between uses
  DType compute = DType::kF32;
  int64_t opt_elems = 0;        // elements of a chunk this rank steps
  int64_t opt_offset = 0;       // where they start in the chunk
  uint64_t sub_group_size = 0;  // zero_optimization.sub_group_size (elements)
};

struct PiecePlan {
  int64_t piece_elems = 0;       // the last piece may have fewer
  int pieces = 1;                // per chunk
  uint64_t opt_set_bytes = 0;    // one piece's master | m | v, 4 KiB aligned
  uint64_t grad_slot_bytes = 0;  // one fp32 gradient shard, 4 KiB aligned
  // Both on NVMe: the new 16-bit shard is assembled and written behind the step.
  bool publish_behind = false;
  // publish_behind in fp32: the shard is the master, read from the optimizer state.
  bool params_from_master = false;
  // By chunk * pieces + piece (optimizer on NVMe only): 0 for a piece wholly in padding.
  std::vector<uint8_t> piece_live;
  // Set when pieces are so small that NVMe requests cost more than they move.
  std::string warning;
};

PiecePlan PlanPieces(const PieceInputs& in);

}  // namespace strata::zero
