// The GPT driver: forward, loss and backward of one micro-batch through the hooks, with
// optional activation checkpointing of the blocks, on the backend's kernels (gpt_ops.h).
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/gpt_ops.h"
#include "strata/gpt.h"

namespace strata::model {

// The activations and scratch of a pass, in the backend's memory.
struct Gpt::Workspace {
  // One block's inner activations (its input lives in block_in).
  struct BlockActs {
    GptBuffer ln1, ln1_mean, ln1_rstd, qkv, att, atty, res2, ln2, ln2_mean, ln2_rstd, fc, fc_gelu;
  };
  // block_in: the input of block l at l * rows * C, the last block's output at L.
  GptBuffer block_in, lnf, lnf_mean, lnf_rstd, logits, dres, dtmp, dwide, dqkv;
  std::vector<BlockActs> blocks;  // one per block, or one shared when recomputing
  // Not activations: the head's zero bias (vocab_size zero floats, which also read as zeros
  // in a 16-bit dtype) and its bias gradient's sink, and the batch's ids.
  GptBuffer zero_bias, dbias_scratch, tokens, targets;
};

namespace {

// The kernels take one flag for a weight and its bias, the hooks one per tensor: when they
// differ, the tensor to overwrite is zeroed first and both are added to.
Result<bool> PairAccumulate(GptOps& ops, const ModuleGrads& g, size_t a, int64_t a_size, size_t b,
                            int64_t b_size) {
  if (g.accumulate[a] == g.accumulate[b]) return g.accumulate[a] != 0;
  if (!g.accumulate[a]) STRATA_RETURN_IF_ERROR(ops.Zero(g.tensors[a], a_size));
  if (!g.accumulate[b]) STRATA_RETURN_IF_ERROR(ops.Zero(g.tensors[b], b_size));
  return true;
}

}  // namespace

Gpt::Gpt(GptSpec spec, Backend backend, void* stream)
    : spec_(std::move(spec)), backend_(backend), ws_(std::make_unique<Workspace>()) {
  STRATA_CHECK_MSG(ValidateSpec(spec_).ok(), ValidateSpec(spec_).message());
  model_ = GptModel(spec_);
  if (backend_ == Backend::kCpu) {
    ops_ = CreateCpuGptOps();
  } else {
    Result<std::unique_ptr<GptOps>> ops = CreateCudaGptOps(stream);
    if (ops.ok()) {
      ops_ = std::move(*ops);
    } else {
      ops_status_ = ops.status().WithContext("GPT on the CUDA backend");
    }
  }
}

Gpt::~Gpt() = default;

Result<double> Gpt::ForwardBackward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                    double normaliser, ModuleHooks& hooks) {
  return Run(tokens, targets, batch, seq, normaliser, hooks, true);
}

Result<double> Gpt::Forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                            double normaliser, ModuleHooks& hooks) {
  return Run(tokens, targets, batch, seq, normaliser, hooks, false);
}

Status Gpt::CopyLogits(int64_t first_row, int64_t rows, float* out) const {
  STRATA_RETURN_IF_ERROR(ops_status_);
  if (first_row < 0 || rows < 0 || first_row + rows > rows_ || (rows > 0 && out == nullptr)) {
    return InvalidArgumentError("GPT: logits rows [" + std::to_string(first_row) + ", " +
                                std::to_string(first_row + rows) + ") are not in the latest pass's " +
                                std::to_string(rows_) + " rows");
  }
  const int64_t v = spec_.vocab_size;
  return ops_->Download(out, ws_->logits.f() + first_row * v, rows * v * static_cast<int64_t>(sizeof(float)));
}

int64_t Gpt::activation_floats() const {
  const Workspace& w = *ws_;
  int64_t bytes = 0;
  for (const GptBuffer* b :
       {&w.block_in, &w.lnf, &w.lnf_mean, &w.lnf_rstd, &w.logits, &w.dres, &w.dtmp, &w.dwide, &w.dqkv}) {
    bytes += b->bytes();
  }
  for (const Workspace::BlockActs& a : w.blocks) {
    for (const GptBuffer* b : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.res2, &a.ln2,
                               &a.ln2_mean, &a.ln2_rstd, &a.fc, &a.fc_gelu}) {
      bytes += b->bytes();
    }
  }
  return bytes / static_cast<int64_t>(sizeof(float));
}

