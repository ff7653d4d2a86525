// A tiny model for the tests of the engine's model-agnostic interface (module_hooks.h):
// a chain of Linear (+ GELU) calls over modules that the test declares, so that a tensor
// can be shared by several modules and a module can be called twice, recomputed in the
// backward pass or frozen. The same driver runs against the engine and against
// DenseHooks (every parameter dense in memory), so the two runs differ only in where the
// parameters live and how gradients are summed, which is what the tests compare.
//
// Model: module m lists {weight [out, in], bias [out]} by tensor id (any module may list
// another's ids). A program is the sequence of calls of one forward; every call but the
// last is followed by GELU, the last call's output goes into an MSE loss.
//  - frozen call: no backward hooks, so the call adds no gradient to its tensors. The
//    gradient still flows through it to the earlier calls: the driver Fetches the module
//    again around the dx product (as a frozen layer inside a network is handled), with a
//    scratch buffer for the weight gradient that LinearBackward insists on computing.
//  - recomputed calls (activation checkpointing): a run of consecutive recomputed calls
//    is one checkpointed block. The forward keeps only the block's input and output; its
//    inner activations are overwritten with NaN, so that a backward that skipped the
//    recompute shows as NaN. When the backward reaches the block's last call, the block's
//    forward runs again (Fetch/Release per call, in forward order), then its backward.
//
// Data and init are pure functions of (seed, index), numbered as model.h's BatchSlice, so
// world N with micro-batch B sees exactly the samples of world 1 with micro-batch N * B.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "strata/mlp_kernels.h"
#include "strata/model.h"
#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::testing {

// The width of the data (the first call's input and the last call's output).
inline constexpr int64_t kChainWidth = 32;

struct ChainCall {
  int module = 0;
  bool frozen = false;
  bool recompute = false;
};
using ChainProgram = std::vector<ChainCall>;
// The program of micro-batch `micro` of step `step` (the order may change between them).
using ChainProgramFn = std::function<ChainProgram(int step, int micro)>;

// Plain calls of modules 0 .. n-1 in order.
inline ChainProgram Sequential(int n) {
  ChainProgram p;
  for (int m = 0; m < n; ++m) p.push_back({m});
  return p;
}

// Adds Linear(in -> out) with tensors of its own; returns the module's index.
inline int AddLinear(ModelDecl* model, int64_t in, int64_t out) {
  const int m = static_cast<int>(model->modules.size());
  const TensorId w = static_cast<TensorId>(model->tensors.size());
  const std::string name = "linear" + std::to_string(m);
  model->tensors.push_back({name + ".weight", {out, in}, std::nullopt});
  model->tensors.push_back({name + ".bias", {out}, std::nullopt});
  model->modules.push_back({name, {w, w + 1}});
  return m;
}

// Adds a module over the existing weight `weight` and bias `bias` (-1: a new bias).
inline int AddSharedLinear(ModelDecl* model, TensorId weight, TensorId bias) {
  const int m = static_cast<int>(model->modules.size());
  const std::string name = "linear" + std::to_string(m);
  if (bias < 0) {
    bias = static_cast<TensorId>(model->tensors.size());
    model->tensors.push_back({name + ".bias", {model->tensors[weight].shape[0]}, std::nullopt});
  }
  model->modules.push_back({name, {weight, bias}});
  return m;
}

// Writes elements [begin, begin + count) of a tensor: the engine's ParamInit, named here so
// that the model depends on module_hooks.h only.
using TensorInit = std::function<void(TensorId tensor, int64_t begin, int64_t count, float* out)>;

// PyTorch-like scale: U(-1/sqrt(fan), 1/sqrt(fan)), fan = a weight's input width or a
// bias's length; element i of tensor t is a hash of (seed, t, i).
inline TensorInit ChainInit(const ModelDecl& model, uint64_t seed) {
  std::vector<float> bound;
  for (const TensorDecl& t : model.tensors)
    bound.push_back(1.0f / std::sqrt(static_cast<float>(t.shape.back())));
  return [bound, seed](TensorId t, int64_t begin, int64_t count, float* out) {
    for (int64_t i = 0; i < count; ++i) {
      out[i] =
          bound[t] * model::HashUniform(seed, static_cast<uint64_t>(t) + 1, static_cast<uint64_t>(begin + i));
    }
  };
}

// Samples [first, first + n): x ~ U(-sqrt 3, sqrt 3) (unit variance), and a smooth target
// of x that a few Linear + GELU layers can approach, so that the loss means something.
inline void FillChainBatch(uint64_t seed, int64_t first, int64_t n, std::vector<float>* x,
                           std::vector<float>* y) {
  const int64_t d = kChainWidth;
  x->resize(n * d);
  y->resize(n * d);
  for (int64_t s = 0; s < n; ++s) {
    float* xs = x->data() + s * d;
    for (int64_t i = 0; i < d; ++i) {
      xs[i] = std::sqrt(3.0f) * model::HashUniform(seed, 0, static_cast<uint64_t>((first + s) * d + i));
    }
    for (int64_t j = 0; j < d; ++j) (*y)[s * d + j] = 0.5f * std::sin(2.0f * xs[j]) + 0.25f * xs[(j + 1) % d];
  }
}

