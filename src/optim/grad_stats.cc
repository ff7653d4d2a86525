// ComputeGradStats: the fused inf/NaN + sum-of-squares pass over gradient shards.
#include "strata/grad_stats.h"

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_reduce.h>

#include <cmath>
#include <string>

#include "optim/kernels.h"
#include "optim/parallel.h"

namespace strata {
namespace {

Status CheckShard(GradView g, size_t n) {
  if (n > 0 && g.data == nullptr) {
    return InvalidArgumentError("ComputeGradStats: null gradient pointer with n = " + std::to_string(n));
  }
  return OkStatus();
}

// A fixed reduction tree (parallel_deterministic_reduce over fixed tiles), so the sum's
// bits do not depend on the thread count or on scheduling.
GradStats Reduce(optim::GradStatsKernelFn kernel, GradView g, size_t n) {
  if (n == 0) return {};
  const size_t tiles = (n + optim::kTileElems - 1) / optim::kTileElems;
  return tbb::parallel_deterministic_reduce(
      tbb::blocked_range<size_t>(0, tiles, 1), GradStats{},
      [&](const tbb::blocked_range<size_t>& r, GradStats acc) {
        for (size_t t = r.begin(); t != r.end(); ++t) {
          const size_t b = t * optim::kTileElems;
          const size_t e = b + optim::kTileElems < n ? b + optim::kTileElems : n;
          GradStats tile;
          kernel(g, b, e, &tile.sum_sq, &tile.has_inf_nan);
          acc.Merge(tile);
        }
        return acc;
      },
      [](GradStats a, const GradStats& b) {
        a.Merge(b);
        return a;
      });
}

}  // namespace

Result<GradStats> ComputeGradStatsWithIsa(CpuIsa isa, GradView grad, size_t n, tbb::task_arena* arena) {
  STRATA_RETURN_IF_ERROR(CheckShard(grad, n));
  if (!CpuSupports(isa)) {
    return UnavailableError("ComputeGradStats: CPU instruction set " + std::string(CpuIsaName(isa)) +
                            " is not available on this CPU");
  }
  GradStats out;
  optim::InArena(arena, [&] { out = Reduce(optim::KernelsFor(isa).grad_stats, grad, n); });
  return out;
}

Result<GradStats> ComputeGradStats(GradView grad, size_t n, tbb::task_arena* arena) {
  STRATA_ASSIGN_OR_RETURN(const CpuIsa isa, ActiveCpuIsa());
  return ComputeGradStatsWithIsa(isa, grad, n, arena);
}

Result<GradStats> ComputeGradStats(std::span<const GradShard> shards, tbb::task_arena* arena) {
  for (const GradShard& s : shards) STRATA_RETURN_IF_ERROR(CheckShard(s.grad, s.n));
  STRATA_ASSIGN_OR_RETURN(const CpuIsa isa, ActiveCpuIsa());
  const optim::GradStatsKernelFn kernel = optim::KernelsFor(isa).grad_stats;
  GradStats total;
  // Shards in order (each one parallel inside): the merged sum is deterministic too.
  optim::InArena(arena, [&] {
    for (const GradShard& s : shards) total.Merge(Reduce(kernel, s.grad, s.n));
  });
  return total;
}

GradStats ComputeGradStatsReference(GradView grad, size_t n) {
  GradStats st;
  for (size_t i = 0; i < n; ++i) {
    float x;
    switch (grad.type) {
      case DType::kF32: x = static_cast<const float*>(grad.data)[i]; break;
      case DType::kBf16: x = Bf16ToFloat(static_cast<const Bf16*>(grad.data)[i]); break;
      default: x = Fp16ToFloat(static_cast<const Fp16*>(grad.data)[i]); break;
    }
    if (!std::isfinite(x)) st.has_inf_nan = true;
    st.sum_sq += static_cast<double>(x) * x;
  }
  return st;
}

}  // namespace strata
