// The GPT driver's kernels and workspace on one backend: the CPU (gpt_kernels.h on oneTBB
// threads) or CUDA (gpt_cuda.h and mlp_cuda.h on one stream). The driver (gpt_driver.cc)
// runs the same sequence of calls on either, so the hooks' order, the accumulate flags and
// recompute are written once.
//
// Contract:
//  - Every pointer is in the backend's memory: host memory for the CPU, device memory for
//    CUDA (the hooks' pointers are too). Buffers come from Grow and belong to the caller's
//    GptBuffer, which frees them.
//  - CPU calls finish before they return. CUDA calls enqueue on the ops' stream in call
//    order; an OK means the launch succeeded. Download, CrossEntropy and Finish wait for
//    the stream's work so far.
//  - The kernels' arithmetic is the backend's (gpt_kernels.h on the CPU: deterministic,
//    bit for bit; gpt_cuda.h: deterministic per GPU, within a tolerance of the CPU's).
//    16-bit parameters (`dtype`) are read as they are; the CPU widens the non-linear
//    kernels' ones into scratch of its own, as the fp32 pass would see them.
//  - Errors: the CPU's calls cannot fail (beyond allocation, which throws as std::vector
//    does); CUDA's come back as Statuses (gpt_cuda.h).
//  - One thread at a time.
#pragma once

#include <cstdint>
#include <memory>

#include "strata/dtype.h"
#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::model {

// Bytes of workspace in a backend's memory, grown by GptOps::Grow and never shrunk.
class GptBuffer {
 public:
  float* f() const { return static_cast<float*>(mem_.get()); }
  int32_t* i32() const { return static_cast<int32_t*>(mem_.get()); }
  double* f64() const { return static_cast<double*>(mem_.get()); }
  int64_t bytes() const { return bytes_; }

 private:
  friend class GptOps;
  std::unique_ptr<void, void (*)(void*)> mem_{nullptr, [](void*) {}};
  int64_t bytes_ = 0;
};

class GptOps {
 public:
  virtual ~GptOps() = default;
  virtual Backend backend() const = 0;

  // `b` holds at least `bytes`; its contents are lost when it grows.
  Status Grow(GptBuffer& b, int64_t bytes) {
    if (bytes <= b.bytes_) return OkStatus();
    if (b.bytes_ > 0) STRATA_RETURN_IF_ERROR(Finish());  // no queued kernel still uses it
    b.mem_.reset();                                      // the old buffer goes first: both never live at once
    b.bytes_ = 0;
    STRATA_ASSIGN_OR_RETURN(b.mem_, Allocate(bytes));
    b.bytes_ = bytes;
    return OkStatus();
  }
  Status GrowFloats(GptBuffer& b, int64_t n) { return Grow(b, n * static_cast<int64_t>(sizeof(float))); }

  // Host -> backend (the host memory may be reused on return), backend -> host (complete
  // on return).
  virtual Status Upload(void* dst, const void* src, int64_t bytes) = 0;
  virtual Status Download(void* dst, const void* src, int64_t bytes) = 0;
  virtual Status Zero(float* p, int64_t n) = 0;
  // y += x, n elements (the residual stream).
  virtual Status Add(float* y, const float* x, int64_t n) = 0;
  // Waits for the work enqueued so far.
  virtual Status Finish() = 0;

  virtual Status EmbeddingForward(const int32_t* tokens, const void* wte, const void* wpe, DType dtype,
                                  int64_t batch, int64_t seq, int64_t channels, int64_t vocab,
                                  float* out) = 0;
  virtual Status EmbeddingBackward(const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                                   int64_t channels, int64_t vocab, float* dwte, float* dwpe,
                                   bool accumulate_wte, bool accumulate_wpe) = 0;
  virtual Status LayerNormForward(const float* x, const void* weight, const void* bias, DType dtype,
                                  int64_t rows, int64_t channels, float* y, float* mean, float* rstd) = 0;
  virtual Status LayerNormBackward(const float* x, const float* dy, const void* weight, DType dtype,
                                   const float* mean, const float* rstd, int64_t rows, int64_t channels,
                                   float* dx, float* dweight, float* dbias, bool accumulate) = 0;
  virtual Status LinearForward(const float* x, int64_t rows, int64_t in, int64_t out, const void* weight,
                               const void* bias, DType dtype, float* y) = 0;
  virtual Status LinearBackward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                                const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                                bool accumulate) = 0;
  virtual Status AttentionForward(const float* qkv, int64_t batch, int64_t seq, int64_t channels,
                                  int64_t heads, float* out, float* att) = 0;
  virtual Status AttentionBackward(const float* qkv, const float* att, const float* dout, int64_t batch,
                                   int64_t seq, int64_t channels, int64_t heads, float* dqkv) = 0;
  virtual Status GeluForward(const float* x, int64_t n, float* y) = 0;
  virtual Status GeluBackward(const float* x, const float* dy, int64_t n, float* dx) = 0;
  // The loss term (the rows' terms added in row order), read back to the host; dlogits as
  // gpt_kernels.h (may be null, may be `logits`).
  virtual Result<double> CrossEntropy(const float* logits, const int32_t* targets, int64_t rows,
                                      int64_t vocab, double normaliser, float* dlogits) = 0;

 protected:
  // `bytes` > 0 of the backend's memory and the function that frees it.
  virtual Result<std::unique_ptr<void, void (*)(void*)>> Allocate(int64_t bytes) = 0;
};

std::unique_ptr<GptOps> CreateCpuGptOps();
// `stream`: a cudaStream_t as void* (nullptr: the legacy default stream). Unavailable
// without a usable GPU or in a build without CUDA.
Result<std::unique_ptr<GptOps>> CreateCudaGptOps(void* stream);

}  // namespace strata::model
