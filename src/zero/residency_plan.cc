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

ResidencyPlan PlanResidency(const ResidencyInputs& in) {
  const int n = in.layout->num_chunks;
  const uint64_t set = std::max<uint64_t>(in.set_bytes, 1);
  ResidencyPlan p;
  int count = 0;
  if (in.fraction >= 0) {
    count = ResidentCount(n, in.fraction);  // its state is in the fixed needs
  } else {
    // The most chunks that fit beside the pipeline the rest then want.
    for (int k = n; k > 0; --k) {
      const uint64_t need = k * in.chunk_bytes + (WantedSets(n - k, in.pieces) - 1) * set;
      if (need <= in.room) {
        count = k;
        break;
      }
    }
    p.extra_bytes = count * in.chunk_bytes;
  }
  const uint64_t left = in.room - std::min(in.room, p.extra_bytes);
  const uint64_t more = std::min<uint64_t>(WantedSets(n - count, in.pieces) - 1, left / set);
  p.staging_sets = 1 + static_cast<int>(more);
  p.extra_bytes += more * set;
  p.resident.assign(n, 0);
  const std::vector<int> order = ResidencyOrder(*in.layout, *in.trace);
  for (int i = 0; i < count; ++i) p.resident[order[i]] = 1;
  p.count = count;
  return p;
}

}  // namespace strata::zero
