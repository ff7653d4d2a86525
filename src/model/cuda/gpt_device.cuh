// Device helpers of the GPT kernels: parameter types, and warp and block reductions with
// a fixed order for a given block size (the results must not depend on timing). A
// butterfly (xor) reduction gives every lane the same bits, since each step combines a
// pair of equal values in either order (commutative).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "strata/dtype.h"

namespace strata::model::cuda {

constexpr int kWarp = 32;
// Row kernels (LayerNorm, softmax): one warp per row, kRowsPerBlock rows a block.
constexpr int kThreads = 256;
constexpr int kRowsPerBlock = kThreads / kWarp;
inline unsigned RowBlocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }

// Calls f(T{}) with T the device type of `dtype` (float, __nv_bfloat16 or __half).
template <typename F>
void WithParamType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(float{}); break;
    case DType::kBf16: f(__nv_bfloat16{}); break;
    case DType::kFp16: f(__half{}); break;
  }
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename T, typename Op>
__device__ __forceinline__ T WarpReduce(T v, Op op) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The reduction of v over the block (blockDim.x a multiple of 32, at most 1024), returned
// to every thread. `shared` holds 32 T; the leading barrier lets a caller reuse it.
template <typename T, typename Op>
__device__ T BlockReduce(T v, Op op, T identity, T* shared) {
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  v = WarpReduce(v, op);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x) / kWarp ? shared[lane] : identity;
  return WarpReduce(v, op);  // every warp reduces the same values in the same order
}

// Grid-stride launches: at most 8192 blocks of `threads`.
inline unsigned StrideBlocks(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b < 8192 ? b : 8192));
}

}  // namespace strata::model::cuda
