// Internal: plain-data interface between the C++ host wrappers (adam_cuda.cc) and the
// CUDA kernels (adam_kernel.cu, grad_stats_kernel.cu), so that the .cu files include
// neither oneTBB nor C++20-only headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::optim::cuda {

// dtype codes: 0 f32, 1 bf16, 2 fp16 (DType's values). out_type 255: no 16-bit copy.
struct AdamTensorArgs {
  float* p;
  float* m;
  float* v;
  const void* g;
  void* out;
  uint64_t n;
  float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, inv_sqrt_bc2, decay, l2, grad_scale;
  uint8_t g_type;
  uint8_t out_type;
};

// Kernel parameters stay under the classic 4 KiB limit.
inline constexpr int kMaxTensorsPerLaunch = 32;
struct AdamBatch {
  AdamTensorArgs t[kMaxTensorsPerLaunch];
  int count;
};

struct GradShardArgs {
  const void* g;
  uint64_t n;
  uint8_t type;
};
inline constexpr int kMaxShardsPerLaunch = 128;
struct GradStatsBatch {
  GradShardArgs s[kMaxShardsPerLaunch];
  int count;
};

// Each returns 0 on success or a cudaError_t value; `what` is set to a static string
// naming the failed call.
int LaunchAdam(const AdamBatch& batch, uint64_t max_n, void* stream, const char** what);
// Accumulates into the device scratch (double sum_sq, int flag) the caller has zeroed.
int LaunchGradStats(const GradStatsBatch& batch, uint64_t max_n, void* scratch, void* stream,
                    const char** what);
// The grad-stats round trip: scratch from the stream's pool, zeroed, every batch, copy
// back, synchronize. `batches` has `count` entries.
int RunGradStats(const GradStatsBatch* batches, int count, const uint64_t* max_ns, void* stream,
                 double* sum_sq, int* flag, const char** what);
const char* ErrorString(int err);

}  // namespace strata::optim::cuda
