// Build without CUDA: no devices (see optim/cuda_util.h).
#include "optim/cuda_util.h"

namespace strata::optim {

int CudaDeviceCount() { return 0; }
Result<void*> CudaAlloc(size_t) { return UnavailableError("CudaAlloc: this strata build has no CUDA"); }
void CudaFree(void*) {}
Status CudaCopyToDevice(void*, const void*, size_t) {
  return UnavailableError("this strata build has no CUDA");
}
Status CudaCopyToHost(void*, const void*, size_t) {
  return UnavailableError("this strata build has no CUDA");
}
Status CudaSync() { return UnavailableError("this strata build has no CUDA"); }

}  // namespace strata::optim
