// An engine created without training it, for tests that drive the hooks or read its
// memory plan (world size 1).
#pragma once

#include <memory>

#include "engine_harness.h"
#include "single_world.h"
#include "strata/model.h"

namespace strata::testing {

// An engine on a sim device of its own (of strata.device_budget's size, when set), for
// tests that drive the hooks or read the plan. The engine is declared last so that it
// goes before its device.
struct TestEngine {
  std::unique_ptr<Device> device;
  std::unique_ptr<Engine> engine;
};
inline Result<TestEngine> MakeEngine(const Config& config, const zero::TrainSpec& spec) {
  DeviceOptions dopt;
  dopt.kind = DeviceKind::kSim;
  dopt.capacity = config.strata.device_budget;
  TestEngine t;
  STRATA_ASSIGN_OR_RETURN(t.device, CreateDevice(dopt));
  auto init = [&](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(spec.model, id, b, n, out);
  };
  STRATA_ASSIGN_OR_RETURN(t.engine, Engine::Create(config, model::MlpModules(spec.model), init,
                                                   EngineResources{&World(), t.device.get()}));
  return t;
}

// Creates an engine without training it: its memory plan, or the refusal.
inline Result<EngineLayoutInfo> PlanOnly(const Config& config, const zero::TrainSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(TestEngine t, MakeEngine(config, spec));
  return t.engine->layout_info();
}

}  // namespace strata::testing
