// A test-local GPT-2 style model assembled from strata's kernels, and the reader of the
// golden data that scripts/gpt_golden.py writes (its docstring has the file format and the
// model). Forward and backward here follow that script's PyTorch model op for op.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "strata/gpt_kernels.h"
#include "strata/mlp_kernels.h"
#include "strata/status.h"

namespace strata::model::testing {

struct GptConfig {
  int64_t vocab = 0, block = 0, layers = 0, heads = 0, channels = 0, batch = 0, seq = 0;
};

// One parameter tensor: its name and where it lies in the flat parameter vector.
struct ParamTensor {
  std::string name;
  int64_t offset = 0, size = 0;
};

inline double MaxAbs(const float* v, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(static_cast<double>(v[i])));
  return m;
}

// Largest |a - b| relative to the largest |b|: the golden comparisons' measure.
inline double RelErr(const float* a, const float* b, int64_t n) {
  double err = 0;
  for (int64_t i = 0; i < n; ++i) err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
  return err / std::max(MaxAbs(b, n), 1e-30);
}

// The tensors in the golden file's order.
inline std::vector<ParamTensor> ParamLayout(const GptConfig& g) {
  std::vector<ParamTensor> out;
  int64_t offset = 0;
  auto add = [&](std::string name, int64_t size) {
    out.push_back({std::move(name), offset, size});
    offset += size;
  };
  const int64_t c = g.channels;
  add("wte", g.vocab * c);
  add("wpe", g.block * c);
  for (int64_t l = 0; l < g.layers; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    const std::pair<const char*, int64_t> tensors[] = {{"ln1.weight", c},
                                                       {"ln1.bias", c},
                                                       {"attn.qkv.weight", 3 * c * c},
                                                       {"attn.qkv.bias", 3 * c},
                                                       {"attn.proj.weight", c * c},
                                                       {"attn.proj.bias", c},
                                                       {"ln2.weight", c},
                                                       {"ln2.bias", c},
                                                       {"mlp.fc.weight", 4 * c * c},
                                                       {"mlp.fc.bias", 4 * c},
                                                       {"mlp.proj.weight", 4 * c * c},
                                                       {"mlp.proj.bias", c}};
    for (const auto& [name, size] : tensors) add(p + name, size);
  }
  add("lnf.weight", c);
  add("lnf.bias", c);
  return out;
}

struct Golden {
  GptConfig config;
  std::vector<int32_t> tokens, targets;
  float loss = 0;
  std::vector<float> logits, params, grads;
};

// Reads the golden file; returns an empty string on success, else what is wrong.
inline std::string ReadGolden(const std::string& path, Golden* g) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "cannot open " + path + " (regenerate with scripts/gpt_golden.py)";
  int32_t h[16];
  in.read(reinterpret_cast<char*>(h), sizeof(h));
  if (!in || h[0] != 0x54504753 || h[1] != 1) return path + ": bad header (magic or version)";
  g->config = {h[2], h[3], h[4], h[5], h[6], h[7], h[8]};
  const GptConfig& c = g->config;
  const std::vector<ParamTensor> layout = ParamLayout(c);
  const int64_t n_params = layout.back().offset + layout.back().size;
  if (h[9] != n_params) return path + ": parameter count does not match the tensor order";
  auto read = [&](auto& v, int64_t n) {
    v.resize(static_cast<size_t>(n));
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(v[0])));
  };
  read(g->tokens, c.batch * c.seq);
  read(g->targets, c.batch * c.seq);
  in.read(reinterpret_cast<char*>(&g->loss), sizeof(float));
  read(g->logits, c.batch * c.seq * c.vocab);
  read(g->params, n_params);
  read(g->grads, n_params);
  if (!in || in.peek() != std::char_traits<char>::eof()) return path + ": truncated or overlong";
  return {};
}