Status Gpt::CheckBatch(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                       double normaliser) const {
  STRATA_RETURN_IF_ERROR(ops_status_);
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

Status Gpt::EnsureWorkspace(int64_t batch, int64_t seq) {
  // No pass's rows are valid until the workspace holds this one's.
  batch_ = seq_ = rows_ = 0;
  const int64_t n = batch * seq, c = spec_.n_embd, v = spec_.vocab_size;
  GptOps& ops = *ops_;
  Workspace& w = *ws_;
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.block_in, (spec_.n_layer + 1) * n * c));
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.lnf, n * c));
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.lnf_mean, n));
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.lnf_rstd, n));
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.logits, n * v));
  // Dropping the blocks that recompute no longer keeps is what saves the memory.
  w.blocks.resize(recompute_ ? 1 : static_cast<size_t>(spec_.n_layer));
  for (Workspace::BlockActs& a : w.blocks) {
    for (GptBuffer* b : {&a.ln1, &a.atty, &a.res2, &a.ln2}) STRATA_RETURN_IF_ERROR(ops.GrowFloats(*b, n * c));
    for (GptBuffer* b : {&a.ln1_mean, &a.ln1_rstd, &a.ln2_mean, &a.ln2_rstd}) {
      STRATA_RETURN_IF_ERROR(ops.GrowFloats(*b, n));
    }
    STRATA_RETURN_IF_ERROR(ops.GrowFloats(a.qkv, n * 3 * c));
    STRATA_RETURN_IF_ERROR(ops.GrowFloats(a.att, batch * spec_.n_head * seq * seq));
    STRATA_RETURN_IF_ERROR(ops.GrowFloats(a.fc, n * 4 * c));
    STRATA_RETURN_IF_ERROR(ops.GrowFloats(a.fc_gelu, n * 4 * c));
  }
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.dres, n * c));
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.dtmp, n * c));
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.dwide, n * 4 * c));
  STRATA_RETURN_IF_ERROR(ops.GrowFloats(w.dqkv, n * 3 * c));
  // Zeroed once: the head's bias, and its gradient's sink (which the head's flag may add to).
  for (GptBuffer* b : {&w.zero_bias, &w.dbias_scratch}) {
    if (b->bytes() > 0) continue;
    STRATA_RETURN_IF_ERROR(ops.GrowFloats(*b, v));
    STRATA_RETURN_IF_ERROR(ops.Zero(b->f(), v));
  }
  STRATA_RETURN_IF_ERROR(ops.Grow(w.tokens, n * static_cast<int64_t>(sizeof(int32_t))));
  STRATA_RETURN_IF_ERROR(ops.Grow(w.targets, n * static_cast<int64_t>(sizeof(int32_t))));
  batch_ = batch;
  seq_ = seq;
  rows_ = n;
  return OkStatus();
}

Result<double> Gpt::Run(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                        double normaliser, ModuleHooks& hooks, bool backward) {
  STRATA_RETURN_IF_ERROR(CheckBatch(tokens, targets, batch, seq, normaliser));
  Result<double> loss = RunPass(tokens, targets, batch, seq, normaliser, hooks, backward);
  if (!loss.ok()) {
    // Kernels a failed pass left queued may still read the hooks' buffers, which the
    // caller frees or reuses once it has the error: let them finish first.
    ops_->Finish().IgnoreError();
  }
  return loss;
}

