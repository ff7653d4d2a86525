// A fused pass over a gradient shard: does it hold inf/NaN, and its sum of squares (for
// global-norm clipping across shards: sum the shards' sum_sq over ranks, then
// norm = sqrt(total)). CPU (SIMD, runtime ISA dispatch as in cpu_isa.h, oneTBB) and CUDA.
//
// Contract:
//  - sum_sq is accumulated in double from the fp32 values (bf16/fp16 converted exactly),
//    so it is exact to about 1e-15 relative for any realistic shard; the CPU result is
//    deterministic (same data, same ISA and thread count -> same bits: the reduction tree
//    is fixed). When the shard holds inf or NaN, has_inf_nan is true and sum_sq is
//    unspecified (not used: the step is skipped).
//  - The caller owns the buffers; nothing is allocated per call (CPU). Any thread.
//  - Errors: InvalidArgument for a null pointer with n > 0; the ISA errors of cpu_isa.h;
//    CUDA: launch/copy errors, Unavailable without CUDA.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstddef>
#include <span>

#include "strata/adam.h"
#include "strata/half.h"
#include "strata/status.h"

namespace strata {

struct GradStats {
  double sum_sq = 0;
  bool has_inf_nan = false;
  // Merges another shard's stats (sum and or).
  void Merge(const GradStats& o) {
    sum_sq += o.sum_sq;
    has_inf_nan = has_inf_nan || o.has_inf_nan;
  }
};

struct GradShard {
  GradView grad;
  size_t n = 0;
};

// One shard, active CPU ISA.
Result<GradStats> ComputeGradStats(GradView grad, size_t n, tbb::task_arena* arena = nullptr);
// Many shards merged into one result, in one parallel pass.
Result<GradStats> ComputeGradStats(std::span<const GradShard> shards, tbb::task_arena* arena = nullptr);
// Explicit ISA (tests, benchmarks).
Result<GradStats> ComputeGradStatsWithIsa(CpuIsa isa, GradView grad, size_t n,
                                          tbb::task_arena* arena = nullptr);
// Plain reference (scalar, double).
GradStats ComputeGradStatsReference(GradView grad, size_t n);

// CUDA: the shards' pointers are device memory. Enqueues the pass on `cuda_stream` (a
// cudaStream_t as void*), then waits for that stream and returns the merged result. The
// 16-byte device scratch comes from the stream-ordered pool (cudaMallocAsync), so no
// cudaMalloc per call. Unavailable without CUDA.
Result<GradStats> ComputeGradStatsCuda(std::span<const GradShard> shards, void* cuda_stream);

}  // namespace strata
