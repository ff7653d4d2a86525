// The rate of the CPU matrix products (model::Gemm) on one shape, measured now on this
// machine's threads: the denominator of a CPU run's model flops utilisation (MFU), the
// peak that a model's step is set beside (docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <string>

namespace strata::tools {

struct GemmRate {
  int64_t m = 0, n = 0, k = 0;  // C [m, n] = A [m, k] B [k, n]
  double flops_per_s = 0;       // 2 m n k per call, the best of the timed rounds
  int calls = 0;
  std::string Shape() const;  // "[1024 x 128] x [128 x 512]"
};

// Calls model::Gemm on fresh buffers (touched once before timing) for about `seconds`,
// in rounds of a few calls, and keeps the best round. Runs on the caller's oneTBB arena,
// as the model's kernels do. Requires m, n, k >= 1.
GemmRate MeasureGemmRate(int64_t m, int64_t n, int64_t k, double seconds = 0.3);

}  // namespace strata::tools
