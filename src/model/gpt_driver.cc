// The GPT driver: forward, loss and backward of one micro-batch through the hooks, with
// optional activation checkpointing of the blocks.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <string>
#include <utility>

#include "strata/gpt.h"
#include "strata/gpt_kernels.h"
#include "strata/mlp_kernels.h"

namespace strata::model {

namespace {

template <class T>
void Grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// The residual adds: y += x.
void AddInPlace(float* y, const float* x, int64_t n) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 1 << 14), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) y[i] += x[i];
  });
}

// The kernels take one flag for a weight and its bias, the hooks one per tensor: when they
// differ, the tensor to overwrite is zeroed first and both are added to.
bool PairAccumulate(const ModuleGrads& g, size_t a, int64_t a_size, size_t b, int64_t b_size) {
  if (g.accumulate[a] == g.accumulate[b]) return g.accumulate[a] != 0;
  if (!g.accumulate[a]) std::fill(g.tensors[a], g.tensors[a] + a_size, 0.0f);
  if (!g.accumulate[b]) std::fill(g.tensors[b], g.tensors[b] + b_size, 0.0f);
  return true;
}

}  // namespace

Gpt::Gpt(GptSpec spec, Backend backend) : spec_(std::move(spec)), backend_(backend) {
  STRATA_CHECK_MSG(ValidateSpec(spec_).ok(), ValidateSpec(spec_).message());
  model_ = GptModel(spec_);
  zero_bias_.assign(static_cast<size_t>(spec_.vocab_size), 0.0f);
  dbias_scratch_.assign(static_cast<size_t>(spec_.vocab_size), 0.0f);
}

Result<double> Gpt::ForwardBackward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                    double normaliser, ModuleHooks& hooks) {
  return Run(tokens, targets, batch, seq, normaliser, hooks, true);
}

Result<double> Gpt::Forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                            double normaliser, ModuleHooks& hooks) {
  return Run(tokens, targets, batch, seq, normaliser, hooks, false);
}

int64_t Gpt::activation_floats() const {
  int64_t n = 0;
  for (const auto* v :
       {&block_in_, &lnf_, &lnf_mean_, &lnf_rstd_, &logits_, &dres_, &dtmp_, &dwide_, &dqkv_}) {
    n += static_cast<int64_t>(v->size());
  }
  for (const BlockActs& a : blocks_) {
    for (const auto* v : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.res2, &a.ln2,
                          &a.ln2_mean, &a.ln2_rstd, &a.fc, &a.fc_gelu}) {
      n += static_cast<int64_t>(v->size());
    }
  }
  return n;
}

Status Gpt::CheckBatch(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                       double normaliser) const {
  if (backend_ != Backend::kCpu) {
    return UnimplementedError("GPT: the CUDA backend is not built yet (the GPT kernels run on the CPU only)");
  }
  if (tokens == nullptr || targets == nullptr) return InvalidArgumentError("GPT: null tokens or targets");
  if (batch < 1 || seq < 1 || seq > spec_.block_size) {
    return InvalidArgumentError("GPT: batch " + std::to_string(batch) + " x seq " + std::to_string(seq) +
                                " does not fit the model (batch >= 1, 1 <= seq <= block_size " +
                                std::to_string(spec_.block_size) + ")");
  }
  if (!(normaliser > 0)) return InvalidArgumentError("GPT: loss normaliser must be > 0");
  for (const auto& [ids, what] : {std::pair{tokens, "token"}, std::pair{targets, "target"}}) {
    for (int64_t i = 0; i < batch * seq; ++i) {
      if (ids[i] < 0 || ids[i] >= spec_.vocab_size) {
        return InvalidArgumentError(std::string("GPT: ") + what + " " + std::to_string(ids[i]) +
                                    " at position " + std::to_string(i) + " is outside [0, vocab_size " +
                                    std::to_string(spec_.vocab_size) + ")");
      }
    }
  }
  return OkStatus();
}

