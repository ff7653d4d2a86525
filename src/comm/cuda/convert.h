// Device conversions for fp32-accumulating bf16/fp16 reductions (convert.cu).
// Plain types only (streams as void*, errors as cudaError_t) so that this header needs
// neither CUDA's headers nor strata's Status in nvcc's front end.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

namespace strata::comm {

// dst[i] = float(src[i]); src is bf16 when `bf16`, else fp16. Returns the launch error.
cudaError_t LaunchUpcast(bool bf16, const void* src, float* dst, size_t n, void* stream);
// dst[i] = round(src[i] / divisor) to bf16 or fp16 (divisor 1: no division).
cudaError_t LaunchDowncast(bool bf16, const float* src, void* dst, size_t n, int divisor, void* stream);

}  // namespace strata::comm
