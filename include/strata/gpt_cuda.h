// CUDA versions of the GPT kernels (gpt_kernels.h): the same formulas, layouts and
// accumulate flags. GELU is mlp_cuda.h's GeluForward / GeluBackward (same tanh formula;
// in place is fine), and the Linear layers and the LM head are its LinearForward /
// LinearBackward.
//
// Contract:
//  - All pointers are device pointers; `stream` is a cudaStream_t passed as void* (nullptr:
//    the legacy default stream). Work is enqueued asynchronously on the stream: a returned
//    OK means the launches succeeded, not that they finished. The caller owns every buffer
//    and keeps it alive until the stream has run the work. Scratch (EmbeddingBackward's
//    sort, LayerNormBackward's partial sums, AttentionBackward's [NH, T, T] score gradient)
//    is allocated and freed stream-ordered (cudaMallocAsync) inside the call.
//  - Types: wte, wpe and the LayerNorm weight and bias are fp32, bf16 or fp16 (`dtype`,
//    16-bit as raw bits, widened exactly); all arithmetic is fp32 (the loss double).
//    fp32 only: activations (x, y, qkv, att, logits), their gradients and all parameter
//    gradients, mean and rstd.
//  - Accuracy: not bit-identical to the CPU kernels (other summation orders, expf, fused
//    multiply-adds): compare with a tolerance. Attention's products run on cuBLAS
//    (model/cuda/matmul.h: fp32, or TF32 under STRATA_CUDA_MATMUL=tensor).
//  - Determinism: every reduction has a fixed order for a given shape, and no float
//    atomics are used, so two runs on the same GPU and toolkit give the same bits.
//    EmbeddingBackward, and LayerNormBackward's dweight and dbias, add in the CPU kernels'
//    order (ascending (b, t); pieces of 32 rows, the pieces ascending).
//  - Ids are not checked on the host (they live on the device): a token id or target out
//    of [0, V) is never used as an address; its output row (embedding, dlogits) and its
//    row loss become NaN, so the loss shows it, and EmbeddingBackward skips it.
//  - Errors come back as a Status: InvalidArgument for bad shapes or null required
//    pointers, Internal for a launch or runtime error, ResourceExhausted when scratch cannot
//    be allocated, Unavailable in a build without CUDA (every function).
//  - Threads: any host thread may enqueue, on its current device; ordering is the stream's.
#pragma once

#include <cstdint>

#include "strata/dtype.h"
#include "strata/status.h"

namespace strata::model::cuda {

// out [B, T, C] = wte[tokens[b, t], :] + wpe[t, :]; tokens [B, T], wte [V, C], wpe >= T rows.
Status EmbeddingForward(void* stream, const int32_t* tokens, const void* wte, const void* wpe, DType dtype,
                        int64_t batch, int64_t seq, int64_t channels, int64_t vocab, float* out);

// dwte [V, C] and dwpe (rows t < T) from dout [B, T, C], as the CPU kernel (either may be
// null to skip it; with accumulate_wte false the rows of unused tokens become zero).
Status EmbeddingBackward(void* stream, const int32_t* tokens, const float* dout, int64_t batch, int64_t seq,
                         int64_t channels, int64_t vocab, float* dwte, float* dwpe, bool accumulate_wte,
                         bool accumulate_wpe);

// LayerNorm over C with eps kLayerNormEps (gpt_kernels.h); mean, rstd [rows] saved.
Status LayerNormForward(void* stream, const float* x, const void* weight, const void* bias, DType dtype,
                        int64_t rows, int64_t channels, float* y, float* mean, float* rstd);

// dx [rows, C] (may be null; may alias dy), dweight and dbias [C] (overwritten, or added to
// with `accumulate`).
Status LayerNormBackward(void* stream, const float* x, const float* dy, const void* weight, DType dtype,
                         const float* mean, const float* rstd, int64_t rows, int64_t channels, float* dx,
                         float* dweight, float* dbias, bool accumulate);

// Causal attention: qkv [B, T, 3C] -> out [B, T, C] and att [B, NH, T, T] (probabilities,
// zero above the diagonal), as the CPU kernel.
Status AttentionForward(void* stream, const float* qkv, int64_t batch, int64_t seq, int64_t channels,
                        int64_t heads, float* out, float* att);

// dqkv [B, T, 3C] (overwritten) from dout [B, T, C] and the forward's qkv and att.
Status AttentionBackward(void* stream, const float* qkv, const float* att, const float* dout, int64_t batch,
                         int64_t seq, int64_t channels, int64_t heads, float* dqkv);

// Cross-entropy of logits [rows, V] against targets [rows]: row_loss [rows] (double,
// required) = (logsumexp - logit of the target) / normaliser, computed in double; `loss`
// (one double, may be null) = the rows' terms added in row order, as the CPU's return value.
// dlogits [rows, V] (may be null; may be the logits buffer) = (softmax - onehot) /
// normaliser.
Status CrossEntropyForwardBackward(void* stream, const float* logits, const int32_t* targets, int64_t rows,
                                   int64_t vocab, double normaliser, double* row_loss, double* loss,
                                   float* dlogits);

// y [n] += x [n] (the residual stream), each element one fp32 add, as the CPU's.
Status AddInPlace(void* stream, float* y, const float* x, int64_t n);

}  // namespace strata::model::cuda