Result<double> Gpt::RunPass(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                            double normaliser, ModuleHooks& hooks, bool backward) {
  STRATA_RETURN_IF_ERROR(EnsureWorkspace(batch, seq));
  Workspace& w = *ws_;
  const int64_t id_bytes = rows_ * static_cast<int64_t>(sizeof(int32_t));
  STRATA_RETURN_IF_ERROR(ops_->Upload(w.tokens.i32(), tokens, id_bytes));
  STRATA_RETURN_IF_ERROR(ops_->Upload(w.targets.i32(), targets, id_bytes));
  STRATA_RETURN_IF_ERROR(ForwardEmbed(hooks));
  for (int64_t l = 0; l < spec_.n_layer; ++l) STRATA_RETURN_IF_ERROR(ForwardBlock(l, false, hooks));
  STRATA_RETURN_IF_ERROR(ForwardHead(hooks));
  // The logits' gradient overwrites them: the largest activation is held once.
  STRATA_ASSIGN_OR_RETURN(const double loss,
                          ops_->CrossEntropy(w.logits.f(), w.targets.i32(), rows_, spec_.vocab_size,
                                             normaliser, backward ? w.logits.f() : nullptr));
  if (!backward) return loss;
  STRATA_RETURN_IF_ERROR(BackwardHead(hooks));
  for (int64_t l = spec_.n_layer - 1; l >= 0; --l) {
    if (recompute_) STRATA_RETURN_IF_ERROR(ForwardBlock(l, true, hooks));
    STRATA_RETURN_IF_ERROR(BackwardMlp(l, hooks));
    STRATA_RETURN_IF_ERROR(BackwardAttn(l, hooks));
  }
  STRATA_RETURN_IF_ERROR(BackwardEmbed(hooks));
  STRATA_RETURN_IF_ERROR(ops_->Finish());
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

float* Gpt::BlockIn(int64_t layer) const { return ws_->block_in.f() + layer * rows_ * spec_.n_embd; }

Status Gpt::ForwardEmbed(ModuleHooks& hooks) {
  STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, GptEmbedModule()));
  STRATA_RETURN_IF_ERROR(ops_->EmbeddingForward(ws_->tokens.i32(), p.tensors[0], p.tensors[1], p.dtype,
                                                batch_, seq_, spec_.n_embd, spec_.vocab_size, BlockIn(0)));
  return ReleaseModule(hooks, GptEmbedModule());
}

Status Gpt::ForwardBlock(int64_t layer, bool recomputing, ModuleHooks& hooks) {
  const int64_t n = rows_, c = spec_.n_embd;
  GptOps& ops = *ops_;
  Workspace::BlockActs& a = ws_->blocks[recompute_ ? 0 : layer];
  const float* in = BlockIn(layer);
  {
    STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, GptAttnModule(layer)));
    const auto& t = p.tensors;
    STRATA_RETURN_IF_ERROR(
        ops.LayerNormForward(in, t[0], t[1], p.dtype, n, c, a.ln1.f(), a.ln1_mean.f(), a.ln1_rstd.f()));
    STRATA_RETURN_IF_ERROR(ops.LinearForward(a.ln1.f(), n, c, 3 * c, t[2], t[3], p.dtype, a.qkv.f()));
    STRATA_RETURN_IF_ERROR(
        ops.AttentionForward(a.qkv.f(), batch_, seq_, c, spec_.n_head, a.atty.f(), a.att.f()));
    STRATA_RETURN_IF_ERROR(ops.LinearForward(a.atty.f(), n, c, c, t[4], t[5], p.dtype, a.res2.f()));
    STRATA_RETURN_IF_ERROR(ops.Add(a.res2.f(), in, n * c));
    STRATA_RETURN_IF_ERROR(ReleaseModule(hooks, GptAttnModule(layer)));
  }
  STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, GptMlpModule(layer)));
  const auto& t = p.tensors;
  STRATA_RETURN_IF_ERROR(
      ops.LayerNormForward(a.res2.f(), t[0], t[1], p.dtype, n, c, a.ln2.f(), a.ln2_mean.f(), a.ln2_rstd.f()));
  STRATA_RETURN_IF_ERROR(ops.LinearForward(a.ln2.f(), n, c, 4 * c, t[2], t[3], p.dtype, a.fc.f()));
  STRATA_RETURN_IF_ERROR(ops.GeluForward(a.fc.f(), n * 4 * c, a.fc_gelu.f()));
  if (!recomputing) {
    float* out = BlockIn(layer + 1);
    STRATA_RETURN_IF_ERROR(ops.LinearForward(a.fc_gelu.f(), n, 4 * c, c, t[4], t[5], p.dtype, out));
    STRATA_RETURN_IF_ERROR(ops.Add(out, a.res2.f(), n * c));
  }
  return ReleaseModule(hooks, GptMlpModule(layer));
}

