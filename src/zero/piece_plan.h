// How the NVMe optimizer cuts each chunk's shard into pieces (sub-groups), and whether
// stage-3 parameters are published behind the step or read from the optimizer state.
// A pure function of the configuration and the layout: it allocates nothing, so it is
// tested (and can be planned ahead of a run) on its own.
#pragma once

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
