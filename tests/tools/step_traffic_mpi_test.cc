// The plan's predicted bytes per lane against the engine's own counters of a real step
// at world sizes 2 and 4 (the reductions and gathers cross ranks here), and the plan of
// rank 0 over a mirror world against each real rank's engine.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "strata/device.h"
#include "tools/mirror_world.h"
#include "tools/model_engine.h"
#include "tools/plan_test_model.h"
#include "tools/step_traffic.h"
#include "zero/mpi_world.h"
#include "zero/trainer.h"

namespace strata::tools {
namespace {

using testing::MpiWorld;

struct Combo {
  int stage;
  const char* opt;
  const char* param;
  int accumulation = 1;
  double grad_resident = -1;  // strata.gradient_resident (nvme optimizer), -1: auto
  bool overlap = true;        // strata.overlap, fixed: gradients on NVMe move by it
};

std::string Swap() {
  // One directory for the job (every rank's store names its rank).
  static const std::string dir = [] {
    float id = static_cast<float>(getpid() % 1000000);
    EXPECT_TRUE(MpiWorld().Broadcast(&id, 1, DType::kF32, 0).Wait().ok());
    return (std::filesystem::temp_directory_path() /
            ("strata-traffic-mpi-" + std::to_string(static_cast<int>(id))))
        .string();
  }();
  return dir;
}

Config MakeConfig(const Combo& k) {
  nlohmann::json j = {{"zero_optimization", {{"stage", k.stage}}},
                      {"gradient_accumulation_steps", k.accumulation},
                      {"strata", {{"device", "sim"}, {"chunk_size", "16KiB"}, {"overlap", k.overlap}}}};
  for (auto [key, dev] : {std::pair{"offload_optimizer", k.opt}, {"offload_param", k.param}}) {
    if (std::string(dev) != "none") j["zero_optimization"][key] = {{"device", dev}, {"nvme_path", Swap()}};
  }
  if (std::string(k.opt) == "nvme") j["strata"]["optimizer_resident"] = 0;
  if (k.grad_resident >= 0) j["strata"]["gradient_resident"] = k.grad_resident;
  Result<Config> c = ParseConfig(j);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : Config{};
}

model::MlpSpec Model() { return testing::PlanTestModel(); }

class TrafficMpiTest : public ::testing::TestWithParam<Combo> {};

TEST_P(TrafficMpiTest, MatchesEveryRanksCounters) {
  Communicator& world = MpiWorld();
  const Config c = MakeConfig(GetParam());
  Result<ModelEngine> e = CreateMlpEngine(world, c, Model(), c.train_micro_batch_size_per_gpu, nullptr);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  zero::TrainSpec spec;
  spec.model = Model();
  spec.steps = 3;
  spec.micro_batch = 4;
  Result<zero::TrainLog> log = zero::TrainWithEngine(*e->engine, world, c, spec);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const StepResult& r = log->results[2];
  const EngineLayoutInfo& l = e->engine->layout_info();
  const LaneWork w = PredictTraffic(c, world.size(), l);
  EXPECT_EQ(w.comm_bytes, static_cast<double>(r.bytes_comm)) << "rank " << world.rank();
  EXPECT_EQ(w.copy_bytes, static_cast<double>(r.bytes_h2d + r.bytes_d2h)) << "rank " << world.rank();
  EXPECT_EQ(w.nvme_read_bytes, static_cast<double>(r.bytes_nvme_read)) << "rank " << world.rank();
  EXPECT_EQ(w.nvme_write_bytes, static_cast<double>(r.bytes_nvme_written)) << "rank " << world.rank();

  // Rank 0's plan over a mirror world of this size is each rank's engine.
  auto mirror = CreateMirrorWorld(world.size());
  ASSERT_TRUE(mirror.ok());
  DeviceOptions d;
  d.kind = DeviceKind::kSim;
  auto device = CreateDevice(d);
  ASSERT_TRUE(device.ok());
  Result<EngineLayoutInfo> plan =
      Engine::Plan(c, model::MlpModules(Model()), EngineResources{mirror->get(), device->get()});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->shard_elems, l.shard_elems);
  EXPECT_EQ(plan->device_need, l.device_need) << "rank " << world.rank();
  EXPECT_EQ(plan->host_need, l.host_need) << "rank " << world.rank();
  EXPECT_EQ(plan->nvme_need, l.nvme_need) << "rank " << world.rank();
}

INSTANTIATE_TEST_SUITE_P(Combos, TrafficMpiTest,
                         ::testing::Values(Combo{0, "none", "none"}, Combo{1, "cpu", "none", 2},
                                           Combo{2, "none", "none"}, Combo{3, "none", "none"},
                                           Combo{3, "cpu", "cpu", 2}, Combo{3, "cpu", "nvme"},
                                           Combo{3, "nvme", "none", 2}, Combo{3, "nvme", "none", 2, 0.5},
                                           Combo{3, "nvme", "none", 2, 0.5, false}),
                         [](const ::testing::TestParamInfo<Combo>& i) {
                           return "stage" + std::to_string(i.param.stage) + "_" + i.param.opt + "_" +
                                  i.param.param + "_accum" + std::to_string(i.param.accumulation) +
                                  (i.param.grad_resident >= 0 ? "_grads_kept_half" : "") +
                                  (i.param.overlap ? "" : "_serial");
                         });

}  // namespace
}  // namespace strata::tools
