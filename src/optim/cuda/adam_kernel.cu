// Fused multi-tensor Adam/AdamW on the GPU: one launch per batch of up to 32 tensors
// (blockIdx.y = tensor), each block striding over its tensor. The arithmetic follows the
// CPU kernels' order; the 16-bit copy uses the same integer rounding as half.h, so it is
// the correctly rounded value of the fp32 result bit for bit.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/cuda/launch.h"

namespace strata::optim::cuda {
namespace {

__device__ __forceinline__ float LoadGrad(const void* g, uint64_t i, uint8_t type) {
  if (type == 0) return static_cast<const float*>(g)[i];
  const uint32_t h = static_cast<const uint16_t*>(g)[i];
  if (type == 1) return __uint_as_float(h << 16);
  return __half2float(*reinterpret_cast<const __half*>(&static_cast<const uint16_t*>(g)[i]));
}

__device__ __forceinline__ uint16_t ToBf16(float f) {
  const uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ uint16_t ToFp16(float f) {
  const uint32_t bits = __float_as_uint(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7fffffffu;
  if (x >= 0x7f800000u)
    return static_cast<uint16_t>(x == 0x7f800000u ? sign | 0x7c00u : sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (x >= 0x38800000u)
    return static_cast<uint16_t>(sign | ((x - 0x38000000u + 0xfffu + ((x >> 13) & 1u)) >> 13));
  const uint32_t e = x >> 23;
  if (e < 102) return static_cast<uint16_t>(sign);
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - e;
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

__global__ void AdamKernel(AdamBatch batch) {
  const AdamTensorArgs& t = batch.t[blockIdx.y];
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < t.n; i += stride) {
    float g = LoadGrad(t.g, i, t.g_type) * t.grad_scale;
    float p = t.p[i];
    if (t.l2 != 0.0f) g = fmaf(t.l2, p, g);
    const float m = fmaf(t.beta1, t.m[i], t.one_minus_beta1 * g);
    const float v = fmaf(t.beta2, t.v[i], t.one_minus_beta2 * (g * g));
    const float denom = fmaf(sqrtf(v), t.inv_sqrt_bc2, t.eps);
    p = p * t.decay;
    p = fmaf(-t.step_size, __fdiv_rn(m, denom), p);
    t.m[i] = m;
    t.v[i] = v;
    t.p[i] = p;
    if (t.out_type == 1) {
      static_cast<uint16_t*>(t.out)[i] = ToBf16(p);
    } else if (t.out_type == 2) {
      static_cast<uint16_t*>(t.out)[i] = ToFp16(p);
    }
  }
}

}  // namespace

const char* ErrorString(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }

int LaunchAdam(const AdamBatch& batch, uint64_t max_n, void* stream, const char** what) {
  if (batch.count == 0 || max_n == 0) return 0;
  constexpr int kThreads = 256;
  uint64_t blocks = (max_n + kThreads - 1) / kThreads;
  if (blocks > 4096) blocks = 4096;  // grid-stride beyond that: enough to fill an H200
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(batch.count));
  AdamKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) *what = "AdamKernel launch";
  return static_cast<int>(err);
}

}  // namespace strata::optim::cuda
