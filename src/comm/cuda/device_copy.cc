#include "comm/cuda/device_copy.h"

#include <cuda_runtime.h>

#include <string>

namespace strata::comm {

Status DeviceCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return OkStatus();
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e == cudaSuccess) return OkStatus();
  return InternalError(std::string("cudaMemcpy: ") + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

}  // namespace strata::comm
