// How far ahead in the trace stage 3 starts gathering parameters (internal).
//
// Measured, not tuned: a gather issued when module p starts has the compute of the
// modules before the one it serves to arrive in, so the depth is the number of modules
// whose compute covers one gather's latency, plus one for the spread around the mean.
// Both inputs are the last step's own averages (gather: issue to all-gathered, under
// that step's disk and link traffic; compute: between a module's hooks), so the depth
// follows the bandwidths the step actually got. When gathers are slower than compute
// (the disk is the bottleneck) the latency grows with the depth and the depth climbs to
// the budget's limit, where the most reads are in flight; when compute is slower, the
// depth settles at 2 and frees gather buffers for nothing else to wait on.
#pragma once

#include <algorithm>
#include <cmath>

namespace strata::zero {

// max_depth >= 1 is what the gather buffers (device budget, stage3_max_live_parameters,
// stage3_prefetch_bucket_size) allow. Without a measurement (a non-positive input) the
// depth is max_depth: nothing is known yet, and deeper costs no correctness.
inline int PrefetchDepth(double gather_latency_s, double module_compute_s, int max_depth) {
  max_depth = std::max(max_depth, 1);
  if (!(gather_latency_s > 0) || !(module_compute_s > 0)) return max_depth;
  const double modules = std::ceil(gather_latency_s / module_compute_s) + 1;
  return static_cast<int>(std::clamp(modules, 1.0, static_cast<double>(max_depth)));
}

}  // namespace strata::zero
