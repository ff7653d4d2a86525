// The rate of the matrix products on one shape, measured now: the CPU's (model::Gemm, on
// this machine's threads) or the GPU's (the CUDA linear layer on cuBLAS). The denominator
// of a run's model flops utilisation (MFU), the peak a model's step is set beside
// (docs/benchmarks.md).
#pragma once

#include <cstdint>
#include <string>

#include "strata/dtype.h"
#include "strata/status.h"

namespace strata::tools {

struct GemmRate {
  int64_t m = 0, n = 0, k = 0;  // C [m, n] = A [m, k] B [k, n]
  double flops_per_s = 0;       // 2 m n k per call, the best of the timed rounds
  int calls = 0;
  std::string library = "Gemm";  // whose products: "Gemm" (CPU) or "the CUDA linear layer"
  std::string Shape() const;     // "[1024 x 128] x [128 x 512]"
};

// Calls model::Gemm on fresh buffers (touched once before timing) for about `seconds`,
// in rounds of a few calls, and keeps the best round. Runs on the caller's oneTBB arena,
// as the model's kernels do. Requires m, n, k >= 1.
GemmRate MeasureGemmRate(int64_t m, int64_t n, int64_t k, double seconds = 0.3);

// The GPU's: model::cuda::LinearForward (fp32 activations, `weights` as the model's
// parameters, the precision STRATA_CUDA_MATMUL sets) on the default stream, on device
// buffers allocated and freed here, for about `seconds` in rounds that each end with a
// synchronize. Unavailable without a usable GPU (or CUDA); a CUDA error as its Status.
Result<GemmRate> MeasureDeviceGemmRate(int64_t m, int64_t n, int64_t k, DType weights, double seconds = 0.3);

}  // namespace strata::tools
