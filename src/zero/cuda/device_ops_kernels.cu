// The engine's element-wise kernels on the GPU (see device_ops_kernels.h). Grid-stride
// loops with a bounded grid: the shards are up to a few hundred million elements.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "zero/cuda/device_ops_kernels.h"

namespace strata::zero::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b == 0 ? 1 : (b < 8192 ? b : 8192));
}

__global__ void AccumulateKernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    dst[i] += src[i];
  }
}

__global__ void RoundThroughFp16Kernel(float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    x[i] = __half2float(__float2half_rn(x[i]));
  }
}

}  // namespace

int LaunchAccumulate(float* dst, const float* src, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  AccumulateKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, n);
  return static_cast<int>(cudaGetLastError());
}

int LaunchRoundThroughFp16(float* x, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  RoundThroughFp16Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::zero::cuda
