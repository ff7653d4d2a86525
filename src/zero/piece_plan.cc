#include "zero/piece_plan.h"

#include <algorithm>

#include "strata/units.h"
#include "zero/budget_check.h"

namespace strata::zero {
namespace {

// A gather reads each piece's master into its place in the shard: O_DIRECT wants every
// piece to start on a 4 KiB boundary there (the shard is a multiple of 2048), so pieces
// become multiples of 1024 elements: rounded up (no more pieces) unless that passes the
// cap, then down. A cap below 1024 keeps the parameter swap.
void AlignForMasterReads(int64_t cap, PiecePlan& p) {
  if (!p.params_from_master || p.piece_elems % 1024 == 0) return;
  const int64_t up = (p.piece_elems + 1023) / 1024 * 1024;
  if (up <= cap) {
    p.piece_elems = up;
  } else if (p.piece_elems > 1024) {
    p.piece_elems = p.piece_elems / 1024 * 1024;
  } else {
    p.params_from_master = false;
  }
}

}  // namespace

PiecePlan PlanPieces(const PieceInputs& in) {
  const Layout& l = *in.layout;
  PiecePlan p;
  p.grad_slot_bytes = Align4K(in.opt_elems * 4);
  p.piece_elems = std::max<int64_t>(in.opt_elems, 1);
  p.publish_behind = in.optimizer_on_nvme && in.stage == 3 && in.params_on_nvme;
  p.params_from_master = p.publish_behind && in.compute == DType::kF32;
  if (in.optimizer_on_nvme) {
    // sub_group_size (DeepSpeed's key) bounds a piece from above; the engine's own cap
    // keeps pieces small enough to pipeline whatever the model's chunk size.
    const int64_t cap = std::max<int64_t>(
        std::min<int64_t>(static_cast<int64_t>(std::min<uint64_t>(in.sub_group_size, kPieceStateBytes / 12)),
                          in.opt_elems),
        1);
    const int64_t k = (in.opt_elems + cap - 1) / cap;
    p.piece_elems = std::max<int64_t>((in.opt_elems + k - 1) / k, 1);  // k pieces, none above the cap
    AlignForMasterReads(cap, p);
  }
  p.pieces = std::max<int>(static_cast<int>((in.opt_elems + p.piece_elems - 1) / p.piece_elems), 1);
  p.opt_set_bytes = Align4K(3 * p.piece_elems * 4);
  if (p.pieces > 1 && 12 * p.piece_elems < (1 << 20)) {
    p.warning =
        "zero_optimization.sub_group_size " + std::to_string(in.sub_group_size) +
        " cuts each shard's optimizer state into " + std::to_string(p.pieces) + " pieces of " +
        FormatBytes(12 * p.piece_elems) +
        ": NVMe requests that small cost more than they move; raise it, or leave the default and strata "
        "takes pieces of up to 16 MiB";
  }
  if (!in.optimizer_on_nvme) return p;
  p.piece_live.assign(static_cast<size_t>(l.num_chunks) * p.pieces, 1);
  for (int c = 0; c < l.num_chunks; ++c) {
    for (int q = 0; q < p.pieces; ++q) {
      const int64_t begin = in.opt_offset + q * p.piece_elems;
      const int64_t end = begin + std::min<int64_t>(p.piece_elems, in.opt_elems - q * p.piece_elems);
      for (const auto& [g0, g1] : l.chunk_gaps[c]) {
        if (g0 <= begin && end <= g1) p.piece_live[static_cast<size_t>(c) * p.pieces + q] = 0;
      }
    }
  }
  return p;
}

}  // namespace strata::zero