// Runs a program's forward, loss and backward through any ModuleHooks (one micro-batch).
class ChainDriver {
 public:
  explicit ChainDriver(const ModelDecl& model) {
    for (const ModuleDecl& m : model.modules) {
      const auto& shape = model.tensors[m.tensors[0]].shape;  // weight [out, in]
      in_.push_back(shape[1]);
      out_.push_back(shape[0]);
      widest_ = std::max({widest_, shape[0], shape[1]});
    }
  }

  // Returns this micro-batch's loss term (the MSE sum divided by `normaliser` * width).
  Result<double> ForwardBackward(const ChainProgram& program, const std::vector<float>& x,
                                 const std::vector<float>& targets, int64_t n, double normaliser,
                                 ModuleHooks& hooks) {
    const int calls = static_cast<int>(program.size());
    if (calls == 0 || in_[program.front().module] != kChainWidth ||
        out_[program.back().module] != kChainWidth) {
      return InvalidArgumentError("chain: the program must map width 32 to width 32");
    }
    n_ = n;
    act_.assign(calls + 1, {});
    pre_.assign(calls, {});
    act_[0] = x;
    for (int c = 0; c < calls; ++c) STRATA_RETURN_IF_ERROR(ForwardCall(program, c, hooks));
    grad_.assign(n * widest_, 0.0f);
    dx_.assign(n * widest_, 0.0f);
    const double loss = model::LossForwardBackward(model::LossKind::kMse, pre_.back().data(), targets.data(),
                                                   nullptr, n, kChainWidth, normaliser, grad_.data());
    PoisonCheckpointedActivations(program);
    for (int c = calls - 1; c >= 0; --c) {
      if (program[c].recompute && (c + 1 == calls || !program[c + 1].recompute)) {
        int first = c;
        while (first > 0 && program[first - 1].recompute) --first;
        for (int r = first; r <= c; ++r) STRATA_RETURN_IF_ERROR(ForwardCall(program, r, hooks));
      }
      STRATA_RETURN_IF_ERROR(BackwardCall(program, c, hooks));
    }
    return loss;
  }

 private:
  static Status CheckPointers(const std::vector<const void*>& p, int m, const char* hook) {
    if (p.size() != 2 || !p[0] || !p[1]) {
      return InternalError(std::string("chain: ") + hook + "(" + std::to_string(m) +
                           ") must hand out 2 tensors");
    }
    return OkStatus();
  }

  // pre_[c] = act_[c] W^T + b; act_[c + 1] = GELU(pre_[c]) except after the last call.
  Status ForwardCall(const ChainProgram& program, int c, ModuleHooks& hooks) {
    const int m = program[c].module;
    STRATA_ASSIGN_OR_RETURN(ModuleParams p, hooks.Fetch(m));
    STRATA_RETURN_IF_ERROR(CheckPointers(p.tensors, m, "Fetch"));
    pre_[c].resize(n_ * out_[m]);
    model::LinearForward(act_[c].data(), n_, in_[m], out_[m], p.tensors[0], p.tensors[1], p.dtype,
                         pre_[c].data());
    STRATA_RETURN_IF_ERROR(hooks.Release(m));
    if (c + 1 < static_cast<int>(program.size())) {
      act_[c + 1].resize(n_ * out_[m]);
      model::GeluForward(pre_[c].data(), n_ * out_[m], act_[c + 1].data());
    }
    return OkStatus();
  }

