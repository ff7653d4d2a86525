// CUDA versions of the MLP kernels (mlp_kernels.h), with the same formulas and layouts.
//
// Contract:
//  - All pointers are device pointers; `stream` is a cudaStream_t passed as void* (nullptr:
//    the legacy default stream). Kernels are enqueued asynchronously on the stream; a
//    returned OK means the launch succeeded, not that the kernel finished.
//  - Every CUDA call is checked; a failure comes back as a Status (Internal for a launch or
//    runtime error, Unavailable when there is no device). In a build without CUDA every
//    function returns Unavailable.
//  - Matmuls go through cuBLAS (src/model/cuda/matmul.h) with fp32 accumulation; the
//    environment variable STRATA_CUDA_MATMUL picks the precision: "mixed" (default:
//    16-bit weights on tensor cores, fp32 as fp32), "tensor" (TF32 tensor cores for fp32
//    too) or "fp32". Not bit-identical to the CPU kernels (another summation order):
//    compare with a tolerance.
//  - GELU uses tanhf: results match the CPU to a few ulps, not bitwise.
//  - Thread-safety: any host thread may enqueue; ordering is the stream's.
#pragma once

#include <cstddef>
#include <cstdint>

#include "strata/model.h"
#include "strata/status.h"

namespace strata::model::cuda {

// OK when a CUDA device is present and usable; Unavailable with the reason otherwise.
Status DeviceAvailable();

Status LinearForward(void* stream, const float* x, int64_t batch, int64_t in, int64_t out, const void* weight,
                     const void* bias, DType dtype, float* y);
Status LinearBackward(void* stream, const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                      const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                      bool accumulate);
Status GeluForward(void* stream, const float* x, int64_t n, float* y);
Status GeluBackward(void* stream, const float* x, const float* dy, int64_t n, float* dx);
// Writes each sample's loss term (already divided by the normaliser) into sample_loss
// [batch] and d loss / d y into dy (may be null). Sum sample_loss on the host, in order, to
// get the CPU kernel's value to rounding.
Status LossForwardBackward(void* stream, LossKind kind, const float* y, const float* targets,
                           const int32_t* labels, int64_t batch, int64_t out, double normaliser,
                           float* sample_loss, float* dy);

// Small helpers for tests and benchmarks (the engine has its own device layer).
Result<void*> Malloc(size_t bytes);
Status Free(void* ptr);
Status CopyToDevice(void* dst, const void* src, size_t bytes);
Status CopyToHost(void* dst, const void* src, size_t bytes);
Status StreamSynchronize(void* stream);
// Zeroes n floats of device memory, enqueued on `stream`.
Status Zero(void* stream, float* ptr, int64_t n);

}  // namespace strata::model::cuda
