// CUDA and cuBLAS results as Statuses, and stream-ordered scratch memory, shared by the
// model's CUDA adapters (matmul.cc, gpt_cuda.cc). Only files under src/model/cuda/
// include this header, since it pulls in CUDA's.
#pragma once

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata::model::cuda {

// OK for cudaSuccess; else "model CUDA: <what>: <name> (<text>)", ResourceExhausted for an
// allocation failure and Internal otherwise.
inline Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return OkStatus();
  std::string msg = "model CUDA: " + std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                    cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  return InternalError(msg);
}

// Stream-ordered scratch (cudaMallocAsync on the stream): valid for exactly the work
// enqueued between its allocation and its free on that stream, whatever other streams and
// host threads do. Release() frees it on the stream and reports the result; the
// destructor frees it on an early error return, when the first error is what counts.
class StreamScratch {
 public:
  StreamScratch(cudaStream_t stream, std::string_view label) : stream_(stream), label_(label) {}
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  ~StreamScratch() {
    if (ptr_ != nullptr) (void)cudaFreeAsync(ptr_, stream_);
  }

  // One allocation per scratch object; nullptr for zero bytes.
  Result<char*> Allocate(size_t bytes) {
    if (bytes == 0) return static_cast<char*>(nullptr);
    const cudaError_t err = cudaMallocAsync(&ptr_, bytes, stream_);
    if (err != cudaSuccess) {
      ptr_ = nullptr;
      (void)cudaGetLastError();  // the failed allocation is no launch error for later checks
      return CudaStatus(err, "cudaMallocAsync of " + std::to_string(bytes) + " bytes (" + label_ + ")");
    }
    return static_cast<char*>(ptr_);
  }
  Status Release() {
    if (ptr_ == nullptr) return OkStatus();
    void* p = ptr_;
    ptr_ = nullptr;
    return CudaStatus(cudaFreeAsync(p, stream_), "cudaFreeAsync (" + label_ + ")");
  }

 private:
  cudaStream_t stream_;
  std::string label_;
  void* ptr_ = nullptr;
};

// Byte offsets that keep each piece of a shared scratch 256-byte aligned, as cuBLAS's and
// CUB's fast paths want.
inline size_t AlignUp(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace strata::model::cuda
