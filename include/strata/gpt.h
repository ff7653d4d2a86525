// The GPT model driver: a GPT-2 style decoder-only transformer (gpt_kernels.h) declared to
// the engine as tensors and modules (module_hooks.h), with its deterministic
// initialisation, and the forward, loss and backward of one micro-batch through any
// ModuleHooks (the engine, or a dense store in tests).
//
// Contract:
//  - Model (scripts/gpt_golden.py has the same one in PyTorch): token and learned position
//    embeddings; n_layer pre-LayerNorm blocks x = x + proj(attn(ln1(x))),
//    x = x + mlp.proj(gelu(mlp.fc(ln2(x)))) with causal multi-head attention and a 4x MLP;
//    a final LayerNorm lnf; logits = lnf(x) W^T with W the token embedding (tied_head) or a
//    tensor of its own, "lm_head.weight" [V, C]; mean cross-entropy through the normaliser.
//  - Tensors (GptModel), by id: 0 "wte" [V, C], 1 "wpe" [block_size, C], then 12 per block
//    l (GptBlockTensorId, names "h<l>.ln1.weight" ...), then "lnf.weight", "lnf.bias" and,
//    untied only, "lm_head.weight". Linear weights are [out, in]. This is the golden file's
//    order (tests/model/tiny_gpt.h), so its flat parameters map onto the ids one to one.
//  - Modules, in forward order: 0 "embed" {wte, wpe}; per block l, 1 + 2l "h<l>.attn" {ln1,
//    attn.qkv, attn.proj: weight, bias each} and 2 + 2l "h<l>.mlp" {ln2, mlp.fc, mlp.proj};
//    last "head" {lnf.weight, lnf.bias, head weight}. Tied, the head lists wte's id: the
//    engine makes that one parameter, and the model adds both uses' gradients as the
//    accumulate flags say (module_hooks.h).
//  - Calls of ForwardBackward, with L blocks and head module H = 1 + 2L:
//        for m in 0..H:  Fetch(m) -> compute -> Release(m)
//        loss
//        BeginBackward(H) .. EndBackward(H)
//        for l in L-1..0:  [recompute: Fetch/Release(1 + 2l), Fetch/Release(2 + 2l)]
//                          BeginBackward(2 + 2l) .. EndBackward, BeginBackward(1 + 2l) .. EndBackward
//        BeginBackward(0) .. EndBackward(0)
//    Pointers are used only until the matching Release / EndBackward. Every gradient a
//    BeginBackward hands out is written (overwritten or added to, by its flag) before the
//    matching EndBackward, including wpe's rows past the batch's sequence length (zero).
//  - Activation checkpointing (set_recompute): the forward keeps only each block's input,
//    and the backward runs each block's forward again (through the hooks, as above) just
//    before its backward. The kernels are deterministic, so this changes no bit of the
//    loss or of any gradient; it saves the blocks' inner activations (activation_floats).
//  - Parameters in fp32, bf16 or fp16 (the hooks' ModuleParams::dtype): the linear layers
//    (qkv, projections, MLP, LM head) read 16-bit weights as they are, and the other
//    kernels (embeddings, LayerNorms) read them widened to fp32 in a scratch of the
//    driver's; every activation, every accumulation and every gradient is fp32. So a
//    16-bit pass computes exactly what the fp32 pass computes with the weights rounded to
//    16 bits, bit for bit, as the MLP does (mlp_kernels.h).
//  - Backends: kCpu runs gpt_kernels.h on oneTBB threads; the hooks' pointers are host
//    memory. kCuda runs gpt_cuda.h and mlp_cuda.h on the driver's stream; the hooks'
//    pointers are device memory, ready for work enqueued on that stream (the engine's
//    compute stream). The batch is copied to the device, the loss read back (so the
//    forward has run when it comes), and ForwardBackward synchronizes the stream before
//    returning. CUDA's results are within a tolerance of the CPU's (gpt_cuda.h), not
//    bit-identical; each is deterministic on its own.
//  - The driver owns its activation workspace, in the backend's memory: grown to the
//    largest (batch, seq) seen, reused afterwards. One driver is used by one thread at a
//    time.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::model {

using ::strata::Backend;

struct GptSpec {
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // the longest sequence (rows of wpe)
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_embd = 0;  // a multiple of n_head
  bool tied_head = true;
  uint64_t seed = 0;  // parameter initialisation seed
};

// InvalidArgument naming the first bad field: vocab_size < 2 or >= 2^31 (token ids are
// int32), any other size < 1, or n_embd not a multiple of n_head.
Status ValidateSpec(const GptSpec& spec);

// Tensor i of a block, in the order of its ids (GptBlockTensorId).
enum class GptBlockTensor {
  kLn1Weight,
  kLn1Bias,
  kQkvWeight,
  kQkvBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kMlpProjWeight,
  kMlpProjBias,
};
inline constexpr int kGptTensorsPerBlock = 12;
inline constexpr TensorId kGptWte = 0, kGptWpe = 1;
inline TensorId GptBlockTensorId(int64_t layer, GptBlockTensor t) {
  return static_cast<TensorId>(2 + kGptTensorsPerBlock * layer + static_cast<int64_t>(t));
}
inline TensorId GptLnfWeightId(const GptSpec& s) {
  return static_cast<TensorId>(2 + kGptTensorsPerBlock * s.n_layer);
}
inline TensorId GptLnfBiasId(const GptSpec& s) { return GptLnfWeightId(s) + 1; }
// The weight the LM head reads: wte when tied, else "lm_head.weight".
inline TensorId GptHeadWeightId(const GptSpec& s) { return s.tied_head ? kGptWte : GptLnfWeightId(s) + 2; }

