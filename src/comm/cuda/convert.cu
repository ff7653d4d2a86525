#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "comm/cuda/convert.h"

namespace strata::comm {
namespace {

template <typename T>
__device__ float ToF32(T v);
template <>
__device__ float ToF32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <>
__device__ float ToF32<__half>(__half v) { return __half2float(v); }

template <typename T>
__device__ T FromF32(float v);
template <>
__device__ __nv_bfloat16 FromF32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ __half FromF32<__half>(float v) { return __float2half_rn(v); }

template <typename T>
__global__ void Upcast(const T* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = ToF32(src[i]);
  }
}

template <typename T>
__global__ void Downcast(const float* src, T* dst, size_t n, float divisor, bool divide) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    float v = src[i];
    if (divide) v /= divisor;
    dst[i] = FromF32<T>(v);
  }
}

unsigned Blocks(size_t n) {
  size_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 4096 ? (b == 0 ? 1 : b) : 4096);
}


}  // namespace

cudaError_t LaunchUpcast(bool bf16, const void* src, float* dst, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  if (bf16) {
    Upcast<<<Blocks(n), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(src), dst, n);
  } else {
    Upcast<<<Blocks(n), 256, 0, s>>>(static_cast<const __half*>(src), dst, n);
  }
  return cudaGetLastError();
}

cudaError_t LaunchDowncast(bool bf16, const float* src, void* dst, size_t n, int divisor, void* stream) {
  if (n == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  if (bf16) {
    Downcast<<<Blocks(n), 256, 0, s>>>(src, static_cast<__nv_bfloat16*>(dst), n, float(divisor), divisor > 1);
  } else {
    Downcast<<<Blocks(n), 256, 0, s>>>(src, static_cast<__half*>(dst), n, float(divisor), divisor > 1);
  }
  return cudaGetLastError();
}

}  // namespace strata::comm
