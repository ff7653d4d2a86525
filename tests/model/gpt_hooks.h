// Test hooks for the GPT driver: a wrapper over any ModuleHooks that records the call
// order, poisons the gradients a backward must overwrite (NaN: one left unwritten fails
// every comparison) and can force accumulation onto tensors whose flag says overwrite, to
// drive the driver's per-tensor flag handling. Plus deterministic token batches.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "strata/model.h"
#include "strata/module_hooks.h"

namespace strata::model::testing {

class CheckingHooks : public ModuleHooks {
 public:
  CheckingHooks(ModuleHooks& inner, const ModelDecl& model) : inner_(inner), model_(model) {}

  // Calls so far: "F<m>", "R<m>", "B<m>", "E<m>".
  const std::vector<std::string>& log() const { return log_; }
  // Odd positions of every module (the biases; lnf.bias and wpe) whose flag says overwrite
  // are handed out with accumulate set and the gradient set to `value` instead.
  void ForceAccumulateOnOddTensors(float value) {
    force_odd_ = true;
    force_value_ = value;
  }

  Result<ModuleParams> Fetch(int m) override {
    log_.push_back("F" + std::to_string(m));
    return inner_.Fetch(m);
  }
  Status Release(int m) override {
    log_.push_back("R" + std::to_string(m));
    return inner_.Release(m);
  }
  Result<ModuleBackward> BeginBackward(int m) override {
    log_.push_back("B" + std::to_string(m));
    Result<ModuleBackward> bw = inner_.BeginBackward(m);
    if (!bw.ok()) return bw;
    ModuleGrads& g = bw->grads;
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      if (g.accumulate[i]) continue;
      const int64_t n = model_.tensors[model_.modules[m].tensors[i]].numel();
      const bool force = force_odd_ && i % 2 == 1;
      std::fill(g.tensors[i], g.tensors[i] + n,
                force ? force_value_ : std::numeric_limits<float>::quiet_NaN());
      if (force) g.accumulate[i] = 1;
    }
    return bw;
  }
  Status EndBackward(int m) override {
    log_.push_back("E" + std::to_string(m));
    return inner_.EndBackward(m);
  }

 private:
  ModuleHooks& inner_;
  const ModelDecl& model_;
  std::vector<std::string> log_;
  bool force_odd_ = false;
  float force_value_ = 0;
};

// Token ids in [0, vocab): element i of stream `stream` is a hash of (seed, stream, i).
inline std::vector<int32_t> HashTokens(int64_t n, uint64_t seed, uint64_t stream, int64_t vocab) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float u = (HashUniform(seed, stream, static_cast<uint64_t>(i)) + 1.0f) * 0.5f;  // [0, 1)
    v[i] = std::min<int32_t>(static_cast<int32_t>(vocab - 1),
                             static_cast<int32_t>(u * static_cast<float>(vocab)));
  }
  return v;
}

}  // namespace strata::model::testing