Status Gpt::ForwardHead(ModuleHooks& hooks) {
  const int head = GptHeadModule(spec_);
  Workspace& w = *ws_;
  STRATA_ASSIGN_OR_RETURN(ModuleParams p, FetchModule(hooks, head));
  const int64_t c = spec_.n_embd;
  STRATA_RETURN_IF_ERROR(ops_->LayerNormForward(BlockIn(spec_.n_layer), p.tensors[0], p.tensors[1], p.dtype,
                                                rows_, c, w.lnf.f(), w.lnf_mean.f(), w.lnf_rstd.f()));
  STRATA_RETURN_IF_ERROR(ops_->LinearForward(w.lnf.f(), rows_, c, spec_.vocab_size, p.tensors[2],
                                             w.zero_bias.f(), p.dtype, w.logits.f()));
  return ReleaseModule(hooks, head);
}

// --- backward: dres carries d loss / d (the residual stream) down the blocks -----------

Status Gpt::BackwardHead(ModuleHooks& hooks) {
  const int head = GptHeadModule(spec_);
  const int64_t n = rows_, c = spec_.n_embd;
  Workspace& w = *ws_;
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, head));
  const auto& p = bw.params.tensors;
  const ModuleGrads& g = bw.grads;
  // The head has no bias: LinearBackward's bias gradient goes to scratch.
  STRATA_RETURN_IF_ERROR(ops_->LinearBackward(w.lnf.f(), w.logits.f(), n, c, spec_.vocab_size, p[2],
                                              bw.params.dtype, w.dtmp.f(), g.tensors[2], w.dbias_scratch.f(),
                                              g.accumulate[2] != 0));
  STRATA_ASSIGN_OR_RETURN(const bool acc, PairAccumulate(*ops_, g, 0, c, 1, c));
  STRATA_RETURN_IF_ERROR(ops_->LayerNormBackward(BlockIn(spec_.n_layer), w.dtmp.f(), p[0], bw.params.dtype,
                                                 w.lnf_mean.f(), w.lnf_rstd.f(), n, c, w.dres.f(),
                                                 g.tensors[0], g.tensors[1], acc));
  return EndModule(hooks, head);
}

Status Gpt::BackwardMlp(int64_t layer, ModuleHooks& hooks) {
  const int64_t n = rows_, c = spec_.n_embd;
  GptOps& ops = *ops_;
  Workspace& w = *ws_;
  Workspace::BlockActs& a = w.blocks[recompute_ ? 0 : layer];
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, GptMlpModule(layer)));
  const auto& p = bw.params.tensors;
  const DType dtype = bw.params.dtype;
  const ModuleGrads& g = bw.grads;
  STRATA_ASSIGN_OR_RETURN(const bool acc_proj, PairAccumulate(ops, g, 4, c * 4 * c, 5, c));
  STRATA_RETURN_IF_ERROR(ops.LinearBackward(a.fc_gelu.f(), w.dres.f(), n, 4 * c, c, p[4], dtype, w.dwide.f(),
                                            g.tensors[4], g.tensors[5], acc_proj));
  STRATA_RETURN_IF_ERROR(ops.GeluBackward(a.fc.f(), w.dwide.f(), n * 4 * c, w.dwide.f()));
  STRATA_ASSIGN_OR_RETURN(const bool acc_fc, PairAccumulate(ops, g, 2, 4 * c * c, 3, 4 * c));
  STRATA_RETURN_IF_ERROR(ops.LinearBackward(a.ln2.f(), w.dwide.f(), n, c, 4 * c, p[2], dtype, w.dtmp.f(),
                                            g.tensors[2], g.tensors[3], acc_fc));
  STRATA_ASSIGN_OR_RETURN(const bool acc_ln, PairAccumulate(ops, g, 0, c, 1, c));
  STRATA_RETURN_IF_ERROR(ops.LayerNormBackward(a.res2.f(), w.dtmp.f(), p[0], dtype, a.ln2_mean.f(),
                                               a.ln2_rstd.f(), n, c, w.dtmp.f(), g.tensors[0], g.tensors[1],
                                               acc_ln));
  STRATA_RETURN_IF_ERROR(ops.Add(w.dres.f(), w.dtmp.f(), n * c));
  return EndModule(hooks, GptMlpModule(layer));
}

