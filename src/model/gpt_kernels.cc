// CPU kernels of the GPT: embeddings, LayerNorm, causal attention, cross-entropy.
#include "strata/gpt_kernels.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "strata/mlp_kernels.h"
#include "strata/status.h"

namespace strata::model {

namespace {

// Rows per piece of the LayerNorm weight-gradient reduction. Fixed (not derived from the
// thread count) so that the partial sums, and hence the result, never change.
constexpr int64_t kLayerNormChunk = 32;
// Query rows per attention block: a block's scores need only keys up to its last row, so
// blocking skips most of the masked upper triangle while keeping Gemm's tiles full.
constexpr int64_t kAttentionBlock = 64;

// dst [cols, rows] = transpose of src [rows, cols] (leading dimension ld).
void Transpose(const float* src, int64_t ld, int64_t rows, int64_t cols, float* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) dst[j * rows + i] = src[i * ld + j];
  }
}

// Per-thread attention scratch, reused because first touch of fresh memory is slow. Each
// (batch, head) runs isolated, so a thread waiting inside its nested Gemm never starts
// another (batch, head) that would overwrite this scratch.
std::vector<float>& AttentionScratch(int64_t n) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < n) scratch.resize(static_cast<size_t>(n));
  return scratch;
}

// One (batch, head) of the forward. q, k, v have leading dimension 3C; out has C.
void AttentionHeadForward(const float* q, const float* k, const float* v, int64_t seq, int64_t hs,
                          int64_t ld_qkv, int64_t ld_out, float* out, float* att) {
  float* kt = AttentionScratch(hs * seq).data();
  Transpose(k, ld_qkv, seq, hs, kt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
    const int64_t i1 = std::min(seq, i0 + kAttentionBlock);
    // Raw scores of rows [i0, i1) against keys [0, i1); later keys are all masked.
    Gemm(i1 - i0, i1, hs, q + i0 * ld_qkv, ld_qkv, kt, seq, att + i0 * seq, seq, false);
    for (int64_t i = i0; i < i1; ++i) {
      float* row = att + i * seq;
      float max = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        row[j] *= scale;
        max = std::max(max, row[j]);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j <= i; ++j) {
        row[j] = std::exp(row[j] - max);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j <= i; ++j) row[j] *= inv;
      std::fill(row + i + 1, row + seq, 0.0f);
    }
    Gemm(i1 - i0, hs, i1, att + i0 * seq, seq, v, ld_qkv, out + i0 * ld_out, ld_out, false);
  }
}

// One (batch, head) of the backward; dq, dk, dv have leading dimension 3C, dout has C.
void AttentionHeadBackward(const float* q, const float* k, const float* v, const float* att,
                           const float* dout, int64_t seq, int64_t hs, int64_t ld_qkv, int64_t ld_out,
                           float* dq, float* dk, float* dv) {
  float* vt = AttentionScratch(hs * seq + 2 * seq * seq).data();
  float* datt = vt + hs * seq;  // becomes d(scaled scores), zero above the diagonal
  float* trans = datt + seq * seq;
  Transpose(v, ld_qkv, seq, hs, vt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  for (int64_t i0 = 0; i0 < seq; i0 += kAttentionBlock) {
    const int64_t i1 = std::min(seq, i0 + kAttentionBlock);
    Gemm(i1 - i0, i1, hs, dout + i0 * ld_out, ld_out, vt, seq, datt + i0 * seq, seq, false);
    for (int64_t i = i0; i < i1; ++i) {
      const float* a = att + i * seq;
      float* d = datt + i * seq;
      float dot = 0.0f;
      for (int64_t j = 0; j <= i; ++j) dot += a[j] * d[j];
      // Softmax backward, then the 1/sqrt(hs) of the scores folded in once here.
      for (int64_t j = 0; j <= i; ++j) d[j] = scale * a[j] * (d[j] - dot);
      std::fill(d + i + 1, d + seq, 0.0f);
    }
    Gemm(i1 - i0, hs, i1, datt + i0 * seq, seq, k, ld_qkv, dq + i0 * ld_qkv, ld_qkv, false);
  }
  // dv = att^T dout and dk = dscores^T q; key row j only sees queries i >= j.
  Transpose(att, seq, seq, seq, trans);
  for (int64_t j0 = 0; j0 < seq; j0 += kAttentionBlock) {
    const int64_t j1 = std::min(seq, j0 + kAttentionBlock);
    Gemm(j1 - j0, hs, seq - j0, trans + j0 * seq + j0, seq, dout + j0 * ld_out, ld_out, dv + j0 * ld_qkv,
         ld_qkv, false);
  }
  Transpose(datt, seq, seq, seq, trans);
  for (int64_t j0 = 0; j0 < seq; j0 += kAttentionBlock) {
    const int64_t j1 = std::min(seq, j0 + kAttentionBlock);
    Gemm(j1 - j0, hs, seq - j0, trans + j0 * seq + j0, seq, q + j0 * ld_qkv, ld_qkv, dk + j0 * ld_qkv, ld_qkv,
         false);
  }
}

}  // namespace

void EmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, int64_t batch, int64_t seq,
                      int64_t channels, int64_t vocab, float* out) {
  STRATA_CHECK(tokens != nullptr && wte != nullptr && wpe != nullptr && out != nullptr);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, batch * seq, 16),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t bt = r.begin(); bt < r.end(); ++bt) {
                        const int32_t token = tokens[bt];
                        STRATA_CHECK_MSG(token >= 0 && token < vocab, "token id out of range");
                        const float* te = wte + token * channels;
                        const float* pe = wpe + (bt % seq) * channels;
                        float* o = out + bt * channels;
                        for (int64_t c = 0; c < channels; ++c) o[c] = te[c] + pe[c];
                      }
                    });
}

void EmbeddingBackward(const int32_t* tokens, const float* dout, int64_t batch, int64_t seq, int64_t channels,
                       int64_t vocab, float* dwte, float* dwpe, bool accumulate_wte, bool accumulate_wpe) {
  STRATA_CHECK(tokens != nullptr && dout != nullptr);
  const int64_t n = batch * seq;
  if (dwte != nullptr) {
    // Counting sort of the positions by token (stable, so ascending (b, t) per token): then
    // each row of dwte is owned by one thread and summed in a fixed order, no atomics.
    std::vector<int64_t> start(static_cast<size_t>(vocab + 1), 0), positions(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      STRATA_CHECK_MSG(tokens[i] >= 0 && tokens[i] < vocab, "token id out of range");
      ++start[tokens[i] + 1];
    }
    for (int64_t v = 0; v < vocab; ++v) start[v + 1] += start[v];
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) positions[next[tokens[i]]++] = i;
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, vocab, 64), [&](const tbb::blocked_range<int64_t>& r) {
      std::vector<float> acc(static_cast<size_t>(channels));
      for (int64_t v = r.begin(); v < r.end(); ++v) {
        float* g = dwte + v * channels;
        if (start[v] == start[v + 1]) {
          if (!accumulate_wte) std::fill(g, g + channels, 0.0f);
          continue;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t p = start[v]; p < start[v + 1]; ++p) {
          const float* d = dout + positions[p] * channels;
          for (int64_t c = 0; c < channels; ++c) acc[c] += d[c];
        }
        for (int64_t c = 0; c < channels; ++c) g[c] = accumulate_wte ? g[c] + acc[c] : acc[c];
      }
    });
  }
  if (dwpe != nullptr) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, seq, 4), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t t = r.begin(); t < r.end(); ++t) {
        float* g = dwpe + t * channels;
        for (int64_t c = 0; c < channels; ++c) {
          float acc = 0.0f;
          for (int64_t b = 0; b < batch; ++b) acc += dout[(b * seq + t) * channels + c];
          g[c] = accumulate_wpe ? g[c] + acc : acc;
        }
      }
    });
  }
}

void LayerNormForward(const float* x, const float* weight, const float* bias, int64_t rows, int64_t channels,
                      float* y, float* mean, float* rstd) {
  STRATA_CHECK(x != nullptr && weight != nullptr && bias != nullptr && y != nullptr);
  STRATA_CHECK(mean != nullptr && rstd != nullptr && channels > 0);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 16), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const float* xi = x + i * channels;
      float sum = 0.0f;
      for (int64_t c = 0; c < channels; ++c) sum += xi[c];
      const float m = sum / static_cast<float>(channels);
      // Two passes (centred squares) rather than E[x^2] - m^2, which cancels badly.
      float var = 0.0f;
      for (int64_t c = 0; c < channels; ++c) var += (xi[c] - m) * (xi[c] - m);
      const float s = 1.0f / std::sqrt(var / static_cast<float>(channels) + kLayerNormEps);
      float* yi = y + i * channels;
      for (int64_t c = 0; c < channels; ++c) yi[c] = (xi[c] - m) * s * weight[c] + bias[c];
      mean[i] = m;
      rstd[i] = s;
    }
  });
}

