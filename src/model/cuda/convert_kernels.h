// Element conversions for the matrix products (convert_kernels.cu): plain types only, so
// that matmul.cc is ordinary C++ and the .cu file needs none of strata's headers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace strata::model::cuda {

// dst[i] = src[i] rounded to nearest even to bf16 (`bf16`) or fp16 (raw 16-bit values).
cudaError_t LaunchRoundTo16(const float* src, size_t n, bool bf16, void* dst, cudaStream_t stream);
// dst[i] = float(src[i]) for bf16 (`bf16`) or fp16 src: exact.
cudaError_t LaunchWidenToFloat(const void* src, size_t n, bool bf16, float* dst, cudaStream_t stream);

}  // namespace strata::model::cuda
