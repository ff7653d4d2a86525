// What the CUDA runtime says about this machine, and pinned host memory.
#include <cuda_runtime.h>

#include <cstdio>

#include "strata/units.h"
#include "tiering/cuda/cuda_status.h"
#include "tiering/device_backends.h"

namespace strata {

CudaProbe ProbeCuda() {
  CudaProbe p;
  p.built_with_cuda = true;
  // Neither call needs a driver; both only report versions.
  cudaRuntimeGetVersion(&p.runtime_version);
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    p.reason = std::string("cudaGetDeviceCount returned ") + cudaGetErrorName(err) + " (" +
               cudaGetErrorString(err) + ")";
    if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) {
      p.reason += p.driver_version == 0 ? ": no NVIDIA driver on this machine" : ": no usable GPU";
    }
    cudaGetLastError();  // the probe's error is reported, not left sticky for the next call
    return p;
  }
  p.device_count = count;
  p.available = count > 0;
  if (!p.available) p.reason = "cudaGetDeviceCount found no GPU";
  return p;
}

Result<CudaDeviceInfo> QueryCudaDevice(int index) {
  CudaProbe probe = ProbeCuda();
  if (!probe.available) return tiering::CudaUnavailable(probe);
  if (index < 0 || index >= probe.device_count) {
    return InvalidArgumentError("cuda device " + std::to_string(index) +
                                " does not exist (this machine has " + std::to_string(probe.device_count) +
                                ")");
  }
  cudaDeviceProp prop;
  STRATA_RETURN_IF_ERROR(
      tiering::CudaCheck(cudaGetDeviceProperties(&prop, index), "cudaGetDeviceProperties"));
  CudaDeviceInfo info;
  info.index = index;
  info.name = prop.name;
  char bus[32];
  std::snprintf(bus, sizeof bus, "%04x:%02x:%02x.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);
  info.pci_bus_id = bus;
  info.total_memory = prop.totalGlobalMem;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.async_engines = prop.asyncEngineCount;
  STRATA_RETURN_IF_ERROR(tiering::CudaCheck(cudaSetDevice(index), "cudaSetDevice"));
  size_t free_b = 0, total_b = 0;
  STRATA_RETURN_IF_ERROR(tiering::CudaCheck(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo"));
  info.free_memory = free_b;
  return info;
}

namespace tiering {

Status CudaCheck(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return OkStatus();
  std::string msg = std::string(what) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  switch (err) {
    case cudaErrorMemoryAllocation: return ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection: return InvalidArgumentError(msg);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable: return UnavailableError(msg);
    default: return InternalError(msg);
  }
}

Result<void*> CudaHostAlloc(uint64_t bytes) {
  void* p = nullptr;
  // Portable: pinned for every CUDA context in the process, not only the current one.
  cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    Status s = CudaCheck(err, "cudaHostAlloc of " + FormatBytes(bytes) + " for the pinned host arena");
    return Status(s.code(), s.message() + "; lower strata.host_budget");
  }
  return p;
}

void CudaHostFree(void* ptr) {
  Status s = CudaCheck(cudaFreeHost(ptr), "cudaFreeHost");
  STRATA_CHECK_MSG(s.ok(), s.ToString());
}

}  // namespace tiering
}  // namespace strata