// Forward and backward of the whole model on one batch. Gradients of every parameter are
// overwritten (first use of each tensor in the backward passes accumulate = false, later
// uses true, as the engine's flags do for the tied wte).
class TinyGpt {
 public:
  TinyGpt(const GptConfig& config, const float* params)
      : g_(config), params_(params), layout_(ParamLayout(config)) {
    const int64_t n = g_.batch * g_.seq, c = g_.channels;
    layers_.resize(static_cast<size_t>(g_.layers));
    for (Layer& a : layers_) {
      for (auto* v : {&a.in, &a.ln1, &a.atty, &a.res2, &a.ln2}) v->resize(n * c);
      for (auto* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) v->resize(n);
      a.qkv.resize(n * 3 * c);
      a.att.resize(g_.batch * g_.heads * g_.seq * g_.seq);
      a.fc.resize(n * 4 * c);
      a.fc_gelu.resize(n * 4 * c);
    }
    out_.resize(n * c);
    lnf_.resize(n * c);
    lnf_mean_.resize(n);
    lnf_rstd_.resize(n);
    logits_.resize(n * g_.vocab);
  }

  const std::vector<float>& logits() const { return logits_; }

  // Returns the mean loss over the batch's tokens and writes every gradient into grads.
  double ForwardBackward(const int32_t* tokens, const int32_t* targets, float* grads) {
    Forward(tokens);
    const int64_t n = g_.batch * g_.seq;
    std::vector<float> dlogits(n * g_.vocab);
    const double loss = CrossEntropyForwardBackward(logits_.data(), targets, n, g_.vocab,
                                                    static_cast<double>(n), dlogits.data());
    Backward(tokens, dlogits, grads);
    return loss;
  }

 private:
  struct Layer {
    std::vector<float> in, ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fc,
        fc_gelu;
  };

  // Tensor `index` of the layout; tensor i of block l (0 = ln1.weight .. 11 = mlp.proj.bias).
  const float* P(int64_t index) const { return params_ + layout_[index].offset; }
  const float* P(int64_t l, int64_t i) const { return P(2 + 12 * l + i); }
  float* G(float* grads, int64_t l, int64_t i) const { return grads + layout_[2 + 12 * l + i].offset; }

  void Forward(const int32_t* tokens) {
    const int64_t n = g_.batch * g_.seq, c = g_.channels;
    EmbeddingForward(tokens, P(0), P(1), g_.batch, g_.seq, c, g_.vocab, layers_[0].in.data());
    for (int64_t l = 0; l < g_.layers; ++l) {
      Layer& a = layers_[l];
      float* out = l + 1 < g_.layers ? layers_[l + 1].in.data() : out_.data();
      LayerNormForward(a.in.data(), P(l, 0), P(l, 1), n, c, a.ln1.data(), a.ln1_mean.data(),
                       a.ln1_rstd.data());
      LinearForward(a.ln1.data(), n, c, 3 * c, P(l, 2), P(l, 3), DType::kF32, a.qkv.data());
      AttentionForward(a.qkv.data(), g_.batch, g_.seq, c, g_.heads, a.atty.data(), a.att.data());
      LinearForward(a.atty.data(), n, c, c, P(l, 4), P(l, 5), DType::kF32, a.res2.data());
      for (int64_t i = 0; i < n * c; ++i) a.res2[i] += a.in[i];
      LayerNormForward(a.res2.data(), P(l, 6), P(l, 7), n, c, a.ln2.data(), a.ln2_mean.data(),
                       a.ln2_rstd.data());
      LinearForward(a.ln2.data(), n, c, 4 * c, P(l, 8), P(l, 9), DType::kF32, a.fc.data());
      GeluForward(a.fc.data(), n * 4 * c, a.fc_gelu.data());
      LinearForward(a.fc_gelu.data(), n, 4 * c, c, P(l, 10), P(l, 11), DType::kF32, out);
      for (int64_t i = 0; i < n * c; ++i) out[i] += a.res2[i];
    }
    const int64_t f = 2 + 12 * g_.layers;
    LayerNormForward(out_.data(), P(f), P(f + 1), n, c, lnf_.data(), lnf_mean_.data(), lnf_rstd_.data());
    // Tied head: logits = lnf wte^T, through Gemm with wte transposed to [C, V].
    std::vector<float> wte_t(c * g_.vocab);
    for (int64_t v = 0; v < g_.vocab; ++v) {
      for (int64_t j = 0; j < c; ++j) wte_t[j * g_.vocab + v] = P(0)[v * c + j];
    }
    Gemm(n, g_.vocab, c, lnf_.data(), c, wte_t.data(), g_.vocab, logits_.data(), g_.vocab, false);
  }

