// The CUDA entry points of a build without CUDA: each says so.
#include "tiering/device_backends.h"

namespace strata {

CudaProbe ProbeCuda() {
  CudaProbe p;
  p.reason =
      "this strata was built without CUDA (configure with -DSTRATA_CUDA=ON where the CUDA toolkit is "
      "installed)";
  return p;
}

Result<CudaDeviceInfo> QueryCudaDevice(int) { return tiering::CudaUnavailable(ProbeCuda()); }

namespace tiering {
Result<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions&) {
  return CudaUnavailable(ProbeCuda());
}
Result<void*> CudaHostAlloc(uint64_t) {
  return UnavailableError("cudaHostAlloc: this strata was built without CUDA; use the mlock pinning");
}
void CudaHostFree(void*) { STRATA_CHECK_MSG(false, "CudaHostFree in a build without CUDA"); }
}  // namespace tiering

}  // namespace strata
