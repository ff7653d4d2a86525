// The GPT's CUDA kernels behind gpt_cuda.h: argument checks, stream-ordered scratch, and
// the attention's products on cuBLAS (matmul.h), around the launchers of gpt_launch.h.
#include "strata/gpt_cuda.h"

#include <climits>
#include <cmath>
#include <string>
#include <string_view>

#include "model/cuda/cuda_status.h"
#include "model/cuda/gpt_launch.h"
#include "model/cuda/matmul.h"

namespace strata::model::cuda {
namespace {

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

Status Require(bool ok, std::string_view what) {
  if (ok) return OkStatus();
  return InvalidArgumentError("model CUDA: " + std::string(what));
}

bool KnownDType(DType d) { return d == DType::kF32 || d == DType::kBf16 || d == DType::kFp16; }

// Grids and CUB take int counts.
bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

struct AttentionShape {
  int64_t batch, seq, channels, heads, hs;
  float scale;
};

Result<AttentionShape> CheckAttention(int64_t batch, int64_t seq, int64_t channels, int64_t heads) {
  STRATA_RETURN_IF_ERROR(
      Require(batch >= 0 && seq >= 0 && heads > 0 && channels > 0 && channels % heads == 0,
              "attention: want batch, seq >= 0 and channels a positive multiple of heads"));
  const int64_t hs = channels / heads;
  // The CPU kernel's scale, rounded the same way.
  return AttentionShape{batch, seq, channels, heads, hs, 1.0f / std::sqrt(static_cast<float>(hs))};
}

// Problem h of batch row b reads columns h * hs.. of q, k or v: a head's stride is hs.
StridedOperand Heads(const float* p, int64_t ld, const AttentionShape& s, bool trans) {
  return StridedOperand{p, ld, s.hs, trans};
}
// The [T, T] matrices of batch row b's heads.
StridedOperand Scores(const float* p, const AttentionShape& s, bool trans) {
  return StridedOperand{p, s.seq, s.seq * s.seq, trans};
}

}  // namespace

Status EmbeddingForward(void* stream, const int32_t* tokens, const void* wte, const void* wpe, DType dtype,
                        int64_t batch, int64_t seq, int64_t channels, int64_t vocab, float* out) {
  STRATA_RETURN_IF_ERROR(Require(tokens != nullptr && wte != nullptr && wpe != nullptr && out != nullptr,
                                 "EmbeddingForward: null pointer"));
  STRATA_RETURN_IF_ERROR(Require(KnownDType(dtype), "EmbeddingForward: unknown dtype"));
  STRATA_RETURN_IF_ERROR(Require(batch >= 0 && seq >= 0 && channels > 0 && vocab > 0 && vocab < INT_MAX,
                                 "EmbeddingForward: bad shape"));
  return CudaStatus(
      LaunchEmbeddingForward(tokens, wte, wpe, dtype, batch, seq, channels, vocab, out, AsStream(stream)),
      "embedding forward launch");
}

Status EmbeddingBackward(void* stream, const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                         int64_t channels, int64_t vocab, float* dwte, float* dwpe, bool accumulate_wte,
                         bool accumulate_wpe) {
  STRATA_RETURN_IF_ERROR(Require(tokens != nullptr && dout != nullptr, "EmbeddingBackward: null pointer"));
  STRATA_RETURN_IF_ERROR(
      Require(batch >= 0 && seq >= 0 && FitsInt(batch * seq) && channels > 0 && vocab > 0 && vocab < INT_MAX,
              "EmbeddingBackward: bad shape (batch * seq must stay below 2^31)"));
  cudaStream_t s = AsStream(stream);
  if (dwpe != nullptr) {
    STRATA_RETURN_IF_ERROR(CudaStatus(LaunchPositionGrad(dout, batch, seq, channels, dwpe, accumulate_wpe, s),
                                      "position-embedding gradient launch"));
  }
  if (dwte == nullptr) return OkStatus();
  const int64_t n = batch * seq;
  size_t bytes = 0;
  if (n > 0) {
    STRATA_RETURN_IF_ERROR(CudaStatus(TokenGradScratchBytes(n, vocab, &bytes), "token sort scratch size"));
  }
  StreamScratch scratch(s, "token-embedding gradient scratch");
  STRATA_ASSIGN_OR_RETURN(char* buf, scratch.Allocate(bytes));
  STRATA_RETURN_IF_ERROR(
      CudaStatus(LaunchTokenGrad(tokens, dout, n, channels, vocab, dwte, accumulate_wte, buf, bytes, s),
                 "token-embedding gradient launch"));
  return scratch.Release();
}

Status LayerNormForward(void* stream, const float* x, const void* weight, const void* bias, DType dtype,
                        int64_t rows, int64_t channels, float* y, float* mean, float* rstd) {
  STRATA_RETURN_IF_ERROR(Require(x != nullptr && weight != nullptr && bias != nullptr && y != nullptr &&
                                     mean != nullptr && rstd != nullptr,
                                 "LayerNormForward: null pointer"));
  STRATA_RETURN_IF_ERROR(Require(KnownDType(dtype), "LayerNormForward: unknown dtype"));
  STRATA_RETURN_IF_ERROR(Require(rows >= 0 && channels > 0, "LayerNormForward: bad shape"));
  return CudaStatus(
      LaunchLayerNormForward(x, weight, bias, dtype, rows, channels, y, mean, rstd, AsStream(stream)),
      "LayerNorm forward launch");
}

Status LayerNormBackward(void* stream, const float* x, const float* dy, const void* weight, DType dtype,
                         const float* mean, const float* rstd, int64_t rows, int64_t channels, float* dx,
                         float* dweight, float* dbias, bool accumulate) {
  STRATA_RETURN_IF_ERROR(Require(x != nullptr && dy != nullptr && weight != nullptr && mean != nullptr &&
                                     rstd != nullptr && dweight != nullptr && dbias != nullptr,
                                 "LayerNormBackward: null pointer"));
  STRATA_RETURN_IF_ERROR(Require(KnownDType(dtype), "LayerNormBackward: unknown dtype"));
  STRATA_RETURN_IF_ERROR(Require(rows >= 0 && channels > 0, "LayerNormBackward: bad shape"));
  cudaStream_t s = AsStream(stream);
  StreamScratch scratch(s, "LayerNorm gradient scratch");
  STRATA_ASSIGN_OR_RETURN(char* buf,
                          scratch.Allocate(LayerNormGradScratchFloats(rows, channels) * sizeof(float)));
  STRATA_RETURN_IF_ERROR(
      CudaStatus(LaunchLayerNormBackward(x, dy, weight, dtype, mean, rstd, rows, channels, dx, dweight, dbias,
                                         accumulate, reinterpret_cast<float*>(buf), s),
                 "LayerNorm backward launch"));
  return scratch.Release();
}

Status AttentionForward(void* stream, const float* qkv, int64_t batch, int64_t seq, int64_t channels,
                        int64_t heads, float* out, float* att) {
  STRATA_RETURN_IF_ERROR(
      Require(qkv != nullptr && out != nullptr && att != nullptr, "AttentionForward: null pointer"));
  STRATA_ASSIGN_OR_RETURN(const AttentionShape sh, CheckAttention(batch, seq, channels, heads));
  const int64_t ld = 3 * channels, tt = seq * seq;
  // One strided batch per batch row: its heads are hs apart, the rows T * 3C apart.
  for (int64_t b = 0; b < batch; ++b) {
    const float* q = qkv + b * seq * ld;
    STRATA_RETURN_IF_ERROR(BatchedMatmul(stream, seq, seq, sh.hs, Heads(q, ld, sh, false),
                                         Heads(q + channels, ld, sh, true), att + b * heads * tt, seq, tt,
                                         heads));
  }
  STRATA_RETURN_IF_ERROR(CudaStatus(LaunchCausalSoftmax(att, batch * heads, seq, sh.scale, AsStream(stream)),
                                    "causal softmax launch"));
  for (int64_t b = 0; b < batch; ++b) {
    const float* v = qkv + b * seq * ld + 2 * channels;
    STRATA_RETURN_IF_ERROR(BatchedMatmul(stream, seq, sh.hs, seq, Scores(att + b * heads * tt, sh, false),
                                         Heads(v, ld, sh, false), out + b * seq * channels, channels, sh.hs,
                                         heads));
  }
  return OkStatus();
}

Status AttentionBackward(void* stream, const float* qkv, const float* att, const float* dout, int64_t batch,
                         int64_t seq, int64_t channels, int64_t heads, float* dqkv) {
  STRATA_RETURN_IF_ERROR(Require(qkv != nullptr && att != nullptr && dout != nullptr && dqkv != nullptr,
                                 "AttentionBackward: null pointer"));
  STRATA_ASSIGN_OR_RETURN(const AttentionShape sh, CheckAttention(batch, seq, channels, heads));
  if (batch == 0 || seq == 0) return OkStatus();
  const int64_t ld = 3 * channels, tt = seq * seq;
  cudaStream_t s = AsStream(stream);
  // d(scores) of one batch row's heads at a time, reused by the next row in stream order.
  StreamScratch scratch(s, "attention score-gradient scratch");
  STRATA_ASSIGN_OR_RETURN(char* buf, scratch.Allocate(static_cast<size_t>(heads * tt) * sizeof(float)));
  float* dscores = reinterpret_cast<float*>(buf);
  for (int64_t b = 0; b < batch; ++b) {
    const float* q = qkv + b * seq * ld;
    const float* a = att + b * heads * tt;
    const float* d = dout + b * seq * channels;
    float* dq = dqkv + b * seq * ld;
    // d att = dout v^T, then through the softmax (and the scale) in place.
    STRATA_RETURN_IF_ERROR(BatchedMatmul(stream, seq, seq, sh.hs, Heads(d, channels, sh, false),
                                         Heads(q + 2 * channels, ld, sh, true), dscores, seq, tt, heads));
    STRATA_RETURN_IF_ERROR(CudaStatus(LaunchCausalSoftmaxBackward(a, dscores, heads, seq, sh.scale, s),
                                      "causal softmax backward launch"));
    // dq = dS k, dk = dS^T q, dv = att^T dout.
    STRATA_RETURN_IF_ERROR(BatchedMatmul(stream, seq, sh.hs, seq, Scores(dscores, sh, false),
                                         Heads(q + channels, ld, sh, false), dq, ld, sh.hs, heads));
    STRATA_RETURN_IF_ERROR(BatchedMatmul(stream, seq, sh.hs, seq, Scores(dscores, sh, true),
                                         Heads(q, ld, sh, false), dq + channels, ld, sh.hs, heads));
    STRATA_RETURN_IF_ERROR(BatchedMatmul(stream, seq, sh.hs, seq, Scores(a, sh, true),
                                         Heads(d, channels, sh, false), dq + 2 * channels, ld, sh.hs, heads));
  }
  return scratch.Release();
}

Status CrossEntropyForwardBackward(void* stream, const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab, double normaliser, double* row_loss, double* loss,
                                   float* dlogits) {
  STRATA_RETURN_IF_ERROR(Require(logits != nullptr && targets != nullptr && row_loss != nullptr,
                                 "CrossEntropyForwardBackward: null pointer"));
  STRATA_RETURN_IF_ERROR(Require(FitsInt(rows) && vocab > 0 && vocab < INT_MAX,
                                 "CrossEntropyForwardBackward: bad shape (rows below 2^31, vocab > 0)"));
  STRATA_RETURN_IF_ERROR(Require(normaliser > 0, "CrossEntropyForwardBackward: normaliser must be > 0"));
  return CudaStatus(
      LaunchCrossEntropy(logits, targets, rows, vocab, normaliser, row_loss, loss, dlogits, AsStream(stream)),
      "cross-entropy launch");
}

Status AddInPlace(void* stream, float* y, const float* x, int64_t n) {
  STRATA_RETURN_IF_ERROR(Require(n == 0 || (y != nullptr && x != nullptr), "AddInPlace: null pointer"));
  STRATA_RETURN_IF_ERROR(Require(n >= 0, "AddInPlace: n must be >= 0"));
  return CudaStatus(LaunchAddInPlace(y, x, n, AsStream(stream)), "residual add launch");
}

}  // namespace strata::model::cuda