void LayerNormBackward(const float* x, const float* dy, const float* weight, const float* mean,
                       const float* rstd, int64_t rows, int64_t channels, float* dx, float* dweight,
                       float* dbias, bool accumulate) {
  STRATA_CHECK(x != nullptr && dy != nullptr && weight != nullptr && mean != nullptr && rstd != nullptr);
  STRATA_CHECK(dweight != nullptr && dbias != nullptr);
  const int64_t chunks = (rows + kLayerNormChunk - 1) / kLayerNormChunk;
  // partial[k] = [dweight | dbias] of rows chunk k; the chunks are added in order below.
  std::vector<float> partial(static_cast<size_t>(chunks * 2 * channels), 0.0f);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, chunks, 1), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t k = r.begin(); k < r.end(); ++k) {
      float* pw = partial.data() + k * 2 * channels;
      float* pb = pw + channels;
      for (int64_t i = k * kLayerNormChunk; i < std::min(rows, (k + 1) * kLayerNormChunk); ++i) {
        const float* xi = x + i * channels;
        const float* dyi = dy + i * channels;
        const float m = mean[i], s = rstd[i];
        float dnorm_mean = 0.0f, dnorm_xhat_mean = 0.0f;
        for (int64_t c = 0; c < channels; ++c) {
          const float xhat = (xi[c] - m) * s;
          const float dnorm = weight[c] * dyi[c];
          dnorm_mean += dnorm;
          dnorm_xhat_mean += dnorm * xhat;
          pw[c] += dyi[c] * xhat;
          pb[c] += dyi[c];
        }
        dnorm_mean /= static_cast<float>(channels);
        dnorm_xhat_mean /= static_cast<float>(channels);
        if (dx == nullptr) continue;
        float* dxi = dx + i * channels;
        for (int64_t c = 0; c < channels; ++c) {
          const float xhat = (xi[c] - m) * s;
          dxi[c] = s * (weight[c] * dyi[c] - dnorm_mean - xhat * dnorm_xhat_mean);
        }
      }
    }
  });
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, channels, 64), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t c = r.begin(); c < r.end(); ++c) {
      float w = 0.0f, b = 0.0f;
      for (int64_t k = 0; k < chunks; ++k) {
        w += partial[k * 2 * channels + c];
        b += partial[k * 2 * channels + channels + c];
      }
      dweight[c] = accumulate ? dweight[c] + w : w;
      dbias[c] = accumulate ? dbias[c] + b : b;
    }
  });
}

void AttentionForward(const float* qkv, int64_t batch, int64_t seq, int64_t channels, int64_t heads,
                      float* out, float* att) {
  STRATA_CHECK(qkv != nullptr && out != nullptr && att != nullptr);
  STRATA_CHECK(heads > 0 && channels % heads == 0);
  const int64_t hs = channels / heads, ld = 3 * channels;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, batch * heads, 1),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t bh = r.begin(); bh < r.end(); ++bh) {
                        const int64_t b = bh / heads, h = bh % heads;
                        const float* q = qkv + b * seq * ld + h * hs;
                        tbb::this_task_arena::isolate([&] {
                          AttentionHeadForward(q, q + channels, q + 2 * channels, seq, hs, ld, channels,
                                               out + b * seq * channels + h * hs, att + bh * seq * seq);
                        });
                      }
                    });
}

void AttentionBackward(const float* qkv, const float* att, const float* dout, int64_t batch, int64_t seq,
                       int64_t channels, int64_t heads, float* dqkv) {
  STRATA_CHECK(qkv != nullptr && att != nullptr && dout != nullptr && dqkv != nullptr);
  STRATA_CHECK(heads > 0 && channels % heads == 0);
  const int64_t hs = channels / heads, ld = 3 * channels;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, batch * heads, 1),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t bh = r.begin(); bh < r.end(); ++bh) {
                        const int64_t b = bh / heads, h = bh % heads;
                        const int64_t offset = b * seq * ld + h * hs;
                        const float* q = qkv + offset;
                        float* dq = dqkv + offset;
                        tbb::this_task_arena::isolate([&] {
                          AttentionHeadBackward(q, q + channels, q + 2 * channels, att + bh * seq * seq,
                                                dout + b * seq * channels + h * hs, seq, hs, ld, channels, dq,
                                                dq + channels, dq + 2 * channels);
                        });
                      }
                    });
}

double CrossEntropyForwardBackward(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                                   double normaliser, float* dlogits) {
  STRATA_CHECK(logits != nullptr && targets != nullptr && normaliser > 0 && vocab > 0);
  std::vector<double> per_row(static_cast<size_t>(rows));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, 4), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) {
      const int32_t target = targets[i];
      STRATA_CHECK_MSG(target >= 0 && target < vocab, "target id out of range");
      const float* y = logits + i * vocab;
      float m = y[0];
      for (int64_t j = 1; j < vocab; ++j) m = std::max(m, y[j]);
      double sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(y[j]) - m);
      const double lse = std::log(sum) + m;
      per_row[i] = (lse - y[target]) / normaliser;  // read before dlogits may overwrite it
      if (dlogits == nullptr) continue;
      float* d = dlogits + i * vocab;
      for (int64_t j = 0; j < vocab; ++j) {
        const double p = std::exp(static_cast<double>(y[j]) - lse);
        d[j] = static_cast<float>((p - (j == target ? 1.0 : 0.0)) / normaliser);
      }
    }
  });
  double total = 0.0;
  for (int64_t i = 0; i < rows; ++i) total += per_row[i];
  return total;
}

}  // namespace strata::model
