// The overlapped step seen on the engine's timeline: optimizer work on the chunks whose
// gradients are final starts while backward still runs on the first module. A check on
// the recorded spans, not on how long anything took: the backward of layer 0 waits (up
// to a minute) until an optimizer step of that backward has been recorded, so the order
// does not depend on the OS giving the optimizer thread a core in time (under a loaded
// ctest -j2 it once did not). An engine that held its optimizer until backward ended
// would leave that wait to time out, and the check fails.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "engine_harness.h"
#include "strata/timeline.h"

namespace strata::testing {
namespace {

struct World {
  std::unique_ptr<Communicator> comm;
  World() {
    auto r = InitWorld(CommOptions{"world", 120});
    STRATA_CHECK_MSG(r.ok(), r.status().ToString());
    comm = std::move(*r);
  }
  ~World() {
    comm.reset();
    FinalizeWorld().IgnoreError();  // end of the process; nothing left to report to
  }
};

// Trains two steps with a timeline and returns its spans in *spans (a fatal failure,
// and no spans, when the engine cannot be made or a step fails).
void Record(Communicator& world, const Combo& c, bool overlap, Timeline* timeline,
            std::vector<Timeline::Span>* spans = nullptr) {
  zero::TrainSpec spec;
  // Layer 0 (2M weights and 1000 biases) fills chunk 0 exactly and is by far the
  // slowest backward; chunk 1 holds every layer above it, so its gradients are final
  // (and its step may start) before layer 0's backward begins.
  spec.model.input_dim = 2047;
  spec.model.hidden = {1000, 64, 64};
  spec.model.output_dim = 8;
  spec.model.seed = 3;
  spec.steps = 2;
  spec.micro_batch = 256;  // layer 0's backward: about 2 GFLOP, tens of milliseconds
  size_t speculative_at_top = 0;
  auto speculative_spans = [timeline] {
    size_t n = 0;
    for (const auto& s : timeline->Spans()) n += s.name.find("(speculative)") != std::string::npos;
    return n;
  };
  if (overlap) {
    spec.before_backward = [&](int m) {
      if (m == 3) speculative_at_top = speculative_spans();
      if (m != 0) return;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (speculative_spans() <= speculative_at_top && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    };
  }
  nlohmann::json extra = {{"strata", {{"overlap", overlap}, {"chunk_size", "64KiB"}}}};
  Config config = MakeConfig(c, extra.dump());
  auto dev = CreateDevice(DeviceOptions{DeviceKind::kSim, 0, 0});
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  auto modules = model::MlpModules(spec.model);
  ParamInit init = [&](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(spec.model, id, b, n, out);
  };
  EngineResources res{&world, dev->get()};
  res.timeline = timeline;
  auto engine = Engine::Create(config, modules, init, res);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  auto log = zero::TrainWithEngine(**engine, world, config, spec);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  if (spans != nullptr) *spans = timeline->Spans();
}

void CheckOptimizerBeforeBackwardEnds(Communicator& world, const Combo& c) {
  Timeline timeline;
  std::vector<Timeline::Span> spans;
  ASSERT_NO_FATAL_FAILURE(Record(world, c, /*overlap=*/true, &timeline, &spans));
  ASSERT_FALSE(spans.empty());
  // The end of the last step's backward of layer0, and the optimizer spans of that step.
  // The last step's backward runs from "backward layer3" (the top module) to the end
  // of "backward layer0".
  Timeline::Clock::time_point backward_end{}, backward_start{};
  for (const auto& s : spans) {
    if (s.name == "backward layer0" && s.end > backward_end) backward_end = s.end;
    if (s.name == "backward layer3" && s.begin > backward_start) backward_start = s.begin;
  }
  ASSERT_NE(backward_end, Timeline::Clock::time_point{}) << "no backward span recorded";
  int early = 0, speculative = 0;
  for (const auto& s : spans) {
    if (s.name.find("(speculative)") == std::string::npos) continue;
    ++speculative;
    if (s.begin >= backward_start && s.begin < backward_end) ++early;
  }
  EXPECT_GT(speculative, 0) << ComboName(c) << ": no speculative optimizer spans";
  if (early == 0) {
    for (const auto& s : spans) {
      std::cerr << s.name << " " << std::chrono::duration<double>(s.begin - backward_start).count() << " .. "
                << std::chrono::duration<double>(s.end - backward_start).count() << "\n";
    }
  }
  EXPECT_GT(early, 0) << ComboName(c) << ": no optimizer work started before backward ended";

  // Without overlap, every optimizer span starts after the backward has ended.
  Timeline serial;
  std::vector<Timeline::Span> serial_spans;
  ASSERT_NO_FATAL_FAILURE(Record(world, c, /*overlap=*/false, &serial, &serial_spans));
  for (const auto& s : serial_spans) {
    EXPECT_EQ(s.name.find("speculative"), std::string::npos) << s.name;
  }
}

TEST(EngineTimeline, OptimizerStartsBeforeBackwardEnds) {
  World world;
  ASSERT_NO_FATAL_FAILURE(CheckOptimizerBeforeBackwardEnds(*world.comm, {2, "cpu", "none"}));
  ASSERT_NO_FATAL_FAILURE(CheckOptimizerBeforeBackwardEnds(*world.comm, {3, "nvme", "nvme"}));
  // The trace is valid Chrome-trace JSON with the engine's lanes.
  Timeline t;
  ASSERT_NO_FATAL_FAILURE(Record(*world.comm, {3, "nvme", "cpu"}, true, &t));
  auto j = nlohmann::json::parse(t.ToChromeTraceJson());
  std::set<std::string> names;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("ph", "") == "M" && e["args"].contains("name") && e["args"]["name"].is_string()) {
      names.insert(e["args"]["name"].get<std::string>());
    }
  }
  for (const char* lane :
       {"engine compute", "engine collectives", "engine optimizer", "engine param fetch"}) {
    EXPECT_TRUE(names.count(lane)) << lane;
  }
}

}  // namespace
}  // namespace strata::testing
