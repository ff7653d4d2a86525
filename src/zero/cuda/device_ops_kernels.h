// Plain-data interface between the CUDA device ops (device_ops_cuda.cc) and their
// kernels (device_ops_kernels.cu): streams as void*, errors as cudaError_t values, so
// the .cu file needs none of strata's C++20 headers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace strata::zero::cuda {

// dst[i] += src[i]. Returns the launch's cudaError_t (0: success).
int LaunchAccumulate(float* dst, const float* src, size_t n, void* stream);
// x[i] = float(half(x[i])), round to nearest even (as FloatToFp16 in half.h).
// dst[i] = (overwrite ? 0 : dst[i]) + float(src[i]); src_bits 32: fp32, 16: bf16, -16: fp16.
int LaunchAddGradient(float* dst, const void* src, int src_bits, size_t n, bool overwrite, void* stream);
int LaunchRoundThroughFp16(float* x, size_t n, void* stream);

// One shard of a gradient-statistics pass: `n` elements of type 0 (fp32), 1 (bf16) or
// 2 (fp16) at `data` (device memory).
struct StatsShard {
  const void* data;
  uint64_t n;
  int type;
};
// Device scratch the pass needs for `count` shards (bytes; 256-byte multiple).
size_t GradStatsScratchBytes(size_t count);
// Enqueues the pass over `count` shards (count > 0, every n > 0): the sum of squares (in
// double) and whether any element is inf/NaN, written to `result` as {double sum_sq;
// int flag} (16 bytes of device memory). Deterministic: every element goes to a fixed
// thread and every partial sum is added in a fixed order, so the same shards give the
// same bits on every run (no atomics). Returns the first launch's cudaError_t.
int LaunchGradStats(const StatsShard* shards, size_t count, void* scratch, void* result, void* stream);

}  // namespace strata::zero::cuda
