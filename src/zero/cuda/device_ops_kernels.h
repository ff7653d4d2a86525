// Plain-data interface between the CUDA device ops (device_ops_cuda.cc) and their
// kernels (device_ops_kernels.cu): streams as void*, errors as cudaError_t values, so
// the .cu file needs none of strata's C++20 headers.
#pragma once

#include <cstddef>

namespace strata::zero::cuda {

// dst[i] += src[i]. Returns the launch's cudaError_t (0: success).
int LaunchAccumulate(float* dst, const float* src, size_t n, void* stream);
// x[i] = float(half(x[i])), round to nearest even (as FloatToFp16 in half.h).
int LaunchRoundThroughFp16(float* x, size_t n, void* stream);

}  // namespace strata::zero::cuda
