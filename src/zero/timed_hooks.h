// The engine's hooks as a training loop hands them to a model: each call first polls the
// loop's stop request (an interrupt turns into Aborted at the next module boundary) and
// the time spent inside the engine is added up, so a step's report can split compute
// from waiting on gathers and buffers.
#pragma once

#include <chrono>
#include <functional>

#include "strata/engine.h"

namespace strata::zero {

class TimedHooks : public ModuleHooks {
 public:
  // Both functions are borrowed and may be empty. `before_backward` runs once the
  // engine's BeginBackward of a module returned, before the module's backward (tests).
  TimedHooks(Engine& engine, const std::function<Status()>& check_stop,
             const std::function<void(int)>& before_backward)
      : engine_(engine), check_stop_(check_stop), before_backward_(before_backward) {}

  double seconds() const { return seconds_; }

  Result<ModuleParams> Fetch(int m) override {
    return Time([&] { return engine_.Fetch(m); });
  }
  Status Release(int m) override {
    return Time([&] { return engine_.Release(m); });
  }
  Result<ModuleBackward> BeginBackward(int m) override {
    auto r = Time([&] { return engine_.BeginBackward(m); });
    if (r.ok() && before_backward_) before_backward_(m);
    return r;
  }
  Status EndBackward(int m) override {
    return Time([&] { return engine_.EndBackward(m); });
  }

 private:
  template <typename F>
  auto Time(F&& f) -> decltype(f()) {
    if (check_stop_) STRATA_RETURN_IF_ERROR(check_stop_());
    const auto t0 = std::chrono::steady_clock::now();
    auto r = f();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return r;
  }

  Engine& engine_;
  const std::function<Status()>& check_stop_;
  const std::function<void(int)>& before_backward_;
  double seconds_ = 0;
};

}  // namespace strata::zero
