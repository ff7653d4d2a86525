#include "zero/residency_plan.h"

#include <algorithm>
#include <cmath>

namespace strata::zero {
namespace {

// Staging sets the pipeline of `nvme_chunks` chunks stepped from disk wants: one per
// piece, up to the depth that pays (kStagingChunkSets chunks' pieces); at least the
// fixed one.
int WantedSets(int nvme_chunks, int pieces) {
  return std::max(1, std::min(kStagingChunkSets, nvme_chunks) * pieces);
}

// The chunks sorted by `before` (stable: ties keep the lower chunk first).
template <class Before>
std::vector<int> ChunksOrdered(int num_chunks, Before before) {
  std::vector<int> order(num_chunks);
  for (int c = 0; c < num_chunks; ++c) order[c] = c;
  std::stable_sort(order.begin(), order.end(), before);
  return order;
}

}  // namespace

std::vector<int> ResidencyOrder(const Layout& layout, const Trace& trace) {
  const ChunkUses uses = UsesOf(trace, layout);
  return ChunksOrdered(layout.num_chunks, [&](int a, int b) { return uses.last_use[a] > uses.last_use[b]; });
}

std::vector<int> ParamResidencyOrder(const Layout& layout, const Trace& trace) {
  const ChunkUses uses = UsesOf(trace, layout);
  // A chunk no module uses (-1) goes last.
  auto first = [&](int c) { return static_cast<unsigned>(uses.first_use[c]); };
  return ChunksOrdered(layout.num_chunks, [&](int a, int b) { return first(a) < first(b); });
}

int ResidentCount(int num_chunks, double fraction) {
  return static_cast<int>(std::clamp(std::lround(fraction * num_chunks), 0L, static_cast<long>(num_chunks)));
}

int PipelineFloorSets(int chunks_on_disk, int pieces) {
  return std::min(kMinStagingSets, WantedSets(chunks_on_disk, pieces)) - 1;
}

ResidencyPlan PlanResidency(const ResidencyInputs& in) {
  const int n = in.layout->num_chunks;
  const uint64_t set = std::max<uint64_t>(in.set_bytes, 1), grad = in.grad_bytes;
  const uint64_t state = in.chunk_bytes - grad;
  const bool auto_state = in.fraction < 0, auto_grads = in.keep_grads && in.grad_fraction < 0 && grad > 0;
  // The chunks whose gradient shards the fixed needs hold: the explicit fractions'.
  const int fixed_count = auto_state ? 0 : ResidentCount(n, in.fraction);
  const int paid =
      std::max(fixed_count, in.grad_fraction < 0 || grad == 0 ? 0 : ResidentCount(n, in.grad_fraction));
  // The staging sets beyond the fixed one that the chunks left on disk want.
  auto pipeline = [&](int resident) { return (WantedSets(n - resident, in.pieces) - 1) * set; };
  // Pinned bytes beyond the fixed needs with `k` chunks resident and `kept` gradient
  // shards pinned (both prefixes of the same order).
  auto extra = [&](int k, int kept) {
    return (auto_state ? k * state : 0) + (std::max({k, kept, paid}) - paid) * grad;
  };
  // The largest k in (lo, hi] that `fits`, else lo.
  auto largest = [](int lo, int hi, auto fits) {
    for (int k = hi; k > lo; --k) {
      if (fits(k)) return k;
    }
    return lo;
  };
  int count = fixed_count, kept = paid;
  if (auto_grads && in.grads_first) {
    // Every gradient shard that fits beside the pipeline's floor (kMinStagingSets), then
    // the chunks whose state fits beside a full pipeline (their shards already paid for).
    const uint64_t sets_left = PipelineFloorSets(n - count, in.pieces) * set;
    kept = largest(paid, n, [&](int j) { return extra(count, j) + sets_left <= in.room; });
    if (auto_state) count = largest(0, kept, [&](int k) { return extra(k, kept) + pipeline(k) <= in.room; });
  } else {
    // The most chunks that fit beside the pipeline the rest then want; then gradient
    // shards beside its floor, which cut bytes on the disk where a deeper pipeline only
    // hides them.
    if (auto_state) count = largest(0, n, [&](int k) { return extra(k, paid) + pipeline(k) <= in.room; });
    kept = std::max(paid, count);
    const uint64_t sets_left = PipelineFloorSets(n - count, in.pieces) * set;
    if (auto_grads) kept = largest(kept, n, [&](int j) { return extra(count, j) + sets_left <= in.room; });
  }
  uint64_t used = extra(count, kept);
  ResidencyPlan p;
  const uint64_t more = std::min<uint64_t>(WantedSets(n - count, in.pieces) - 1, (in.room - used) / set);
  p.staging_sets = 1 + static_cast<int>(more);
  used += more * set;
  p.extra_bytes = used;
  p.resident.assign(n, 0);
  p.grad_resident.assign(n, 0);
  const std::vector<int> order = ResidencyOrder(*in.layout, *in.trace);
  for (int i = 0; i < std::max(count, kept); ++i) (i < count ? p.resident : p.grad_resident)[order[i]] = 1;
  p.count = count;
  p.grad_count = std::max(0, kept - count);
  return p;
}

}  // namespace strata::zero