  void Backward(const int32_t* tokens, const std::vector<float>& dlogits, float* grads) {
    const int64_t n = g_.batch * g_.seq, c = g_.channels, f = 2 + 12 * g_.layers;
    float* dwte = grads + layout_[0].offset;
    std::vector<float> dlnf(n * c), dres(n * c), dtmp(n * c), dwide(n * 4 * c), dqkv(n * 3 * c);
    Gemm(n, c, g_.vocab, dlogits.data(), g_.vocab, P(0), c, dlnf.data(), c, false);
    std::vector<float> dlogits_t(g_.vocab * n);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t v = 0; v < g_.vocab; ++v) dlogits_t[v * n + i] = dlogits[i * g_.vocab + v];
    }
    Gemm(g_.vocab, c, n, dlogits_t.data(), n, lnf_.data(), c, dwte, c, false);  // first use of wte
    LayerNormBackward(out_.data(), dlnf.data(), P(f), lnf_mean_.data(), lnf_rstd_.data(), n, c, dres.data(),
                      grads + layout_[f].offset, grads + layout_[f + 1].offset, false);
    for (int64_t l = g_.layers - 1; l >= 0; --l) {
      Layer& a = layers_[l];
      LinearBackward(a.fc_gelu.data(), dres.data(), n, 4 * c, c, P(l, 10), DType::kF32, dwide.data(),
                     G(grads, l, 10), G(grads, l, 11), false);
      GeluBackward(a.fc.data(), dwide.data(), n * 4 * c, dwide.data());
      LinearBackward(a.ln2.data(), dwide.data(), n, c, 4 * c, P(l, 8), DType::kF32, dtmp.data(),
                     G(grads, l, 8), G(grads, l, 9), false);
      LayerNormBackward(a.res2.data(), dtmp.data(), P(l, 6), a.ln2_mean.data(), a.ln2_rstd.data(), n, c,
                        dtmp.data(), G(grads, l, 6), G(grads, l, 7), false);
      for (int64_t i = 0; i < n * c; ++i) dres[i] += dtmp[i];
      LinearBackward(a.atty.data(), dres.data(), n, c, c, P(l, 4), DType::kF32, dtmp.data(), G(grads, l, 4),
                     G(grads, l, 5), false);
      AttentionBackward(a.qkv.data(), a.att.data(), dtmp.data(), g_.batch, g_.seq, c, g_.heads, dqkv.data());
      LinearBackward(a.ln1.data(), dqkv.data(), n, c, 3 * c, P(l, 2), DType::kF32, dtmp.data(),
                     G(grads, l, 2), G(grads, l, 3), false);
      LayerNormBackward(a.in.data(), dtmp.data(), P(l, 0), a.ln1_mean.data(), a.ln1_rstd.data(), n, c,
                        dtmp.data(), G(grads, l, 0), G(grads, l, 1), false);
      for (int64_t i = 0; i < n * c; ++i) dres[i] += dtmp[i];
    }
    // wte was written by the head (accumulate); wpe's first use (overwrite).
    EmbeddingBackward(tokens, dres.data(), g_.batch, g_.seq, c, g_.vocab, dwte, grads + layout_[1].offset,
                      true, false);
  }

  GptConfig g_;
  const float* params_;
  std::vector<ParamTensor> layout_;
  std::vector<Layer> layers_;
  std::vector<float> out_, lnf_, lnf_mean_, lnf_rstd_, logits_;
};

// tests/data/gpt_golden.bin, read once (a test program that cannot read it stops there).
inline const Golden& GoldenData() {
  static const Golden* golden = [] {
    auto* g = new Golden;
    const std::string error = ReadGolden(STRATA_TEST_DATA_DIR "/gpt_golden.bin", g);
    STRATA_CHECK_MSG(error.empty(), error);
    return g;
  }();
  return *golden;
}

}  // namespace strata::model::testing
