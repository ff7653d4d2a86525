// `strata plan`'s parts: the engine's plan without allocation, its budget boundaries, the
// predicted traffic against a real step's counters, the ranking, the mirror world and the
// saved rates (the time arithmetic: plan_time_test.cc).
#include "tools/planner.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>

#include "strata/device.h"
#include "tools/engine_calibration.h"
#include "tools/mirror_world.h"
#include "tools/model_engine.h"
#include "tools/plan_test_model.h"
#include "tools/step_traffic.h"
#include "zero/trainer.h"

namespace strata::tools {
namespace {

std::string Swap() {
  static const std::string dir =
      (std::filesystem::temp_directory_path() / ("strata-plan-test-" + std::to_string(getpid()))).string();
  return dir;
}

struct Combo {
  int stage;
  const char* opt;
  const char* param;
  double resident = 0;  // NVMe optimizer only; -1: "auto"
  int accumulation = 1;
  double ratio = 1;  // CPU optimizer only: offload_optimizer.ratio
};

Config MakeConfig(const Combo& k, const std::string& extra = "") {
  nlohmann::json j = {{"zero_optimization", {{"stage", k.stage}}},
                      {"gradient_accumulation_steps", k.accumulation},
                      {"strata", {{"device", "sim"}, {"chunk_size", "16KiB"}, {"swap_paths", {Swap()}}}}};
  if (std::string(k.opt) != "none")
    j["zero_optimization"]["offload_optimizer"] = {{"device", k.opt}, {"nvme_path", Swap()}};
  if (k.ratio != 1) j["zero_optimization"]["offload_optimizer"]["ratio"] = k.ratio;
  if (std::string(k.param) != "none")
    j["zero_optimization"]["offload_param"] = {{"device", k.param}, {"nvme_path", Swap()}};
  if (std::string(k.opt) == "nvme")
    j["strata"]["optimizer_resident"] = k.resident < 0 ? nlohmann::json("auto") : nlohmann::json(k.resident);
  if (!extra.empty()) j.merge_patch(nlohmann::json::parse(extra));
  Result<Config> c = ParseConfig(j);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : Config{};
}

model::MlpSpec Model() { return testing::PlanTestModel(); }

Result<EngineLayoutInfo> Plan(const Config& c, int world_size = 1) {
  STRATA_ASSIGN_OR_RETURN(auto world, CreateMirrorWorld(world_size));
  DeviceOptions d;
  d.kind = DeviceKind::kSim;
  d.capacity = c.strata.device_budget;
  STRATA_ASSIGN_OR_RETURN(auto device, CreateDevice(d));
  return Engine::Plan(c, model::MlpModules(Model()), EngineResources{world.get(), device.get()});
}

uint64_t FixedNeed(const EngineLayoutInfo& l, const std::string& tier) {
  uint64_t sum = 0;
  for (const EngineNeedPart& p : l.need_parts) sum += p.tier == tier ? p.bytes : 0;
  return sum;
}

TEST(EnginePlan, IsThePlanTheEngineAllocates) {
  for (Combo k : {Combo{2, "cpu", "none"}, Combo{3, "cpu", "cpu"}, Combo{3, "nvme", "nvme", -1}}) {
    const Config c = MakeConfig(k);
    std::filesystem::remove_all(Swap());
    Result<EngineLayoutInfo> plan = Plan(c);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_FALSE(std::filesystem::exists(Swap())) << "a plan creates no swap directory or file";
    auto world = CreateMirrorWorld(1);
    ASSERT_TRUE(world.ok());
    Result<ModelEngine> e = CreateMlpEngine(**world, c, Model(), c.train_micro_batch_size_per_gpu, nullptr);
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    const EngineLayoutInfo& made = e->engine->layout_info();
    EXPECT_EQ(plan->device_need, made.device_need) << k.stage << k.opt << k.param;
    EXPECT_EQ(plan->host_need, made.host_need);
    EXPECT_EQ(plan->nvme_need, made.nvme_need);
    EXPECT_EQ(plan->num_chunks, made.num_chunks);
    EXPECT_EQ(plan->optimizer_resident_chunks, made.optimizer_resident_chunks);
    EXPECT_EQ(plan->need_parts.size(), made.need_parts.size());
  }
}

TEST(EnginePlan, ABudgetAtTheFixedNeedFitsAndOneByteLessDoesNot) {
  for (const char* tier : {"device", "pinned host"}) {
    const std::string key = tier[0] == 'd' ? "device_budget" : "host_budget";
    Result<EngineLayoutInfo> ample = Plan(MakeConfig({3, "cpu", "cpu"}));
    ASSERT_TRUE(ample.ok()) << ample.status().ToString();
    const uint64_t need = FixedNeed(*ample, tier);
    ASSERT_GT(need, 0u) << tier;
    Result<EngineLayoutInfo> exact =
        Plan(MakeConfig({3, "cpu", "cpu"}, "{\"strata\": {\"" + key + "\": " + std::to_string(need) + "}}"));
    EXPECT_TRUE(exact.ok()) << tier << ": " << exact.status().ToString();
    Result<EngineLayoutInfo> short_one = Plan(
        MakeConfig({3, "cpu", "cpu"}, "{\"strata\": {\"" + key + "\": " + std::to_string(need - 1) + "}}"));
    ASSERT_FALSE(short_one.ok()) << tier;
    EXPECT_EQ(short_one.status().code(), StatusCode::kOutOfBudget);
    EXPECT_NE(short_one.status().message().find(std::string("the ") + tier + " tier"), std::string::npos)
        << short_one.status().message();
  }
}

TEST(EnginePlan, MoreRanksHoldLessEach) {
  Result<EngineLayoutInfo> one = Plan(MakeConfig({3, "cpu", "cpu"}), 1);
  Result<EngineLayoutInfo> four = Plan(MakeConfig({3, "cpu", "cpu"}), 4);
  ASSERT_TRUE(one.ok() && four.ok());
  EXPECT_EQ(four->shard_elems * 4, four->chunk_elems);
  EXPECT_LT(FixedNeed(*four, "pinned host"), FixedNeed(*one, "pinned host"));
}

// An MLP of `hidden` layers, every one `width` wide.
model::MlpSpec SquareMlp(int width, int hidden) {
  model::MlpSpec spec;
  spec.input_dim = width;
  spec.hidden.assign(hidden, width);
  spec.output_dim = width;
  spec.seed = 3;
  return spec;
}

// Three steps of micro-batch 8: the third is past the recording of the call order.
Result<zero::TrainLog> TrainThreeSteps(Engine& engine, Communicator& world, const Config& c,
                                       const model::MlpSpec& spec) {
  zero::TrainSpec train;
  train.model = spec;
  train.steps = 3;
  train.micro_batch = 8;
  return zero::TrainWithEngine(engine, world, c, train);
}

// An MLP engine of `spec` at world size 1, trained three steps: its layout and its third
// step's counters.
struct ThreeSteps {
  EngineLayoutInfo layout;
  StepResult third;
};
Result<ThreeSteps> RunThreeSteps(const Config& c, const model::MlpSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(auto world, CreateMirrorWorld(1));
  STRATA_ASSIGN_OR_RETURN(ModelEngine e,
                          CreateMlpEngine(*world, c, spec, c.train_micro_batch_size_per_gpu, nullptr));
  STRATA_ASSIGN_OR_RETURN(zero::TrainLog log, TrainThreeSteps(*e.engine, *world, c, spec));
  return ThreeSteps{e.engine->layout_info(), log.results[2]};
}

// The predicted bytes of each lane against the engine's own counters of a real step.
class TrafficTest : public ::testing::TestWithParam<Combo> {};

TEST_P(TrafficTest, MatchesTheCountersOfARealStep) {
  const Combo k = GetParam();
  // The traffic of an overlapped step (strata.overlap "auto" would time a serial one in
  // the step looked at, whose gradients take another path on NVMe).
  const Config c = MakeConfig(k, R"({"strata": {"overlap": true}})");
  auto world = CreateMirrorWorld(1);
  ASSERT_TRUE(world.ok());
  Result<ModelEngine> e = CreateMlpEngine(**world, c, Model(), c.train_micro_batch_size_per_gpu, nullptr);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  zero::TrainSpec spec;
  spec.model = Model();
  spec.steps = 3;
  spec.micro_batch = 8;
  Result<zero::TrainLog> log = zero::TrainWithEngine(*e->engine, **world, c, spec);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  const StepResult& r = log->results[2];  // after the step that records the call order
  const LaneWork w = PredictTraffic(c, 1, e->engine->layout_info());
  const EngineLayoutInfo& l = e->engine->layout_info();
  SCOPED_TRACE("chunks " + std::to_string(l.num_chunks) + " x " + std::to_string(l.chunk_elems) +
               ", pieces " + std::to_string(l.optimizer_pieces) + " of " +
               std::to_string(l.optimizer_piece_elems) + ", padding pieces " +
               std::to_string(l.optimizer_padding_pieces) + ", resident " +
               std::to_string(l.optimizer_resident_chunks) + ", on device " +
               std::to_string(l.optimizer_device_chunks) + ", grads on nvme " +
               std::to_string(l.gradients_on_nvme) + ", params in state " +
               std::to_string(l.params_in_optimizer_state) + ", kept " + std::to_string(l.kept_chunks));
  if (k.ratio != 1) {
    EXPECT_GT(l.optimizer_device_chunks, 0) << "the ratio's device path did not run";
  }
  EXPECT_EQ(w.comm_bytes, static_cast<double>(r.bytes_comm));
  EXPECT_EQ(w.copy_bytes, static_cast<double>(r.bytes_h2d + r.bytes_d2h));
  if (l.params_in_optimizer_state) {
    // Whether a chunk's first gather finds its shard still in memory from the step
    // depends on the staging buffers in use at that moment: up to one shard either way.
    EXPECT_NEAR(w.nvme_read_bytes, static_cast<double>(r.bytes_nvme_read), l.shard_elems * 4.0);
  } else {
    EXPECT_EQ(w.nvme_read_bytes, static_cast<double>(r.bytes_nvme_read));
  }
  EXPECT_EQ(w.nvme_write_bytes, static_cast<double>(r.bytes_nvme_written));
  // The shards' traffic between micro-batches is part of those totals.
  EXPECT_LE(w.nvme_between_write_bytes, w.nvme_write_bytes);
  EXPECT_LE(w.nvme_between_read_bytes, w.nvme_read_bytes);
  const bool shards_on_disk =
      l.gradients_on_nvme && l.gradient_resident_chunks + l.optimizer_resident_chunks < l.num_chunks;
  EXPECT_EQ(w.nvme_between_write_bytes > 0, k.accumulation > 1 && shards_on_disk);
}

// A model of eight chunks at stage 3 with everything on NVMe: every gather reads its
// shard from the disk but the forward's first of the chunks whose updated shard the
// step left in memory, the last ones stepped (fresh_param_shards); every bf16 shard is
// written once a step beside the optimizer state. A kept shard's buffer
// may be taken back for a later chunk's write while the writes behind still hold the
// others (TakeOut16Staging), which depends on how soon the disk finishes them: with bf16
// (a swap of its own) at most fresh_param_shards more shards are read, never fewer; in
// fp32 they are read from the optimizer's master, within a shard either way.
TEST(TrafficTest, EveryGatherReadsTheDiskButTheFreshShards) {
  const model::MlpSpec spec = SquareMlp(64, 7);
  for (const char* compute : {"fp32", "bf16"}) {
    const bool bf16 = std::string(compute) == "bf16";
    const Config c = MakeConfig(
        {3, "nvme", "nvme", 0},
        std::string(R"({"strata": {"overlap": true, "param_resident": 0, "param_on_device": 0},)") +
            R"("bf16": {"enabled": )" + (bf16 ? "true" : "false") + "}}");
    Result<ThreeSteps> run = RunThreeSteps(c, spec);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    const EngineLayoutInfo& l = run->layout;
    ASSERT_GE(l.num_chunks, 8) << compute;
    EXPECT_EQ(l.fresh_param_shards, 2) << compute;
    EXPECT_EQ(l.params_in_optimizer_state, !bf16) << compute;
    const double read = static_cast<double>(run->third.bytes_nvme_read);
    const double want = PredictTraffic(c, 1, l).nvme_read_bytes;
    if (bf16) {
      EXPECT_LE(want, read) << compute;
      EXPECT_LE(read, want + l.fresh_param_shards * l.shard_elems * 2.0) << compute;
      EXPECT_EQ(PredictTraffic(c, 1, l).nvme_write_bytes, static_cast<double>(run->third.bytes_nvme_written));
    } else {
      EXPECT_NEAR(want, read, l.shard_elems * 4.0) << compute;
    }
  }
}

// bf16 shards on the device (strata.param_on_device), the others on NVMe, every chunk
// kept from its forward to its backward use (one gather a step): a shard on the device
// reads and writes no disk and goes up once a step (its new values), one on disk is
// read, written and goes up once. Every lane is exact.
TEST(TrafficTest, ShardsOnTheDeviceMoveNoDiskBytesAndGoUpOnce) {
  const model::MlpSpec spec = SquareMlp(64, 7);
  for (double fraction : {0.0, 0.5, 1.0}) {
    const Config c = MakeConfig(
        {3, "cpu", "nvme"},
        R"({"bf16": {"enabled": true}, "strata": {"overlap": true, "param_resident": 0, "param_on_device": )" +
            std::to_string(fraction) + "}}");
    Result<ThreeSteps> run = RunThreeSteps(c, spec);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    const EngineLayoutInfo& l = run->layout;
    ASSERT_EQ(l.kept_chunks, l.num_chunks);
    EXPECT_EQ(l.param_device_chunks, static_cast<int>(std::lround(fraction * l.num_chunks))) << fraction;
    const StepResult& r = run->third;
    const LaneWork w = PredictTraffic(c, 1, l);
    EXPECT_EQ(w.nvme_read_bytes, static_cast<double>(r.bytes_nvme_read)) << fraction;
    EXPECT_EQ(w.nvme_write_bytes, static_cast<double>(r.bytes_nvme_written)) << fraction;
    EXPECT_EQ(w.copy_bytes, static_cast<double>(r.bytes_h2d + r.bytes_d2h)) << fraction;
    if (fraction == 1.0) {
      EXPECT_EQ(r.bytes_nvme_read + r.bytes_nvme_written, 0u);
    }
  }
}

// Streamed shards (stage 3, fp32, both on NVMe, a host budget too small for whole ones):
// every gather reads the disk, and with gradient pieces each gradient piece is written
// and read back once a step. The least budget that plans gives pieces; a larger one, one
// pinned gradient shard.
TEST(TrafficTest, StreamedShardsReadEveryGatherAndGradientPiecesGoThroughTheDisk) {
  const model::MlpSpec spec = SquareMlp(128, 5);
  auto config = [](uint64_t budget) {
    return MakeConfig({3, "nvme", "nvme", 0}, R"({"strata": {"overlap": true, "host_budget": )" +
                                                  std::to_string(budget) +
                                                  R"(}, "zero_optimization": {"sub_group_size": 1024}})");
  };
  int modes_seen = 0;
  bool pieces_seen = false;
  for (uint64_t budget = 64 * 1024; budget <= 4 * 1024 * 1024 && modes_seen < 2; budget += 8 * 1024) {
    auto world = CreateMirrorWorld(1);
    ASSERT_TRUE(world.ok());
    const Config c = config(budget);
    Result<ModelEngine> e = CreateMlpEngine(**world, c, spec, c.train_micro_batch_size_per_gpu, nullptr);
    if (!e.ok()) continue;
    const EngineLayoutInfo& l = e->engine->layout_info();
    ASSERT_GT(l.param_stream_pieces, 0) << "the least budgets must stream, at " << budget;
    if (l.gradient_pieces_on_nvme == pieces_seen) continue;  // the same mode as before
    if (modes_seen == 0) {
      EXPECT_TRUE(l.gradient_pieces_on_nvme) << "the least budget takes gradient pieces";
    }
    pieces_seen = l.gradient_pieces_on_nvme;
    ++modes_seen;
    Result<zero::TrainLog> log = TrainThreeSteps(*e->engine, **world, c, spec);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    const StepResult& r = log->results[2];
    const LaneWork w = PredictTraffic(c, 1, l);
    const std::string mode = l.gradient_pieces_on_nvme ? "gradient pieces" : "one gradient shard";
    EXPECT_EQ(l.fresh_param_shards, 0) << mode;
    EXPECT_EQ(w.nvme_read_bytes, static_cast<double>(r.bytes_nvme_read)) << mode;
    EXPECT_EQ(w.nvme_write_bytes, static_cast<double>(r.bytes_nvme_written)) << mode;
  }
  EXPECT_EQ(modes_seen, 2) << "both streamed modes between 64 KiB and 4 MiB";
}

INSTANTIATE_TEST_SUITE_P(
    Combos, TrafficTest,
    ::testing::Values(Combo{0, "none", "none"}, Combo{1, "cpu", "none"}, Combo{2, "cpu", "none", 0, 2},
                      Combo{3, "none", "none"}, Combo{3, "none", "cpu"}, Combo{3, "cpu", "cpu", 0, 2},
                      Combo{3, "none", "nvme"}, Combo{3, "cpu", "nvme"}, Combo{3, "nvme", "none"},
                      Combo{3, "nvme", "nvme"}, Combo{3, "nvme", "nvme", 0.5},
                      Combo{3, "nvme", "cpu", 0.5, 2}, Combo{3, "nvme", "nvme", -1},
                      Combo{3, "nvme", "none", 0, 3}, Combo{1, "cpu", "none", 0, 1, 0.5},
                      Combo{2, "cpu", "none", 0, 2, 0.25}, Combo{3, "cpu", "none", 0, 1, 0.5},
                      Combo{3, "cpu", "cpu", 0, 2, 0}),
    [](const ::testing::TestParamInfo<Combo>& i) {
      const Combo& k = i.param;
      std::string r = k.resident < 0 ? "auto" : std::to_string(static_cast<int>(k.resident * 100));
      return "stage" + std::to_string(k.stage) + "_" + k.opt + "_" + k.param + "_resident" + r + "_accum" +
             std::to_string(k.accumulation) +
             (k.ratio != 1 ? "_ratio" + std::to_string(static_cast<int>(k.ratio * 100)) : "");
    });

LaneRates SomeRates() {
  LaneRates r;
  r.adam_params_per_s = 2e9;
  r.copy_bytes_per_s = 10e9;
  r.nvme_read_bytes_per_s = 2e9;
  r.nvme_write_bytes_per_s = 2e9;
  r.compute_flops_per_s = 100e9;
  r.host_optimizer = {1e9, 1e-9, 1.2};
  r.device_optimizer = r.device_split = {1e9, 1e-9, 1.2};
  r.nvme_optimizer = {1e9, 1e-9, 1.0};
  return r;
}

// The plan of the test model under the base config with `extra` merged in.
Result<std::vector<PlanCandidate>> PlanWith(const std::string& extra) {
  PlanRequest r;
  r.base = MakeConfig({0, "none", "none"}, extra);
  Result<PlanModel> m = MlpPlanModel(Model());
  if (!m.ok()) return m.status();
  r.model = *m;
  r.micro_batch = 8;
  r.rates = SomeRates();
  return PlanConfigurations(r);
}

// A slow spell only lengthens a run: each variant's serial step is taken twice, before
// and after its overlapped one, and the faster kept. Here every first serial run takes
// 2 s and every second 1 s (canned runs, no engine).
TEST(Planner, CalibrationKeepsTheFasterOfTwoSerialRuns) {
  Result<PlanModel> m = MlpPlanModel(Model());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  int serial_runs = 0;
  m->run_cut = [&](Communicator&, const Config& c, int64_t, int) -> Result<CutRun> {
    CutRun r;
    r.step_s = c.strata.overlap ? 0.9 : (serial_runs++ % 2 == 0 ? 2.0 : 1.0);
    r.compute_s = 0.1;
    r.optimizer_s = 0.1;
    r.optimizer_elems = 1e6;
    r.flops_per_step = 1e9;
    return r;
  };
  LaneRates rates;  // copy rate 0: no copies taken out of the rest
  Status s = CalibrateEngine(MakeConfig({0, "none", "none"}), *m, 8, &rates);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(serial_runs, 2 * 6) << "two serial runs in each of the six variants (fp32)";
  for (const EngineRates* e :
       {&rates.device_optimizer, &rates.host_optimizer, &rates.device_split, &rates.host_optimizer_stage3,
        &rates.nvme_optimizer, &rates.nvme_optimizer_master}) {
    EXPECT_NEAR(e->other_s_per_param, (1.0 - 0.1 - 0.1) / 1e6, 1e-15) << "the 1 s run, not the 2 s one";
    EXPECT_DOUBLE_EQ(e->overlap_factor, 0.9);
    EXPECT_DOUBLE_EQ(e->optimizer_params_per_s, 1e7);
  }
}

// The calibration times the whole model while a step is at most 32 GFLOP, and its cut
// (four of eight layers here) past that, with the flops of the model it ran.
TEST(Planner, CalibratesTheWholeModelUnlessItsStepIsLarge) {
  model::MlpSpec spec;
  spec.input_dim = spec.output_dim = 256;
  spec.hidden.assign(8, 256);
  Result<PlanModel> m = MlpPlanModel(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto world = CreateMirrorWorld(1);
  ASSERT_TRUE(world.ok());
  const Config c = MakeConfig({0, "none", "none"});
  Result<CutRun> small = m->run_cut(**world, c, 4, 1);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_EQ(small->params, m->params);
  EXPECT_DOUBLE_EQ(small->flops_per_step, m->flops_per_sample * 4);
  const int64_t large_batch = static_cast<int64_t>(32e9 / m->flops_per_sample) + 1;
  Result<CutRun> large = m->run_cut(**world, c, large_batch, 1);
  ASSERT_TRUE(large.ok()) << large.status().ToString();
  model::MlpSpec four = spec;
  four.hidden.resize(4);
  EXPECT_EQ(large->params, model::MlpParameterCount(four));
  EXPECT_DOUBLE_EQ(large->flops_per_step, 6.0 * static_cast<double>(large->params) * large_batch);
}

TEST(Planner, RanksWhatFitsFastestFirstThenWhatDoesNot) {
  Result<std::vector<PlanCandidate>> all = PlanWith("{\"strata\": {\"device_budget\": 300000}}");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  int fits = 0, combos = 0;
  for (size_t i = 0; i < all->size(); ++i) {
    const PlanCandidate& c = (*all)[i];
    if (c.config.zero.offload_optimizer.ratio != 1) {
      // A device split of a CPU optimizer that fits, planned only when it fits.
      EXPECT_TRUE(c.fits) << c.name;
      EXPECT_EQ(c.config.zero.offload_optimizer.device, OffloadDevice::kCpu) << c.name;
      EXPECT_GT(c.layout.optimizer_device_chunks, 0) << c.name;
    } else {
      ++combos;
      fits += c.fits;
    }
    if (i > 0 && c.fits && c.predicted_s > all->front().predicted_s * (1 + kTieBand)) {
      EXPECT_LE((*all)[i - 1].predicted_s, c.predicted_s) << c.name << ": after the ties, fastest first";
    }
    if (i > 0) {
      EXPECT_FALSE(c.fits && !(*all)[i - 1].fits) << "what fits comes first";
    }
    if (!c.fits) {
      EXPECT_NE(c.refusal.find("device tier"), std::string::npos) << c.name << ": " << c.refusal;
    }
  }
  EXPECT_EQ(combos, 14) << "stage 0, stages 1 and 2 x2, stage 3 x9";
  EXPECT_GT(fits, 0);
  EXPECT_LT(fits, 14) << "a 300 kB device holds the whole model's state only in some configurations";
  EXPECT_FALSE(all->front().config.zero.offload_optimizer.device == OffloadDevice::kNone &&
               all->front().config.zero.stage == 0)
      << "stage 0 keeps everything on the device and cannot fit";
}

// A CPU optimizer's split keeps on the device as many chunks as the room beside its
// fixed device needs holds, at 16 bytes per element (master, m, v, gradient shard).
TEST(Planner, ADeviceSplitTakesTheChunksTheDeviceRoomHolds) {
  Result<std::vector<PlanCandidate>> plain = PlanWith("{\"strata\": {\"device_budget\": 100000000}}");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  const PlanCandidate* stage2 = nullptr;
  for (const PlanCandidate& c : *plain) {
    if (c.name == "stage 2, optimizer cpu") stage2 = &c;
  }
  ASSERT_NE(stage2, nullptr);
  ASSERT_TRUE(stage2->fits) << stage2->refusal;
  const EngineLayoutInfo& l = stage2->layout;
  uint64_t fixed = 0;
  for (const EngineNeedPart& p : l.need_parts) fixed += p.tier == "device" ? p.bytes : 0;
  const uint64_t per_chunk = 16ull * l.shard_elems;
  ASSERT_GE(l.num_chunks, 3);
  for (int want : {1, l.num_chunks - 1}) {
    // Room for `want` chunks and a little less than one more.
    const uint64_t budget = fixed + want * per_chunk + per_chunk / 2;
    Result<std::vector<PlanCandidate>> all =
        PlanWith("{\"strata\": {\"device_budget\": " + std::to_string(budget) + "}}");
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    const std::string name = "stage 2, optimizer cpu, " + std::to_string(want) + "/" +
                             std::to_string(l.num_chunks) + " on the device";
    const PlanCandidate* split = nullptr;
    for (const PlanCandidate& c : *all) {
      if (c.name == name) split = &c;
    }
    ASSERT_NE(split, nullptr) << name;
    EXPECT_EQ(split->layout.optimizer_device_chunks, want);
    EXPECT_EQ(split->layout.device_need, l.device_need + want * per_chunk);
    EXPECT_LE(split->layout.device_need, budget);
    EXPECT_EQ(split->work.adam_params_device, want * static_cast<double>(l.shard_elems));
  }
}

// The process beside the tiers: its resident set when planning, the engine's creation
// scratch, and the activations (test model: dims 64, 96, 80, 64, 10 -> 2 x 250 outputs
// + 2 x 96 widest + 64 input + 2 x 10 targets + 2 = 778 floats a sample).
TEST(Planner, TheProcessBesideTheTiersIsCounted) {
  Result<std::vector<PlanCandidate>> all = PlanWith("{}");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  int fits = 0;
  for (const PlanCandidate& c : *all) {
    if (!c.fits) continue;
    ++fits;
    const EngineLayoutInfo& l = c.layout;
    const uint64_t opt = c.config.zero.stage == 0 ? l.chunk_elems : l.shard_elems;
    EXPECT_GT(c.process.base, 0u) << c.name;
    EXPECT_EQ(c.process.creation, 8ull * l.chunk_elems + 12 * opt) << c.name;
    EXPECT_EQ(c.process.activations, 8u * 778 * 4) << c.name;
    EXPECT_EQ(c.process.total(), c.process.base + c.process.creation + c.process.activations);
  }
  EXPECT_GT(fits, 0);
}

// Each way is timed on the placement the engine makes for it: a serial step has no
// speculation spares, so at stage 3 with the optimizer on the device it reserves less of
// the device than the overlapped one, which puts spares in what the gather window leaves
// (test model: the window keeps 3 chunks in 688128 bytes, each spare takes 98304). The
// candidate's layout, work and memory are those of the way it runs.
TEST(Planner, EachWayIsTimedOnItsOwnPlacement) {
  const std::string budget = "{\"strata\": {\"device_budget\": 1000000}}";
  Result<std::vector<PlanCandidate>> all = PlanWith(budget);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  const PlanCandidate* device3 = nullptr;
  for (const PlanCandidate& c : *all) {
    if (!c.fits) continue;
    if (c.name == "stage 3, optimizer none, params none") device3 = &c;
    Result<EngineLayoutInfo> own = Plan(c.config);
    ASSERT_TRUE(own.ok()) << c.name << ": " << own.status().ToString();
    EXPECT_EQ(own->kept_chunks, c.layout.kept_chunks) << c.name;
    EXPECT_EQ(own->device_need, c.layout.device_need) << c.name;
    EXPECT_EQ(own->host_need, c.layout.host_need) << c.name;
    const LaneWork w = PredictTraffic(c.config, 1, *own);
    EXPECT_DOUBLE_EQ(w.copy_bytes, c.work.copy_bytes) << c.name;
    EXPECT_DOUBLE_EQ(w.comm_bytes, c.work.comm_bytes) << c.name;
  }
  ASSERT_NE(device3, nullptr);
  ASSERT_TRUE(device3->fits) << device3->refusal;
  EXPECT_FALSE(device3->config.strata.overlap) << "overlap factor 1.2 on shared cores: serial";
  Config overlapped = device3->config;
  overlapped.strata.overlap = true;
  Result<EngineLayoutInfo> on = Plan(overlapped);
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_EQ(device3->layout.kept_chunks, on->kept_chunks) << "the spares take what the window leaves";
  EXPECT_EQ(device3->layout.device_need, 688128u);
  EXPECT_EQ(on->device_need, 688128u + 3 * 98304) << "three spares beside the same window";
  EXPECT_GT(device3->time.overlapped_s, device3->time.serial_s);
}

// More device budget never keeps fewer chunks between the forward and the backward: with
// the optimizer on the device the gather window comes before the speculation spares, so
// a spare only ever takes what a full window leaves. Either way, over a sweep of budgets.
TEST(Planner, AMoreGenerousDeviceBudgetNeverKeepsFewerChunks) {
  for (bool overlap : {true, false}) {
    int kept = 0, planned = 0;
    uint64_t need = 0;
    for (uint64_t budget = 600000; budget <= 1400000; budget += 20000) {
      Config c = MakeConfig({3, "none", "none"}, "{}");
      c.strata.device_budget = budget;
      c.strata.overlap = overlap;
      c.strata.overlap_auto = false;
      Result<EngineLayoutInfo> l = Plan(c);
      if (!l.ok()) continue;  // below the fixed needs
      ++planned;
      const std::string at = "budget " + std::to_string(budget) + (overlap ? ", overlapped" : ", serial");
      EXPECT_GE(l->kept_chunks, kept) << at;
      EXPECT_GE(l->device_need, need) << at;
      EXPECT_LE(l->device_need, budget) << at;
      kept = l->kept_chunks;
      need = l->device_need;
    }
    EXPECT_GT(planned, 30);
    EXPECT_EQ(kept, 3) << "every chunk the keep plan allows is kept at 1.4 MB";
  }
}

// Predictions within kTieBand of the fastest are ties; the first choice among them is
// the one reserving the least memory, and the reason names the fastest it tied with.
TEST(Planner, AmongTiesTheLeastMemoryComesFirst) {
  auto candidate = [](const char* name, double s, uint64_t device, uint64_t host, bool fits = true) {
    PlanCandidate c;
    c.name = name;
    c.fits = fits;
    c.predicted_s = s;
    c.layout.device_need = device;
    c.layout.host_need = host;
    return c;
  };
  std::vector<PlanCandidate> all = {
      candidate("slow", 1.10, 1, 1), candidate("fast", 1.000, 500, 2000), candidate("tie", 1.015, 1500, 500),
      candidate("lean tie", 1.019, 900, 600), candidate("no fit", 0, 1, 1, false)};
  RankCandidates(all);
  std::vector<std::string> order;
  for (const PlanCandidate& c : all) order.push_back(c.name);
  EXPECT_EQ(order, (std::vector<std::string>{"lean tie", "tie", "fast", "slow", "no fit"}))
      << "1.5 kB, 2 kB, 2.5 kB reserved within 2%; then by time";
  const std::string why = ChoiceReason(all);
  EXPECT_NE(why.find("within 2% of the fastest predicted (fast, "), std::string::npos) << why;
  EXPECT_NE(why.find("the least memory reserved"), std::string::npos) << why;
  std::vector<PlanCandidate> apart = {candidate("lean", 1.021, 1, 1), candidate("fast", 1.0, 500, 2000)};
  RankCandidates(apart);
  EXPECT_EQ(apart.front().name, "fast") << "2.1% slower is no tie";
  EXPECT_EQ(ChoiceReason(apart), "the fastest predicted");
  EXPECT_EQ(ChoiceReason({candidate("no fit", 0, 1, 1, false)}), "") << "nothing fits";
}

TEST(Planner, NothingFitsAndEachSaysWhy) {
  Result<std::vector<PlanCandidate>> all =
      PlanWith("{\"strata\": {\"device_budget\": 4096, \"host_budget\": 4096}}");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  for (const PlanCandidate& c : *all) {
    EXPECT_FALSE(c.fits) << c.name;
    EXPECT_FALSE(c.refusal.empty()) << c.name;
  }
}

TEST(Planner, AKeyACombinationCannotHonourIsNamedNotDropped) {
  // strata.optimizer_resident keeps part of an NVMe optimizer's state in memory: the
  // other optimizer tiers cannot honour it, and the plan says so instead of resetting it.
  Result<std::vector<PlanCandidate>> all = PlanWith("{\"strata\": {\"optimizer_resident\": 0.5}}");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  int nvme = 0;
  for (const PlanCandidate& c : *all) {
    if (c.config.zero.offload_optimizer.device == OffloadDevice::kNvme) {
      ++nvme;
      EXPECT_TRUE(c.fits) << c.name << ": " << c.refusal;
      EXPECT_EQ(c.config.strata.optimizer_resident, 0.5);
    } else {
      EXPECT_FALSE(c.valid) << c.name;
      EXPECT_NE(c.refusal.find("strata.optimizer_resident"), std::string::npos) << c.refusal;
    }
  }
  EXPECT_EQ(nvme, 3);
  EXPECT_EQ(all->front().config.zero.offload_optimizer.device, OffloadDevice::kNvme) << "valid ones first";
}

TEST(MirrorWorld, PeersHoldWhatThisRankHolds) {
  auto w = CreateMirrorWorld(3);
  ASSERT_TRUE(w.ok());
  float in[2] = {1.5f, -2.0f}, out[6] = {};
  ASSERT_TRUE((*w)->AllGather(in, out, 2, DType::kF32).Wait().ok());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[2 * r], 1.5f);
  ASSERT_TRUE((*w)->AllReduce(in, out, 2, DType::kF32, ReduceOp::kSum).Wait().ok());
  EXPECT_EQ(out[1], -6.0f);
  ASSERT_TRUE((*w)->AllReduce(in, out, 2, DType::kF32, ReduceOp::kAvg).Wait().ok());
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_FALSE((*w)->Split(0, 0).ok());
  EXPECT_FALSE(CreateMirrorWorld(0).ok());
}

TEST(Rates, SavedProfileReadsBackAndBadOnesAreNamed) {
  LaneRates r = SomeRates();
  r.nvme_backend = "io_uring";
  Result<LaneRates> back = RatesFromJson(nlohmann::json{{"rates", RatesToJson(r)}});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->compute_flops_per_s, r.compute_flops_per_s);
  EXPECT_EQ(back->host_optimizer.overlap_factor, 1.2);
  EXPECT_EQ(back->nvme_backend, "io_uring");
  nlohmann::json bad = RatesToJson(r);
  bad.erase("copy_bytes_per_s");
  Result<LaneRates> missing = RatesFromJson(bad);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("copy_bytes_per_s"), std::string::npos);
  bad = RatesToJson(r);
  bad["device_optimizer"]["overlap_factor"] = "fast";
  Result<LaneRates> word = RatesFromJson(bad);
  ASSERT_FALSE(word.ok());
  EXPECT_NE(word.status().message().find("overlap_factor"), std::string::npos);
}

}  // namespace
}  // namespace strata::tools
