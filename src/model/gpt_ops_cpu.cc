// The GPT driver's kernels on the CPU (gpt_ops.h): gpt_kernels.h and mlp_kernels.h on
// oneTBB threads, with the 16-bit parameters of the non-linear kernels widened into
// scratch of the ops' own.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "model/gpt_ops.h"
#include "strata/gpt_kernels.h"
#include "strata/mlp_kernels.h"

namespace strata::model {

namespace {

class CpuGptOps final : public GptOps {
 public:
  Backend backend() const override { return Backend::kCpu; }

  Status Upload(void* dst, const void* src, int64_t bytes) override {
    std::memcpy(dst, src, static_cast<size_t>(bytes));
    return OkStatus();
  }
  Status Download(void* dst, const void* src, int64_t bytes) override { return Upload(dst, src, bytes); }
  Status Zero(float* p, int64_t n) override {
    std::fill(p, p + n, 0.0f);
    return OkStatus();
  }
  Status Add(float* y, const float* x, int64_t n) override {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1 << 14), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t i = r.begin(); i < r.end(); ++i) y[i] += x[i];
    });
    return OkStatus();
  }
  Status Finish() override { return OkStatus(); }

  Status EmbeddingForward(const int32_t* tokens, const void* wte, const void* wpe, DType dtype, int64_t batch,
                          int64_t seq, int64_t channels, int64_t vocab, float* out) override {
    // Only the sequence's rows of wpe are read.
    model::EmbeddingForward(tokens, Wide(wte, dtype, vocab * channels, 0),
                            Wide(wpe, dtype, seq * channels, 1), batch, seq, channels, vocab, out);
    return OkStatus();
  }
  Status EmbeddingBackward(const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                           int64_t channels, int64_t vocab, float* dwte, float* dwpe, bool accumulate_wte,
                           bool accumulate_wpe) override {
    model::EmbeddingBackward(tokens, dout, batch, seq, channels, vocab, dwte, dwpe, accumulate_wte,
                             accumulate_wpe);
    return OkStatus();
  }
  Status LayerNormForward(const float* x, const void* weight, const void* bias, DType dtype, int64_t rows,
                          int64_t channels, float* y, float* mean, float* rstd) override {
    model::LayerNormForward(x, Wide(weight, dtype, channels, 0), Wide(bias, dtype, channels, 1), rows,
                            channels, y, mean, rstd);
    return OkStatus();
  }
  Status LayerNormBackward(const float* x, const float* dy, const void* weight, DType dtype,
                           const float* mean, const float* rstd, int64_t rows, int64_t channels, float* dx,
                           float* dweight, float* dbias, bool accumulate) override {
    model::LayerNormBackward(x, dy, Wide(weight, dtype, channels, 0), mean, rstd, rows, channels, dx, dweight,
                             dbias, accumulate);
    return OkStatus();
  }
  Status LinearForward(const float* x, int64_t rows, int64_t in, int64_t out, const void* weight,
                       const void* bias, DType dtype, float* y) override {
    model::LinearForward(x, rows, in, out, weight, bias, dtype, y);
    return OkStatus();
  }
  Status LinearBackward(const float* x, const float* dy, int64_t rows, int64_t in, int64_t out,
                        const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                        bool accumulate) override {
    model::LinearBackward(x, dy, rows, in, out, weight, dtype, dx, dweight, dbias, accumulate);
    return OkStatus();
  }
  Status AttentionForward(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                          float* out, float* att) override {
    model::AttentionForward(qkv, batch, seq, channels, heads, out, att);
    return OkStatus();
  }
  Status AttentionBackward(const float* qkv, const float* att, const float* dout, int64_t batch, int64_t seq,
                           int64_t channels, int64_t heads, float* dqkv) override {
    model::AttentionBackward(qkv, att, dout, batch, seq, channels, heads, dqkv);
    return OkStatus();
  }
  Status GeluForward(const float* x, int64_t n, float* y) override {
    model::GeluForward(x, n, y, GeluTanh::kVector);
    return OkStatus();
  }
  Status GeluBackward(const float* x, const float* dy, int64_t n, float* dx) override {
    model::GeluBackward(x, dy, n, dx, GeluTanh::kVector);
    return OkStatus();
  }
  Result<double> CrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                              double normaliser, float* dlogits) override {
    return CrossEntropyForwardBackward(logits, targets, rows, vocab, normaliser, dlogits);
  }

 protected:
  Result<std::unique_ptr<void, void (*)(void*)>> Allocate(int64_t bytes) override {
    void* p = std::malloc(static_cast<size_t>(bytes));
    if (p == nullptr) throw std::bad_alloc();
    return std::unique_ptr<void, void (*)(void*)>(p, std::free);
  }

 private:
  // `p` (n elements of `dtype`) as fp32: itself, or widened into wide_[slot], valid until
  // that slot's next use.
  const float* Wide(const void* p, DType dtype, int64_t n, int slot) {
    if (dtype == DType::kF32) return static_cast<const float*>(p);
    if (static_cast<int64_t>(wide_[slot].size()) < n) wide_[slot].resize(static_cast<size_t>(n));
    ToFloat(p, dtype, n, wide_[slot].data());
    return wide_[slot].data();
  }

  std::vector<float> wide_[2];
};

}  // namespace

std::unique_ptr<GptOps> CreateCpuGptOps() { return std::make_unique<CpuGptOps>(); }

}  // namespace strata::model