void Gpt::EnsureWorkspace(int64_t batch, int64_t seq) {
  batch_ = batch;
  seq_ = seq;
  rows_ = batch * seq;
  const int64_t n = rows_, c = spec_.n_embd;
  Grow(block_in_, (spec_.n_layer + 1) * n * c);
  Grow(lnf_, n * c);
  Grow(lnf_mean_, n);
  Grow(lnf_rstd_, n);
  Grow(logits_, n * spec_.vocab_size);
  // Dropping the blocks that recompute no longer keeps is what saves the memory.
  blocks_.resize(recompute_ ? 1 : static_cast<size_t>(spec_.n_layer));
  for (BlockActs& a : blocks_) {
    for (auto* v : {&a.ln1, &a.atty, &a.res2, &a.ln2}) Grow(*v, n * c);
    for (auto* v : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) Grow(*v, n);
    Grow(a.qkv, n * 3 * c);
    Grow(a.att, batch * spec_.n_head * seq * seq);
    Grow(a.fc, n * 4 * c);
    Grow(a.fc_gelu, n * 4 * c);
  }
  Grow(dres_, n * c);
  Grow(dtmp_, n * c);
  Grow(dwide_, n * 4 * c);
  Grow(dqkv_, n * 3 * c);
}

Result<double> Gpt::Run(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                        double normaliser, ModuleHooks& hooks, bool backward) {
  STRATA_RETURN_IF_ERROR(CheckBatch(tokens, targets, batch, seq, normaliser));
  EnsureWorkspace(batch, seq);
  STRATA_RETURN_IF_ERROR(ForwardEmbed(tokens, hooks));
  for (int64_t l = 0; l < spec_.n_layer; ++l) STRATA_RETURN_IF_ERROR(ForwardBlock(l, false, hooks));
  STRATA_RETURN_IF_ERROR(ForwardHead(hooks));
  // The logits' gradient overwrites them: the largest activation is held once.
  const double loss = CrossEntropyForwardBackward(logits_.data(), targets, rows_, spec_.vocab_size,
                                                  normaliser, backward ? logits_.data() : nullptr);
  if (!backward) return loss;
  STRATA_RETURN_IF_ERROR(BackwardHead(hooks));
  for (int64_t l = spec_.n_layer - 1; l >= 0; --l) {
    if (recompute_) STRATA_RETURN_IF_ERROR(ForwardBlock(l, true, hooks));
    STRATA_RETURN_IF_ERROR(BackwardMlp(l, hooks));
    STRATA_RETURN_IF_ERROR(BackwardAttn(l, hooks));
  }
  STRATA_RETURN_IF_ERROR(BackwardEmbed(tokens, hooks));
  return loss;
}

// --- hooks, with the checks of what they hand out ------------------------------------

namespace {

Status CheckParams(const ModuleParams& p, const ModuleDecl& m, const char* hook) {
  if (p.dtype != DType::kF32 && p.dtype != DType::kBf16 && p.dtype != DType::kFp16) {
    return InvalidArgumentError("GPT: " + std::string(hook) + " of module " + m.name + " handed out " +
                                std::string(DTypeName(p.dtype)) +
                                " parameters; the GPT's kernels read fp32, bf16 or fp16");
  }
  const bool all =
      std::all_of(p.tensors.begin(), p.tensors.end(), [](const void* t) { return t != nullptr; });
  if (p.tensors.size() != m.tensors.size() || !all) {
    return InvalidArgumentError("GPT: " + std::string(hook) + " of module " + m.name + " must hand out " +
                                std::to_string(m.tensors.size()) + " non-null tensors, got " +
                                std::to_string(p.tensors.size()));
  }
  return OkStatus();
}

}  // namespace

Result<ModuleParams> Gpt::FetchModule(ModuleHooks& hooks, int module) {
  const ModuleDecl& m = model_.modules[module];
  Result<ModuleParams> p = hooks.Fetch(module);
  if (!p.ok()) return p.status().WithContext("Fetch of GPT module " + m.name);
  STRATA_RETURN_IF_ERROR(CheckParams(*p, m, "Fetch"));
  return p;
}

const float* Gpt::Wide(const ModuleParams& p, size_t i, int64_t n, int slot) {
  if (p.dtype == DType::kF32) return static_cast<const float*>(p.tensors[i]);
  Grow(wide_[slot], n);
  ToFloat(p.tensors[i], p.dtype, n, wide_[slot].data());
  return wide_[slot].data();
}

Status Gpt::ReleaseModule(ModuleHooks& hooks, int module) {
  Status s = hooks.Release(module);
  return s.ok() ? s : s.WithContext("Release of GPT module " + model_.modules[module].name);
}

