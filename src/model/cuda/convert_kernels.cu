// Element conversions between fp32 and the 16-bit types (see convert_kernels.h): grid-stride
// loops with a bounded grid, as the tensors reach hundreds of millions of elements.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "model/cuda/convert_kernels.h"

namespace strata::model::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b == 0 ? 1 : (b < 8192 ? b : 8192));
}

template <typename T>
__device__ __forceinline__ T Round(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 Round<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half Round<__half>(float v) {
  return __float2half_rn(v);
}
__device__ __forceinline__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float Widen(__half v) { return __half2float(v); }

template <typename T>
__global__ void RoundKernel(const float* src, size_t n, T* dst) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = Round<T>(src[i]);
  }
}

template <typename T>
__global__ void WidenKernel(const T* src, size_t n, float* dst) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = Widen(src[i]);
  }
}

}  // namespace

cudaError_t LaunchRoundTo16(const float* src, size_t n, bool bf16, void* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    RoundKernel<<<Blocks(n), kThreads, 0, stream>>>(src, n, static_cast<__nv_bfloat16*>(dst));
  } else {
    RoundKernel<<<Blocks(n), kThreads, 0, stream>>>(src, n, static_cast<__half*>(dst));
  }
  return cudaGetLastError();
}

cudaError_t LaunchWidenToFloat(const void* src, size_t n, bool bf16, float* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (bf16) {
    WidenKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src), n, dst);
  } else {
    WidenKernel<<<Blocks(n), kThreads, 0, stream>>>(static_cast<const __half*>(src), n, dst);
  }
  return cudaGetLastError();
}

}  // namespace strata::model::cuda
