// The backends behind CreateDevice() and the CUDA pieces the host arena needs. The
// cuda/ files implement the CUDA ones when CUDA is built; nocuda/ ones say it is not.
#pragma once

#include <cstdint>
#include <memory>

#include "strata/device.h"

namespace strata::tiering {

Result<std::unique_ptr<Device>> CreateSimDevice(uint64_t capacity);
Result<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options);

// Pinned, portable host memory (cudaHostAlloc) and its release (cudaFreeHost).
Result<void*> CudaHostAlloc(uint64_t bytes);
void CudaHostFree(void* ptr);

// "Unavailable: ... use --device sim" for a cuda device that cannot be had.
Status CudaUnavailable(const CudaProbe& probe);

}  // namespace strata::tiering
