#include "zero/gather_plan.h"

#include <algorithm>

#include "zero/keep_plan.h"

namespace strata::zero {
namespace {

// The prefetch window's extra buffers beyond one module's: up to kMaxPrefetchModules
// modules, within the room and DeepSpeed's caps.
uint64_t WindowBuffers(const GatherInputs& in, uint64_t cap) {
  const Layout& l = *in.layout;
  const uint64_t n_chunks = l.num_chunks, module = in.max_module_chunks;
  uint64_t extra = std::min<uint64_t>(module * (1 + kMaxPrefetchModules), n_chunks) - module;
  extra = std::min<uint64_t>({extra, in.room / in.chunk_bytes, cap});
  // A gather beyond the staging buffers reads only when one frees, on the serial fetch
  // worker: more would hold device memory to queue (the 100M bench: 315 MiB of device
  // instead of 183, and no faster).
  if (in.staging_limit > 0) extra = std::min<uint64_t>(extra, in.staging_limit);
  // DeepSpeed's stage3_prefetch_bucket_size counts parameters gathered ahead of need.
  if (in.zero->stage3_prefetch_bucket_size) {
    extra = std::min<uint64_t>(extra, in.zero->stage3_prefetch_bucket_size / l.chunk_elems);
  }
  return extra;
}

// The largest count in [0, n] whose peak fits `allowed` (a plan's peak grows with it).
template <typename PeakOf>
int LargestFitting(int n, int allowed, PeakOf peak_of) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (peak_of(mid) <= allowed)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace

GatherPlanResult PlanGather(const GatherInputs& in) {
  const Layout& l = *in.layout;
  const Trace& trace = *in.trace;
  const ZeroConfig& z = *in.zero;
  const uint64_t n_chunks = l.num_chunks, module = in.max_module_chunks;
  uint64_t cap = z.stage3_max_live_parameters
                     ? std::max<uint64_t>(z.stage3_max_live_parameters / l.chunk_elems, module)
                     : n_chunks;
  cap -= std::min<uint64_t>(cap, module);
  GatherPlanResult out;
  GatherPlan& g = out.plan;
  // Less than one module's chunks ahead: no window at all (the buffers kept chunks hold
  // before their forward must not serve as one, or the plan's peak would not hold).
  g.max_prefetch_modules = static_cast<int>(WindowBuffers(in, cap) / module);
  // What is left keeps chunks gathered from forward to backward, nearest reuse first,
  // instead of reading, copying and all-gathering them again: as many as the buffers
  // the budget allows hold at the trace's fullest point, which the window and the kept
  // chunks partly share (the last modules are both).
  const int allowed = in.fixed_buffers + static_cast<int>(std::min<uint64_t>(in.room / in.chunk_bytes, cap));
  auto plan = [&](int spare) {
    return PlanKeep(l, trace, z.stage3_max_reuse_distance, z.stage3_param_persistence_threshold, spare);
  };
  const int n = static_cast<int>(n_chunks);
  g.kept = plan(LargestFitting(n, allowed, [&](int spare) {
             return PeakGathered(l, trace, plan(spare).kept, g.max_prefetch_modules);
           })).kept;
  // With gradient accumulation, the chunks the end of backward used last and the next
  // micro-batch's forward uses first stay too, as the same buffers allow.
  const int micro_batches = std::max(in.micro_batches, 1);
  auto carry_peak = [&](int count) {
    const std::vector<uint8_t> carried = PlanCarry(l, trace, z.stage3_max_reuse_distance, count);
    return PeakGathered(l, trace, g.kept, g.max_prefetch_modules, carried, micro_batches);
  };
  const int carry = micro_batches > 1 ? LargestFitting(n, allowed, carry_peak) : 0;
  g.carried = PlanCarry(l, trace, z.stage3_max_reuse_distance, carry);
  g.buffers = std::max(carry_peak(carry), in.fixed_buffers);
  // A run's chunks have a buffer of their own (PeakGathered does not count them): they
  // stay gathered from their first use to their last, and between micro-batches, for
  // nothing. A tied embedding is then gathered once a micro-batch, not once a use.
  for (int c = 0; c < n; ++c) {
    if (!l.InRun(c)) continue;
    g.kept[c] = 1;
    if (micro_batches > 1) g.carried[c] = 1;
  }
  out.extra_bytes = static_cast<uint64_t>(g.buffers - in.fixed_buffers) * in.chunk_bytes;
  return out;
}

}  // namespace strata::zero