inline int GptEmbedModule() { return 0; }
inline int GptAttnModule(int64_t layer) { return static_cast<int>(1 + 2 * layer); }
inline int GptMlpModule(int64_t layer) { return static_cast<int>(2 + 2 * layer); }
inline int GptHeadModule(const GptSpec& s) { return static_cast<int>(1 + 2 * s.n_layer); }

// The model as the engine sees it (see the contract). Requires a valid spec.
ModelDecl GptModel(const GptSpec& spec);
// Real parameters: a tied head counts wte once.
int64_t GptParameterCount(const GptSpec& spec);
// Model flops of one training sequence of `seq` tokens (forward and backward), as MFU
// counts them (PaLM's appendix B): 6 per parameter per token, and attention's two
// products per block (QK^T and AV: 2 x seq^2 x n_embd each forward, twice that backward).
// Recomputed activations are not model flops.
double GptFlopsPerSequence(const GptSpec& spec, int64_t seq);

// Writes elements [begin, begin + count) of tensor `tensor` (its GptModel id), GPT-2's
// initialisation: weights and embeddings ~ N(0, 0.02), the two residual projections of
// each block (attn.proj.weight, mlp.proj.weight) ~ N(0, 0.02 / sqrt(2 n_layer)), linear
// biases 0, LayerNorm weights 1 and biases 0. Element i is a pure function of (seed,
// tensor, i), so any slice on any rank gets the single-rank values: the engine's
// ParamInit. Requires a valid spec and a tensor of the model.
void InitGptTensor(const GptSpec& spec, TensorId tensor, int64_t begin, int64_t count, float* out);

class GptOps;  // the backend's kernels (src/model/gpt_ops.h)

class Gpt {
 public:
  // Requires ValidateSpec(spec).ok(). For kCuda, `stream` is the cudaStream_t to use
  // (nullptr: the default stream); without a usable GPU, or in a build without CUDA, the
  // passes return Unavailable.
  explicit Gpt(GptSpec spec, Backend backend = Backend::kCpu, void* stream = nullptr);
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptSpec& spec() const { return spec_; }
  const ModelDecl& modules() const { return model_; }

  // Activation checkpointing of every block (see the contract); may change between passes.
  void set_recompute(bool recompute) { recompute_ = recompute; }
  bool recompute() const { return recompute_; }

  // One micro-batch: tokens and targets [batch, seq] in [0, vocab_size) (host memory, on
  // either backend), 1 <= seq <= block_size. Forward, loss (summed over the batch's tokens
  // and divided by `normaliser`, normally the global batch's token count), backward.
  // Returns the loss term. InvalidArgument for a bad batch (nothing called); a hook's or a
  // kernel's error, with the module named, stops the pass (gradients may then be partly
  // written).
  Result<double> ForwardBackward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                                 double normaliser, ModuleHooks& hooks);
  // Forward and loss only (Fetch/Release, no backward hooks).
  Result<double> Forward(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                         double normaliser, ModuleHooks& hooks);

  // Copies rows [first_row, first_row + rows) of the latest Forward's logits [batch * seq,
  // vocab_size] to host memory `out` (after ForwardBackward the buffer holds their gradient
  // instead). InvalidArgument for rows outside the latest pass.
  Status CopyLogits(int64_t first_row, int64_t rows, float* out) const;
  // Floats of activation workspace held now (grows with the largest batch; recompute
  // keeps one block's inner activations instead of every block's).
  int64_t activation_floats() const;

 private:
  struct Workspace;

  Result<double> Run(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                     double normaliser, ModuleHooks& hooks, bool backward);
  Result<double> RunPass(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                         double normaliser, ModuleHooks& hooks, bool backward);
  Status CheckBatch(const int32_t* tokens, const int32_t* targets, int64_t batch, int64_t seq,
                    double normaliser) const;
  Status EnsureWorkspace(int64_t batch, int64_t seq);
  float* BlockIn(int64_t layer) const;  // block l's input; the last block's output at L

  Result<ModuleParams> FetchModule(ModuleHooks& hooks, int module);
  Status ReleaseModule(ModuleHooks& hooks, int module);
  Result<ModuleBackward> BeginModule(ModuleHooks& hooks, int module);
  Status EndModule(ModuleHooks& hooks, int module);

  Status ForwardEmbed(ModuleHooks& hooks);
  // Recomputing skips the block's last projection: its output is not needed again.
  Status ForwardBlock(int64_t layer, bool recomputing, ModuleHooks& hooks);
  Status ForwardHead(ModuleHooks& hooks);
  Status BackwardHead(ModuleHooks& hooks);
  Status BackwardMlp(int64_t layer, ModuleHooks& hooks);
  Status BackwardAttn(int64_t layer, ModuleHooks& hooks);
  Status BackwardEmbed(ModuleHooks& hooks);

  GptSpec spec_;
  Backend backend_;
  ModelDecl model_;
  std::unique_ptr<GptOps> ops_;
  Status ops_status_;  // why there are no ops (the CUDA backend without a GPU)
  bool recompute_ = false;
  int64_t batch_ = 0, seq_ = 0, rows_ = 0;  // the current pass's shape (rows = batch * seq)
  std::unique_ptr<Workspace> ws_;
};

}  // namespace strata::model