  // A checkpointed block keeps its input and output only.
  void PoisonCheckpointedActivations(const ChainProgram& program) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t c = 0; c < program.size(); ++c) {
      if (!program[c].recompute) continue;
      std::fill(pre_[c].begin(), pre_[c].end(), nan);
      if (c > 0 && program[c - 1].recompute) std::fill(act_[c].begin(), act_[c].end(), nan);
    }
  }

  // grad_ holds d loss / d (output of call c), after its GELU; leaves d loss / d act_[c]
  // there. The GELU is undone here, not by the next call's backward, because a
  // checkpointed call's pre_ is only valid once its block has been recomputed.
  Status BackwardCall(const ChainProgram& program, int c, ModuleHooks& hooks) {
    const int m = program[c].module;
    const int64_t in = in_[m], out = out_[m];
    if (c + 1 < static_cast<int>(program.size()))
      model::GeluBackward(pre_[c].data(), grad_.data(), n_ * out, grad_.data());
    float* dx = c > 0 ? dx_.data() : nullptr;
    if (program[c].frozen) {
      if (dx == nullptr) return OkStatus();  // nothing before it needs a gradient
      STRATA_ASSIGN_OR_RETURN(ModuleParams p, hooks.Fetch(m));
      STRATA_RETURN_IF_ERROR(CheckPointers(p.tensors, m, "Fetch"));
      scratch_w_.resize(out * in);
      scratch_b_.resize(out);
      model::LinearBackward(act_[c].data(), grad_.data(), n_, in, out, p.tensors[0], p.dtype, dx,
                            scratch_w_.data(), scratch_b_.data(), false);
      STRATA_RETURN_IF_ERROR(hooks.Release(m));
    } else {
      STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, hooks.BeginBackward(m));
      STRATA_RETURN_IF_ERROR(CheckPointers(bw.params.tensors, m, "BeginBackward"));
      const auto& g = bw.grads;
      if (g.tensors.size() != 2 || g.accumulate.size() != 2 || !g.tensors[0] || !g.tensors[1]) {
        return InternalError("chain: BeginBackward(" + std::to_string(m) + ") must hand out 2 gradients");
      }
      // LinearBackward takes one flag for dW and db: when the engine's flags differ, the
      // one to overwrite is zeroed first and both are added to.
      bool accumulate = g.accumulate[0] != 0;
      if (g.accumulate[0] != g.accumulate[1]) {
        if (!g.accumulate[0]) std::fill(g.tensors[0], g.tensors[0] + out * in, 0.0f);
        if (!g.accumulate[1]) std::fill(g.tensors[1], g.tensors[1] + out, 0.0f);
        accumulate = true;
      }
      model::LinearBackward(act_[c].data(), grad_.data(), n_, in, out, bw.params.tensors[0], bw.params.dtype,
                            dx, g.tensors[0], g.tensors[1], accumulate);
      STRATA_RETURN_IF_ERROR(hooks.EndBackward(m));
    }
    if (dx != nullptr) std::swap(grad_, dx_);
    return OkStatus();
  }

  std::vector<int64_t> in_, out_;
  int64_t widest_ = 0;
  int64_t n_ = 0;
  std::vector<std::vector<float>> act_, pre_;  // per call: input, Linear output
  std::vector<float> grad_, dx_, scratch_w_, scratch_b_;
};

// The dense reference store: fp32 masters (and the 16-bit copies the kernels read when the
// compute dtype is 16-bit) and one fp32 gradient per tensor, handed out with the
// accumulate flags the engine hands out: overwrite on a tensor's first backward use in a
// micro-batch, add after.
class DenseHooks : public ModuleHooks {
 public:
  DenseHooks(const ModelDecl& model, DType compute, const TensorInit& init)
      : model_(model), compute_(compute) {
    for (size_t t = 0; t < model.tensors.size(); ++t) {
      const int64_t n = model.tensors[t].numel();
      master_.emplace_back(n);
      init(static_cast<TensorId>(t), 0, n, master_.back().data());
      grad_.emplace_back(n, 0.0f);
      half_.emplace_back(compute == DType::kF32 ? 0 : n);
    }
    used_.assign(model.tensors.size(), 0);
    SyncCompute();
  }

  // A new micro-batch: every tensor's next backward use overwrites its gradient.
  void BeginMicroBatch() { std::fill(used_.begin(), used_.end(), 0); }
  // Rounds the masters into the 16-bit copies (after each optimizer step).
  void SyncCompute() {
    if (compute_ == DType::kF32) return;
    for (size_t t = 0; t < master_.size(); ++t) {
      model::FromFloat(master_[t].data(), static_cast<int64_t>(master_[t].size()), compute_, half_[t].data());
    }
  }
  std::vector<float>& master(TensorId t) { return master_[t]; }
  // This micro-batch's gradient, valid where used(t) (a tensor no backward used has none).
  const std::vector<float>& grad(TensorId t) const { return grad_[t]; }
  bool used(TensorId t) const { return used_[t] != 0; }

  Result<ModuleParams> Fetch(int module) override {
    ModuleParams p;
    p.dtype = compute_;
    for (TensorId t : model_.modules[module].tensors) {
      p.tensors.push_back(compute_ == DType::kF32 ? static_cast<const void*>(master_[t].data())
                                                  : half_[t].data());
    }
    return p;
  }
  Result<ModuleBackward> BeginBackward(int module) override {
    ModuleBackward b;
    STRATA_ASSIGN_OR_RETURN(b.params, Fetch(module));
    for (TensorId t : model_.modules[module].tensors) {
      b.grads.tensors.push_back(grad_[t].data());
      b.grads.accumulate.push_back(used_[t]);
      used_[t] = 1;
    }
    return b;
  }

 private:
  const ModelDecl& model_;
  DType compute_;
  std::vector<std::vector<float>> master_, grad_;
  std::vector<std::vector<uint16_t>> half_;
  std::vector<uint8_t> used_;
};

}  // namespace strata::testing
