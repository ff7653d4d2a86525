// The GPT's residual adds (y += x over the residual stream): one element a thread, on a
// grid-stride loop, so each element is one fp32 add as on the CPU and bit-identical to it.
#include <algorithm>

#include "model/cuda/gpt_launch.h"

namespace strata::model::cuda {
namespace {

__global__ void AddInPlaceKernel(float* y, const float* x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = __fadd_rn(y[i], x[i]);
  }
}

}  // namespace

cudaError_t LaunchAddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  constexpr int kBlock = 256;
  // Enough blocks to fill an H100/H200 several times over; larger n strides.
  const int64_t blocks = std::min<int64_t>((n + kBlock - 1) / kBlock, 132 * 32);
  AddInPlaceKernel<<<static_cast<unsigned>(blocks), kBlock, 0, stream>>>(y, x, n);
  return cudaGetLastError();
}

}  // namespace strata::model::cuda