Result<ModuleBackward> Gpt::BeginModule(ModuleHooks& hooks, int module) {
  const ModuleDecl& m = model_.modules[module];
  Result<ModuleBackward> bw = hooks.BeginBackward(module);
  if (!bw.ok()) return bw.status().WithContext("BeginBackward of GPT module " + m.name);
  STRATA_RETURN_IF_ERROR(CheckParams(bw->params, m, "BeginBackward"));
  const ModuleGrads& g = bw->grads;
  const bool all =
      std::all_of(g.tensors.begin(), g.tensors.end(), [](const float* t) { return t != nullptr; });
  if (g.tensors.size() != m.tensors.size() || g.accumulate.size() != m.tensors.size() || !all) {
    return InvalidArgumentError(
        "GPT: BeginBackward of module " + m.name + " must hand out " + std::to_string(m.tensors.size()) +
        " non-null gradients and as many accumulate flags, got " + std::to_string(g.tensors.size()) +
        " and " + std::to_string(g.accumulate.size()));
  }
  return bw;
}

Status Gpt::EndModule(ModuleHooks& hooks, int module) {
  Status s = hooks.EndBackward(module);
  return s.ok() ? s : s.WithContext("EndBackward of GPT module " + model_.modules[module].name);
}

// --- forward -------------------------------------------------------------------------

Status Gpt::ForwardEmbed(const int32_t* tokens, ModuleHooks& hooks) {
  STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, GptEmbedModule()));
  const int64_t c = spec_.n_embd;
  // Only the sequence's rows of wpe are read.
  EmbeddingForward(tokens, Wide(p, 0, spec_.vocab_size * c, 0), Wide(p, 1, seq_ * c, 1), batch_, seq_, c,
                   spec_.vocab_size, block_in(0));
  return ReleaseModule(hooks, GptEmbedModule());
}

Status Gpt::ForwardBlock(int64_t layer, bool recomputing, ModuleHooks& hooks) {
  const int64_t n = rows_, c = spec_.n_embd;
  BlockActs& a = acts(layer);
  const float* in = block_in(layer);
  {
    STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, GptAttnModule(layer)));
    const auto& t = p.tensors;
    LayerNormForward(in, Wide(p, 0, c, 0), Wide(p, 1, c, 1), n, c, a.ln1.data(), a.ln1_mean.data(),
                     a.ln1_rstd.data());
    LinearForward(a.ln1.data(), n, c, 3 * c, t[2], t[3], p.dtype, a.qkv.data());
    AttentionForward(a.qkv.data(), batch_, seq_, c, spec_.n_head, a.atty.data(), a.att.data());
    LinearForward(a.atty.data(), n, c, c, t[4], t[5], p.dtype, a.res2.data());
    AddInPlace(a.res2.data(), in, n * c);
    STRATA_RETURN_IF_ERROR(ReleaseModule(hooks, GptAttnModule(layer)));
  }
  STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, GptMlpModule(layer)));
  const auto& t = p.tensors;
  LayerNormForward(a.res2.data(), Wide(p, 0, c, 0), Wide(p, 1, c, 1), n, c, a.ln2.data(), a.ln2_mean.data(),
                   a.ln2_rstd.data());
  LinearForward(a.ln2.data(), n, c, 4 * c, t[2], t[3], p.dtype, a.fc.data());
  GeluForward(a.fc.data(), n * 4 * c, a.fc_gelu.data(), GeluTanh::kVector);
  if (!recomputing) {
    float* out = block_in(layer + 1);
    LinearForward(a.fc_gelu.data(), n, 4 * c, c, t[4], t[5], p.dtype, out);
    AddInPlace(out, a.res2.data(), n * c);
  }
  return ReleaseModule(hooks, GptMlpModule(layer));
}

Status Gpt::ForwardHead(ModuleHooks& hooks) {
  const int head = GptHeadModule(spec_);
  STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, head));
  const int64_t c = spec_.n_embd;
  LayerNormForward(block_in(spec_.n_layer), Wide(p, 0, c, 0), Wide(p, 1, c, 1), rows_, c, lnf_.data(),
                   lnf_mean_.data(), lnf_rstd_.data());
  // zero_bias_ holds vocab_size zero floats, so it also reads as zeros in a 16-bit dtype.
  LinearForward(lnf_.data(), rows_, c, spec_.vocab_size, p.tensors[2], zero_bias_.data(), p.dtype,
                logits_.data());
  return ReleaseModule(hooks, head);
}

// --- backward: dres_ carries d loss / d (the residual stream) down the blocks ----------