Status Gpt::BackwardAttn(int64_t layer, ModuleHooks& hooks) {
  const int64_t n = rows_, c = spec_.n_embd;
  GptOps& ops = *ops_;
  Workspace& w = *ws_;
  Workspace::BlockActs& a = w.blocks[recompute_ ? 0 : layer];
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, GptAttnModule(layer)));
  const auto& p = bw.params.tensors;
  const DType dtype = bw.params.dtype;
  const ModuleGrads& g = bw.grads;
  STRATA_ASSIGN_OR_RETURN(const bool acc_proj, PairAccumulate(ops, g, 4, c * c, 5, c));
  STRATA_RETURN_IF_ERROR(ops.LinearBackward(a.atty.f(), w.dres.f(), n, c, c, p[4], dtype, w.dtmp.f(),
                                            g.tensors[4], g.tensors[5], acc_proj));
  STRATA_RETURN_IF_ERROR(
      ops.AttentionBackward(a.qkv.f(), a.att.f(), w.dtmp.f(), batch_, seq_, c, spec_.n_head, w.dqkv.f()));
  STRATA_ASSIGN_OR_RETURN(const bool acc_qkv, PairAccumulate(ops, g, 2, 3 * c * c, 3, 3 * c));
  STRATA_RETURN_IF_ERROR(ops.LinearBackward(a.ln1.f(), w.dqkv.f(), n, c, 3 * c, p[2], dtype, w.dtmp.f(),
                                            g.tensors[2], g.tensors[3], acc_qkv));
  STRATA_ASSIGN_OR_RETURN(const bool acc_ln, PairAccumulate(ops, g, 0, c, 1, c));
  STRATA_RETURN_IF_ERROR(ops.LayerNormBackward(BlockIn(layer), w.dtmp.f(), p[0], dtype, a.ln1_mean.f(),
                                               a.ln1_rstd.f(), n, c, w.dtmp.f(), g.tensors[0], g.tensors[1],
                                               acc_ln));
  STRATA_RETURN_IF_ERROR(ops.Add(w.dres.f(), w.dtmp.f(), n * c));
  return EndModule(hooks, GptAttnModule(layer));
}

Status Gpt::BackwardEmbed(ModuleHooks& hooks) {
  const int64_t c = spec_.n_embd;
  STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, BeginModule(hooks, GptEmbedModule()));
  const ModuleGrads& g = bw.grads;
  // The kernel leaves wpe's rows past the sequence alone; overwriting means they get zero.
  if (!g.accumulate[1]) {
    STRATA_RETURN_IF_ERROR(ops_->Zero(g.tensors[1] + seq_ * c, (spec_.block_size - seq_) * c));
  }
  STRATA_RETURN_IF_ERROR(ops_->EmbeddingBackward(ws_->tokens.i32(), ws_->dres.f(), batch_, seq_, c,
                                                 spec_.vocab_size, g.tensors[0], g.tensors[1],
                                                 g.accumulate[0] != 0, g.accumulate[1] != 0));
  return EndModule(hooks, GptEmbedModule());
}

}  // namespace strata::model
