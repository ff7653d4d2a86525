// CPU kernels of a GPT-2 style decoder-only transformer: embeddings, LayerNorm, causal
// multi-head self-attention and cross-entropy over the vocabulary, forward and backward.
// The remaining ops come from mlp_kernels.h: LinearForward/LinearBackward (the qkv,
// attention-output and MLP projections), GeluForward/GeluBackward (its formula is
// PyTorch's gelu(approximate="tanh"), as GPT-2 uses) and Gemm (the LM head).
//
// Contract:
//  - Layout: row-major fp32. B = batch, T = sequence length, C = channels (n_embd),
//    NH = heads, hs = C / NH, V = vocabulary. Activations are [B, T, C] (or [B * T, C]:
//    the same memory). Parameters and gradients are fp32 here; 16-bit parameters are not
//    supported by these kernels yet.
//  - Determinism: every output element is computed by one thread in a fixed order, and
//    every reduction across rows (weight gradients) is cut into fixed pieces whose partial
//    sums are added in ascending order. Results are therefore bit-identical for any thread
//    count and any oneTBB partitioning. Attention uses Gemm, whose micro-kernel is chosen
//    per machine (see mlp_kernels.h), so results may differ between machines.
//  - Accumulate flags (weight gradients only): false overwrites the gradient with this
//    call's sum, true adds this call's sum to the old value (g = g_old + sum: the sum is
//    formed first, then added once; LinearBackward's GEMM instead adds its terms onto the
//    old value one at a time, so the two round differently). Input gradients (dx,
//    dqkv, dlogits) are always overwritten.
//  - Threads: any thread may call; calls are independent and reentrant. The kernels run
//    their parallel loops on the caller's oneTBB arena.
//  - Broken preconditions (null pointers, token ids or targets out of range, C not a
//    multiple of NH) abort through STRATA_CHECK.
#pragma once

#include <cstdint>

namespace strata::model {

// out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]. tokens [B, T] in [0, V); wte [V, C];
// wpe has at least T rows of C (the model's block size); out [B, T, C].
void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, int64_t batch, int64_t seq,
                      int64_t channels, int64_t vocab, float* out);

// From dout [B, T, C]: dwte[v, :] = sum of dout[b, t, :] over the positions with
// tokens[b, t] == v, added in ascending (b, t) order (rows of unused tokens get zero, or
// keep their old value with accumulate); dwpe[t, :] = sum over b ascending of
// dout[b, t, :] for t < T (rows t >= T are left untouched). Either gradient may be null
// to skip it. Two flags, because the engine's flags are per tensor and a token embedding
// tied to the LM head has been written by the head's backward before this one runs.
void EmbeddingBackward(const int32_t* tokens, const float* dout, int64_t batch, int64_t seq, int64_t channels,
                       int64_t vocab, float* dwte, float* dwpe, bool accumulate_wte, bool accumulate_wpe);

// PyTorch's LayerNorm over the last dimension with eps = 1e-5 (biased variance):
// y = (x - mean) * rstd * weight + bias, rstd = 1 / sqrt(var + eps). x, y [rows, C];
// mean, rstd [rows] are saved for the backward.
inline constexpr float kLayerNormEps = 1e-5f;
void LayerNormForward(const float* x, const float* weight, const float* bias, int64_t rows, int64_t channels,
                      float* y, float* mean, float* rstd);

// From dy [rows, C] and the forward's x, mean and rstd: dx [rows, C] (overwritten; may be
// null to skip; may alias dy), dweight [C] = sum_r dy * xhat, dbias [C] = sum_r dy, each
// summed over fixed pieces of 32 rows, the pieces' sums added in ascending order.
void LayerNormBackward(const float* x, const float* dy, const float* weight, const float* mean,
                       const float* rstd, int64_t rows, int64_t channels, float* dx, float* dweight,
                       float* dbias, bool accumulate);

// Causal self-attention core. qkv [B, T, 3C] holds q, k, v side by side (q = [.., 0:C],
// k = [.., C:2C], v = [.., 2C:3C]); head h uses columns h * hs .. (h + 1) * hs of each.
// For every (b, h): att = softmax(q k^T / sqrt(hs)) with key positions > the query's
// masked out, out[b, :, h * hs:(h + 1) * hs] = att v. out [B, T, C]. att [B, NH, T, T]
// keeps the probabilities for the backward (zero above the diagonal).
void AttentionForward(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                      float* out, float* att);

// From dout [B, T, C], the forward's qkv and att: dqkv [B, T, 3C] (overwritten).
void AttentionBackward(const float* qkv, const float* att, const float* dout, int64_t batch, int64_t seq,
                       int64_t channels, int64_t heads, float* dqkv);

// Cross-entropy of logits [rows, V] against targets [rows] in [0, V):
//   loss = sum_r (logsumexp(logits_r) - logits_r[target_r]) / normaliser,
// returned in double, the rows' terms summed in row order. Pass the number of tokens of
// the global batch as the normaliser so that split batches add up to its mean.
// dlogits [rows, V] = (softmax(logits_r) - onehot(target_r)) / normaliser, or skipped
// when null. dlogits may be the logits buffer itself (each row is read before it is
// overwritten), which saves the largest activation of a GPT.
double CrossEntropyForwardBackward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                   double normaliser, float* dlogits);

}  // namespace strata::model
