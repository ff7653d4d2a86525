// The Linear layers' matrix products on cuBLAS (matmul.cc), behind plain strata types.
//
// Layouts are mlp_kernels.h's (row-major x [batch, in], W [out, in], y [batch, out]); every
// product accumulates in fp32 and writes fp32. What the inputs are rounded to depends on
// the precision (MatmulPrecision), because tensor cores only take 16-bit (or TF32) inputs:
//  - kMixed (default): with bf16/fp16 weights the fp32 activations and gradients are
//    rounded to the weights' type in a stream-ordered scratch, so both operands are
//    16-bit (mixed precision as in PyTorch's autocast); fp32 weights stay fp32 (as
//    PyTorch's default, allow_tf32 off). Relative error per product: bf16 2^-8, fp16 2^-11.
//  - kTensorCores: as kMixed, and fp32 weights run as TF32 too (inputs rounded to 10
//    mantissa bits, ~2^-10): opt-in, since it changes fp32 training's numerics.
//  - kFp32: fp32 products without tensor cores (16-bit weights widened exactly), the CPU
//    kernels' arithmetic up to summation order: what the tests that compare against the
//    CPU reference at fp32 tolerances need.
// The precision comes from STRATA_CUDA_MATMUL ("tensor" or "fp32"), read at first use.
//
// Threads: any host thread; each uses cuBLAS handles of its own (one per device). Calls
// enqueue on `stream` (a cudaStream_t as void*, as in mlp_cuda.h, so that tests include
// this header without CUDA's) with the calling thread's current device, like the other
// kernels.
#pragma once

#include <cstdint>

#include "strata/model.h"
#include "strata/status.h"

namespace strata::model::cuda {

enum class MatmulPrecision { kTensorCores, kFp32, kMixed };

// The precision in use: STRATA_CUDA_MATMUL at the first call (unset or "mixed": kMixed;
// "tensor": kTensorCores; "fp32": kFp32; anything else is InvalidArgument naming the variable, and
// so is every product), unless SetMatmulPrecision came first.
Result<MatmulPrecision> GetMatmulPrecision();
// For tests and benchmarks: the precision of the products enqueued from now on.
void SetMatmulPrecision(MatmulPrecision precision);
const char* MatmulPrecisionName(MatmulPrecision precision);

// y [batch, out] = x W^T (no bias).
Status MatmulForward(void* stream, const float* x, int64_t batch, int64_t in, int64_t out, const void* weight,
                     DType dtype, float* y);
// dx [batch, in] = dy W (when dx is not null) and dW [out, in] = dy^T x, added to dW when
// `accumulate`.
Status MatmulBackward(void* stream, const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                      const void* weight, DType dtype, float* dx, float* dweight, bool accumulate);

// One operand of BatchedMatmul: problem p reads the row-major matrix at ptr + p * stride
// with leading dimension ld, transposed when `trans` (then stored as op's transpose).
struct StridedOperand {
  const float* ptr;
  int64_t ld;
  int64_t stride;
  bool trans;
};

// The attention core's products, one cublasGemmStridedBatchedEx: for p in [0, batch),
// row-major C_p [m, n] (c + p * stride_c, leading dimension ldc) = op(A_p) [m, k] op(B_p)
// [k, n], overwritten. fp32 in and out with fp32 accumulation; TF32 tensor cores under
// kTensorCores only (kMixed has no 16-bit weights to round to here). k >= 1.
Status BatchedMatmul(void* stream, int64_t m, int64_t n, int64_t k, const StridedOperand& a,
                     const StridedOperand& b, float* c, int64_t ldc, int64_t stride_c, int64_t batch);

// For the benchmark of the tensor-core peak: c [n x n] (fp32) = a [n x n] b [n x n], both
// 16-bit (`dtype` bf16 or fp16), one cublasGemmEx with fp32 accumulation and nothing
// else enqueued (no conversions), on `stream`.
Status SquareGemm16(void* stream, int64_t n, DType dtype, const void* a, const void* b, float* c);

}  // namespace strata::model::cuda
