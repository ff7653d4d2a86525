// Internal: the few CUDA runtime calls the optim tests and benchmarks need (device
// count, buffers, copies, stream sync), so that they do not include cuda_runtime.h.
// Without CUDA: DeviceCount() is 0 and the rest return Unavailable.
#pragma once

#include <cstddef>

#include "strata/status.h"

namespace strata::optim {

int CudaDeviceCount();  // 0 when no CUDA build, no driver or no GPU
Result<void*> CudaAlloc(size_t bytes);
void CudaFree(void* p);
Status CudaCopyToDevice(void* dst, const void* src, size_t bytes);
Status CudaCopyToHost(void* dst, const void* src, size_t bytes);
Status CudaSync();  // cudaDeviceSynchronize

}  // namespace strata::optim