Status Gpt::BackwardHead(ModuleHooks& hooks) {
  const int head = GptHeadModule(spec_);
  const int64_t n = rows_, c = spec_.n_embd;
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, head));
  const auto& p = bw.params.tensors;
  const ModuleGrads& g = bw.grads;
  // The head has no bias: LinearBackward's bias gradient goes to scratch.
  LinearBackward(lnf_.data(), logits_.data(), n, c, spec_.vocab_size, p[2], bw.params.dtype, dtmp_.data(),
                 g.tensors[2], dbias_scratch_.data(), g.accumulate[2] != 0);
  LayerNormBackward(block_in(spec_.n_layer), dtmp_.data(), Wide(bw.params, 0, c, 0), lnf_mean_.data(),
                    lnf_rstd_.data(), n, c, dres_.data(), g.tensors[0], g.tensors[1],
                    PairAccumulate(g, 0, c, 1, c));
  return EndModule(hooks, head);
}

Status Gpt::BackwardMlp(int64_t layer, ModuleHooks& hooks) {
  const int64_t n = rows_, c = spec_.n_embd;
  BlockActs& a = acts(layer);
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, GptMlpModule(layer)));
  const auto& p = bw.params.tensors;
  const ModuleGrads& g = bw.grads;
  LinearBackward(a.fc_gelu.data(), dres_.data(), n, 4 * c, c, p[4], bw.params.dtype, dwide_.data(),
                 g.tensors[4], g.tensors[5], PairAccumulate(g, 4, c * 4 * c, 5, c));
  GeluBackward(a.fc.data(), dwide_.data(), n * 4 * c, dwide_.data(), GeluTanh::kVector);
  LinearBackward(a.ln2.data(), dwide_.data(), n, c, 4 * c, p[2], bw.params.dtype, dtmp_.data(), g.tensors[2],
                 g.tensors[3], PairAccumulate(g, 2, 4 * c * c, 3, 4 * c));
  LayerNormBackward(a.res2.data(), dtmp_.data(), Wide(bw.params, 0, c, 0), a.ln2_mean.data(),
                    a.ln2_rstd.data(), n, c, dtmp_.data(), g.tensors[0], g.tensors[1],
                    PairAccumulate(g, 0, c, 1, c));
  AddInPlace(dres_.data(), dtmp_.data(), n * c);
  return EndModule(hooks, GptMlpModule(layer));
}

Status Gpt::BackwardAttn(int64_t layer, ModuleHooks& hooks) {
  const int64_t n = rows_, c = spec_.n_embd;
  BlockActs& a = acts(layer);
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, GptAttnModule(layer)));
  const auto& p = bw.params.tensors;
  const ModuleGrads& g = bw.grads;
  LinearBackward(a.atty.data(), dres_.data(), n, c, c, p[4], bw.params.dtype, dtmp_.data(), g.tensors[4],
                 g.tensors[5], PairAccumulate(g, 4, c * c, 5, c));
  AttentionBackward(a.qkv.data(), a.att.data(), dtmp_.data(), batch_, seq_, c, spec_.n_head, dqkv_.data());
  LinearBackward(a.ln1.data(), dqkv_.data(), n, c, 3 * c, p[2], bw.params.dtype, dtmp_.data(), g.tensors[2],
                 g.tensors[3], PairAccumulate(g, 2, 3 * c * c, 3, 3 * c));
  LayerNormBackward(block_in(layer), dtmp_.data(), Wide(bw.params, 0, c, 0), a.ln1_mean.data(),
                    a.ln1_rstd.data(), n, c, dtmp_.data(), g.tensors[0], g.tensors[1],
                    PairAccumulate(g, 0, c, 1, c));
  AddInPlace(dres_.data(), dtmp_.data(), n * c);
  return EndModule(hooks, GptAttnModule(layer));
}

Status Gpt::BackwardEmbed(const int32_t* tokens, ModuleHooks& hooks) {
  const int64_t c = spec_.n_embd;
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, GptEmbedModule()));
  const ModuleGrads& g = bw.grads;
  // The kernel leaves wpe's rows past the sequence alone; overwriting means they get zero.
  if (!g.accumulate[1]) std::fill(g.tensors[1] + seq_ * c, g.tensors[1] + spec_.block_size * c, 0.0f);
  EmbeddingBackward(tokens, dres_.data(), batch_, seq_, c, spec_.vocab_size, g.tensors[0], g.tensors[1],
                    g.accumulate[0] != 0, g.accumulate[1] != 0);
  return EndModule(hooks, GptEmbedModule());
}

}  // namespace strata::model
