// The GPT driver's kernels on CUDA (gpt_ops.h): gpt_cuda.h and mlp_cuda.h enqueued on one
// stream, workspace from cudaMalloc.
#include <cuda_runtime.h>

#include <string>

#include "model/cuda/cuda_status.h"
#include "model/gpt_ops.h"
#include "strata/gpt_cuda.h"
#include "strata/mlp_cuda.h"

namespace strata::model {
namespace {

class CudaGptOps final : public GptOps {
 public:
  CudaGptOps(void* stream, int device) : stream_(stream), device_(device) {}
  Backend backend() const override { return Backend::kCuda; }

  Status Upload(void* dst, const void* src, int64_t bytes) override {
    // Each pass starts with its batch's upload: the calling thread's current device is
    // then the stream's for every launch of the pass.
    STRATA_RETURN_IF_ERROR(SetDevice());
    // From pageable memory the call returns once the source is staged: it may be reused.
    return cuda::CudaStatus(
        cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyHostToDevice, s()),
        "GPT upload of " + std::to_string(bytes) + " bytes");
  }
  Status Download(void* dst, const void* src, int64_t bytes) override {
    STRATA_RETURN_IF_ERROR(SetDevice());
    STRATA_RETURN_IF_ERROR(
        cuda::CudaStatus(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToHost, s()),
                         "GPT download of " + std::to_string(bytes) + " bytes"));
    return Finish();
  }
  Status Zero(float* p, int64_t n) override {
    return cuda::CudaStatus(cudaMemsetAsync(p, 0, static_cast<size_t>(n) * sizeof(float), s()),
                            "GPT zero fill");
  }
  Status Add(float* y, const float* x, int64_t n) override { return cuda::AddInPlace(stream_, y, x, n); }
  Status Finish() override { return cuda::CudaStatus(cudaStreamSynchronize(s()), "GPT stream synchronize"); }

  Status EmbeddingForward(const int32_t* tokens, const void* wte, const void* wpe, DType dtype, int64_t batch,
                          int64_t seq, int64_t channels, int64_t vocab, float* out) override {
    return cuda::EmbeddingForward(stream_, tokens, wte, wpe, dtype, batch, seq, channels, vocab, out);
  }
  Status EmbeddingBackward(const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                           int64_t channels, int64_t vocab, float* dwte, float* dwpe, bool accumulate_wte,
                           bool accumulate_wpe) override {
    return cuda::EmbeddingBackward(stream_, tokens, dout, batch, seq, channels, vocab, dwte, dwpe,
                                   accumulate_wte, accumulate_wpe);
  }
  Status LayerNormForward(const float* x, const void* weight, const void* bias, DType dtype, int64_t rows,
                          int64_t channels, float* y, float* mean, float* rstd) override {
    return cuda::LayerNormForward(stream_, x, weight, bias, dtype, rows, channels, y, mean, rstd);
  }
  Status LayerNormBackward(const float* x, const float* dy, const void* weight, DType dtype,
                           const float* mean, const float* rstd, int64_t rows, int64_t channels, float* dx,
                           float* dweight, float* dbias, bool accumulate) override {
    return cuda::LayerNormBackward(stream_, x, dy, weight, dtype, mean, rstd, rows, channels, dx, dweight,
                                   dbias, accumulate);
  }
  Status LinearForward(const float* x, int64_t rows, int64_t in, int64_t out, const void* weight,
                       const void* bias, DType dtype, float* y) override {
    return cuda::LinearForward(stream_, x, rows, in, out, weight, bias, dtype, y);
  }
  Status LinearBackward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                        const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                        bool accumulate) override {
    return cuda::LinearBackward(stream_, x, dy, rows, in, out, weight, dtype, dx, dweight, dbias, accumulate);
  }
  Status AttentionForward(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                          float* out, float* att) override {
    return cuda::AttentionForward(stream_, qkv, batch, seq, channels, heads, out, att);
  }
  Status AttentionBackward(const float* qkv, const float* att, const float* dout, int64_t batch, int64_t seq,
                           int64_t channels, int64_t heads, float* dqkv) override {
    return cuda::AttentionBackward(stream_, qkv, att, dout, batch, seq, channels, heads, dqkv);
  }
  Status GeluForward(const float* x, int64_t n, float* y) override {
    return cuda::GeluForward(stream_, x, n, y);
  }
  Status GeluBackward(const float* x, const float* dy, int64_t n, float* dx) override {
    return cuda::GeluBackward(stream_, x, dy, n, dx);
  }
  Result<double> CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                              double normaliser, float* dlogits) override {
    STRATA_RETURN_IF_ERROR(Grow(row_loss_, rows * static_cast<int64_t>(sizeof(double))));
    STRATA_RETURN_IF_ERROR(Grow(loss_, sizeof(double)));
    STRATA_RETURN_IF_ERROR(cuda::CrossEntropyForwardBackward(
        stream_, logits, targets, rows, vocab, normaliser, row_loss_.f64(), loss_.f64(), dlogits));
    double loss = 0;
    STRATA_RETURN_IF_ERROR(Download(&loss, loss_.f64(), sizeof(double)));
    return loss;
  }

 protected:
  Result<std::unique_ptr<void, void (*)(void*)>> Allocate(int64_t bytes) override {
    void* p = nullptr;
    STRATA_RETURN_IF_ERROR(SetDevice());
    const cudaError_t err = cudaMalloc(&p, static_cast<size_t>(bytes));
    if (err != cudaSuccess) {
      (void)cudaGetLastError();  // not a launch error for the kernels that come next
      return cuda::CudaStatus(err, "cudaMalloc of " + std::to_string(bytes) +
                                       " bytes of GPT workspace (lower the micro-batch, or turn on "
                                       "activation_checkpointing)");
    }
    // cudaFree waits for the device: buffers only go when they grow or the driver goes.
    return std::unique_ptr<void, void (*)(void*)>(p, [](void* q) { (void)cudaFree(q); });
  }

 private:
  cudaStream_t s() const { return static_cast<cudaStream_t>(stream_); }
  Status SetDevice() const { return cuda::CudaStatus(cudaSetDevice(device_), "cudaSetDevice for the GPT"); }

  void* stream_;
  int device_;  // the stream's device
  GptBuffer row_loss_, loss_;
};

}  // namespace

Result<std::unique_ptr<GptOps>> CreateCudaGptOps(void* stream) {
  STRATA_RETURN_IF_ERROR(cuda::DeviceAvailable());
  int device = 0;
  if (stream != nullptr) {
    STRATA_RETURN_IF_ERROR(cuda::CudaStatus(cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &device),
                                            "cudaStreamGetDevice of the GPT's stream"));
  } else {
    STRATA_RETURN_IF_ERROR(cuda::CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  }
  return std::unique_ptr<GptOps>(std::make_unique<CudaGptOps>(stream, device));
}

}  // namespace strata::model
