// CUDA runtime helpers for optim tests and benchmarks (see optim/cuda_util.h).
#include "optim/cuda_util.h"

#include <cuda_runtime.h>

#include <string>

namespace strata::optim {
namespace {
Status Check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return OkStatus();
  return InternalError(std::string(what) + " failed: " + cudaGetErrorString(e));
}
}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

Result<void*> CudaAlloc(size_t bytes) {
  void* p = nullptr;
  STRATA_RETURN_IF_ERROR(Check(cudaMalloc(&p, bytes), "cudaMalloc"));
  return p;
}

void CudaFree(void* p) { (void)cudaFree(p); }

Status CudaCopyToDevice(void* dst, const void* src, size_t bytes) {
  return Check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
}

Status CudaCopyToHost(void* dst, const void* src, size_t bytes) {
  return Check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
}

Status CudaSync() { return Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

}  // namespace strata::optim
