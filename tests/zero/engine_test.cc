// The engine at world size 1 (no mpirun): every combination against the reference,
// overlap, accumulation, clipping, fp16 overflow, bf16, budgets and bad configurations.
#include <oneapi/tbb/info.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>

#include "engine_checks.h"
#include "engine_plan.h"
#include "fake_gpu.h"
#include "single_world.h"

namespace strata::testing {
namespace {

TEST(Engine, EveryStageAndOffloadMatchesTheReference) { CheckAllCombos(World()); }
TEST(Engine, OverlappedStepEqualsSerialStep) { CheckOverlapEqualsSerial(World(), ""); }
TEST(Engine, OverlappedStepEqualsSerialStepWhenClipping) {
  CheckOverlapEqualsSerial(World(), R"({"gradient_clipping": 0.05})");
}
TEST(Engine, OverlappedStepEqualsSerialStepWithFp16Overflow) {
  CheckOverlapEqualsSerial(World(), R"({"fp16": {"enabled": true, "initial_scale_power": 24}})");
}
TEST(Engine, RandomizedSpeculativeCommitAndRollbackEqualSerial) {
  for (uint64_t seed : {1, 2, 3}) CheckRandomizedSpeculation(World(), seed, 6);
}
TEST(Engine, AccumulationEqualsLargerBatch) { CheckAccumulation(World()); }
TEST(Engine, ClippingMatchesTheReference) { CheckClipping(World()); }
TEST(Engine, Fp16OverflowStepsAreSkippedAsInTheReference) { CheckFp16Overflow(World()); }
TEST(Engine, Bf16MatchesTheReference) { CheckBf16(World()); }

// A device communicator must take device buffers (checked before the device is used,
// so a fake GPU serves); one rank needs none. On sim the model runs the CPU kernels.
TEST(Engine, DeviceCommunicatorMustBeADeviceOne) {
  FakeGpu gpu;
  const zero::TrainSpec spec = SmallSpec(1);
  ParamInit init = [&](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(spec.model, id, b, n, out);
  };
  EngineResources res{&World(), &gpu};
  res.device_comm = &World();
  auto e = Engine::Create(MakeConfig({1, "none", "none"}), model::MlpModules(spec.model), init, res);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << e.status().ToString();
  EXPECT_NE(e.status().message().find("EngineResources.device_comm must be a device (NCCL) communicator"),
            std::string::npos)
      << e.status().message();

  auto sim = CreateDevice({DeviceKind::kSim, 0, 0});
  ASSERT_TRUE(sim.ok()) << sim.status().ToString();
  auto engine = Engine::Create(MakeConfig({1, "none", "none"}), model::MlpModules(spec.model), init,
                               EngineResources{&World(), sim->get()});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  EXPECT_EQ((*engine)->model_backend(), model::Backend::kCpu);
  EXPECT_EQ((*engine)->model_stream(), nullptr);
}

// strata.optimizer_threads: the speculative CPU Adam's threads change when it runs, not
// what it computes (each element's update is its own).
TEST(Engine, SpeculativeStepsOnMoreThreadsComputeTheSame) {
  if (tbb::info::default_concurrency() < 2)
    GTEST_SKIP() << "one core: no second thread to give the optimizer";
  const zero::TrainSpec spec = SmallSpec(6);
  for (const Combo& c : {Combo{2, "cpu", "none"}, Combo{3, "cpu", "cpu"}, Combo{3, "nvme", "nvme"}}) {
    EngineRun one =
        RunEngine(World(), MakeConfig(c, R"({"strata": {"overlap": true, "optimizer_threads": 1}})"), spec);
    EngineRun two =
        RunEngine(World(), MakeConfig(c, R"({"strata": {"overlap": true, "optimizer_threads": 2}})"), spec);
    ASSERT_TRUE(one.status.ok()) << one.status.ToString();
    ASSERT_TRUE(two.status.ok()) << two.status.ToString();
    EXPECT_TRUE(BitIdentical(one, two)) << ComboName(c);
  }
}

TEST(Engine, OptimizerThreadsAreAutoOrAtMostTheCores) {
  const zero::TrainSpec spec = SmallSpec(1);
  const int cores = tbb::info::default_concurrency();
  // Auto: one beside a backward that runs on the cores (sim), every core beside a GPU's.
  auto sim = PlanOnly(MakeConfig({2, "cpu", "none"}), spec);
  ASSERT_TRUE(sim.ok()) << sim.status().ToString();
  EXPECT_EQ(sim->optimizer_threads, 1);
  FakeGpu gpu;
  auto on_gpu = Engine::Plan(MakeConfig({2, "cpu", "none"}), model::MlpModules(spec.model),
                             EngineResources{&World(), &gpu});
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status().ToString();
  EXPECT_EQ(on_gpu->optimizer_threads, cores);
  auto given = PlanOnly(MakeConfig({2, "cpu", "none"}, R"({"strata": {"optimizer_threads": 1}})"), spec);
  ASSERT_TRUE(given.ok()) << given.status().ToString();
  EXPECT_EQ(given->optimizer_threads, 1);
  // More than the cores is refused, naming the key and the cores.
  EngineRun over = RunEngine(World(),
                             MakeConfig({2, "cpu", "none"}, R"({"strata": {"optimizer_threads": )" +
                                                                std::to_string(cores + 1) + "}}"),
                             spec);
  ASSERT_EQ(over.status.code(), StatusCode::kInvalidArgument) << over.status.ToString();
  EXPECT_NE(over.status.message().find("strata.optimizer_threads"), std::string::npos)
      << over.status.message();
  EXPECT_NE(over.status.message().find(std::to_string(cores) + " cores"), std::string::npos)
      << over.status.message();
  for (const char* bad : {"0", "1.5", R"("many")", "-1"}) {
    auto parsed =
        ParseConfig(nlohmann::json::parse(std::string(R"({"strata": {"optimizer_threads": )") + bad + "}}"));
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("strata.optimizer_threads"), std::string::npos)
        << parsed.status().message();
  }
}

TEST(Engine, DeviceBudgetTooSmallIsRefusedAtStart) {
  Config c = MakeConfig({2, "none", "none"}, R"({"strata": {"device_budget": "64KiB"}})");
  EngineRun run = RunEngine(World(), c, SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kOutOfBudget) << run.status.ToString();
  EXPECT_NE(run.status.message().find("device tier"), std::string::npos) << run.status.message();
  EXPECT_NE(run.status.message().find("needs"), std::string::npos) << run.status.message();
  // The same model fits once its state is offloaded.
  Config off = MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"device_budget": "512KiB"}})");
  EngineRun ok = RunEngine(World(), off, SmallSpec(2));
  EXPECT_TRUE(ok.status.ok()) << ok.status.ToString();
  EXPECT_LE(ok.device_high_water, 512u * 1024);
}

TEST(Engine, HostBudgetTooSmallIsRefusedAtStart) {
  Config c = MakeConfig({2, "cpu", "none"}, R"({"strata": {"host_budget": "16KiB"}})");
  EngineRun run = RunEngine(World(), c, SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kOutOfBudget) << run.status.ToString();
  EXPECT_NE(run.status.message().find("host"), std::string::npos) << run.status.message();
}

// The NVMe optimizer steps a shard in pieces: as many as sub_group_size asks for, and
// never more than 16 MiB of state per piece whatever the chunk size.
TEST(Engine, NvmeOptimizerPiecesFollowSubGroupSizeAndTheStateCap) {
  zero::TrainSpec spec = SmallSpec(1);
  auto whole = PlanOnly(MakeConfig({3, "nvme", "nvme"}), spec);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->optimizer_pieces, 1) << "a small shard is one piece by default";
  auto cut = PlanOnly(MakeConfig({3, "nvme", "nvme", "auto", kPiecedSubGroup}), spec);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_GT(cut->optimizer_pieces, 1);
  EXPECT_LE(cut->optimizer_piece_elems, kPiecedSubGroup);
  // Chunk 0 holds the 64 x 96 layer (6240 elements) in 8192: its last piece is padding.
  EXPECT_GE(cut->optimizer_padding_pieces, 1);
  EXPECT_EQ(whole->optimizer_padding_pieces, 0) << "a whole-shard piece always holds a tensor";
  EXPECT_GE(cut->optimizer_piece_elems * cut->optimizer_pieces, cut->shard_elems);
  EXPECT_LT(cut->optimizer_piece_elems * (cut->optimizer_pieces - 1), cut->shard_elems);
  // A 1536 x 1536 layer: 28 MB of master | m | v in one chunk, so two pieces.
  spec.model.input_dim = 1536;
  spec.model.hidden = {1536};
  auto big = PlanOnly(MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"chunk_size": "16MiB"}})"), spec);
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->optimizer_pieces, 2);
  EXPECT_LE(big->optimizer_piece_elems * 12, 16 << 20);
  EXPECT_EQ(big->optimizer_staging_sets, 2) << "one chunk of two pieces never uses more than two sets";
}

// fp32 with both on NVMe reads the parameter shard from the optimizer state; bf16, and
// pieces too small to align, keep a parameter swap, which the NVMe need shows.
TEST(Engine, ParametersComeFromTheOptimizerStateOnlyWhereTheyAreTheMaster) {
  zero::TrainSpec spec = SmallSpec(1);
  auto fp32 = PlanOnly(MakeConfig({3, "nvme", "nvme"}), spec);
  auto pieced = PlanOnly(MakeConfig({3, "nvme", "nvme", "auto", kPiecedSubGroup}), spec);
  auto small = PlanOnly(MakeConfig({3, "nvme", "nvme", "auto", kSmallPieceSubGroup}), spec);
  auto bf16 = PlanOnly(MakeConfig({3, "nvme", "nvme"}, R"({"bf16": {"enabled": true}})"), spec);
  auto host_params = PlanOnly(MakeConfig({3, "nvme", "cpu"}), spec);
  for (const auto* r : {&fp32, &pieced, &small, &bf16, &host_params})
    ASSERT_TRUE(r->ok()) << r->status().ToString();
  EXPECT_TRUE(fp32->params_in_optimizer_state);
  EXPECT_TRUE(pieced->params_in_optimizer_state);
  EXPECT_EQ(pieced->optimizer_piece_elems % 1024, 0);
  EXPECT_FALSE(small->params_in_optimizer_state);
  EXPECT_LE(small->optimizer_piece_elems, kSmallPieceSubGroup) << "sub_group_size still bounds the pieces";
  EXPECT_FALSE(bf16->params_in_optimizer_state);
  EXPECT_FALSE(host_params->params_in_optimizer_state);
  // The optimizer state and gradients on disk are the same in bf16; only its parameter
  // swap (one aligned 16-bit shard per chunk) is more.
  const uint64_t bf16_swap = bf16->num_chunks * ((bf16->shard_elems * 2 + 4095) / 4096 * 4096);
  EXPECT_EQ(bf16->nvme_need, fp32->nvme_need + bf16_swap);
}

// strata.gradients "auto": a host budget that cannot hold one fp32 gradient shard per
// chunk puts them on NVMe instead of refusing, and training still equals the reference.
TEST(Engine, AutoMovesGradientsToNvmeWhenTheHostBudgetIsShort) {
  zero::TrainSpec spec = SmallSpec(10);
  spec.model.hidden.assign(16, 64);  // many chunks: host-resident gradients cost many shards
  auto budget_json = [](uint64_t b) { return R"({"strata": {"host_budget": )" + std::to_string(b) + "}}"; };
  // The smallest budget (in 16 KiB steps) that holds the plan with gradients on NVMe.
  uint64_t budget = 0;
  for (uint64_t b = 64 * 1024; b <= 8 * 1024 * 1024 && budget == 0; b += 16 * 1024) {
    if (PlanOnly(MakeConfig({3, "nvme", "nvme", "nvme"}, budget_json(b)), spec).ok()) budget = b;
  }
  ASSERT_GT(budget, 0u) << "no budget up to 8 MiB holds the NVMe-gradient plan";
  auto host = PlanOnly(MakeConfig({3, "nvme", "nvme", "host"}, budget_json(budget)), spec);
  ASSERT_FALSE(host.ok())
      << "the budget must be too small for gradients in memory, or this test proves nothing";
  EXPECT_EQ(host.status().code(), StatusCode::kOutOfBudget) << host.status().ToString();
  auto plan = PlanOnly(MakeConfig({3, "nvme", "nvme"}, budget_json(budget)), spec);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->gradients_on_nvme);
  EXPECT_LE(plan->host_need, budget);
  // With room: in memory when clipping could make a step be redone from them (the NVMe
  // path would write them), on NVMe when nothing can (it writes nothing then).
  auto roomy = PlanOnly(MakeConfig({3, "nvme", "nvme"}, R"({"gradient_clipping": 1.0})"), spec);
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  EXPECT_FALSE(roomy->gradients_on_nvme) << "with room and clipping, gradients stay in memory";
  auto unclipped = PlanOnly(MakeConfig({3, "nvme", "nvme"}), spec);
  ASSERT_TRUE(unclipped.ok()) << unclipped.status().ToString();
  EXPECT_TRUE(unclipped->gradients_on_nvme) << "without clipping the NVMe path writes nothing";
  auto accumulating =
      PlanOnly(MakeConfig({3, "nvme", "nvme"}, R"({"gradient_accumulation_steps": 4})"), spec);
  ASSERT_TRUE(accumulating.ok()) << accumulating.status().ToString();
  EXPECT_FALSE(accumulating->gradients_on_nvme) << "accumulating writes and reads them back each micro-batch";
  auto short_accumulating = PlanOnly(
      MakeConfig({3, "nvme", "nvme"}, R"({"gradient_accumulation_steps": 4, "strata": {"host_budget": )" +
                                          std::to_string(budget) + "}}"),
      spec);
  ASSERT_TRUE(short_accumulating.ok()) << short_accumulating.status().ToString();
  EXPECT_TRUE(short_accumulating->gradients_on_nvme) << "a budget too small for them still puts them there";
  auto serial = PlanOnly(MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"overlap": false}})"), spec);
  ASSERT_TRUE(serial.ok()) << serial.status().ToString();
  EXPECT_FALSE(serial->gradients_on_nvme) << "a serial step would read them back";

  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, World().size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EngineRun run = RunEngine(World(), MakeConfig({3, "nvme", "nvme"}, budget_json(budget)), spec);
  ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, "auto gradients on NVMe");
  for (const auto& r : run.log.results) EXPECT_LE(r.host_high_water, budget);
}

// Pieces under the tightest host budget that holds them: one to three staging sets, so
// the step reuses the sets of its own writes behind; training still equals the
// reference, with and without overlap, and the host high water stays under the budget.
TEST(Engine, PiecedNvmeStepUnderTheSmallestBudgetEqualsTheReference) {
  zero::TrainSpec spec = SmallSpec(8);
  spec.model.hidden.assign(6, 64);
  auto json = [](uint64_t b, bool overlap) {
    return R"({"strata": {"host_budget": )" + std::to_string(b) + R"(, "overlap": )" +
           (overlap ? "true" : "false") + "}}";
  };
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, World().size());
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (bool overlap : {true, false}) {
    const Combo c{3, "nvme", "nvme", "auto", kPiecedSubGroup};
    uint64_t budget = 0;
    for (uint64_t b = 64 * 1024; b <= 8 * 1024 * 1024 && budget == 0; b += 8 * 1024) {
      if (PlanOnly(MakeConfig(c, json(b, overlap)), spec).ok()) budget = b;
    }
    ASSERT_GT(budget, 0u) << "no budget up to 8 MiB holds the pieced plan";
    auto plan = PlanOnly(MakeConfig(c, json(budget, overlap)), spec);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_GT(plan->optimizer_pieces, 1);
    EXPECT_LE(plan->optimizer_staging_sets, 3) << "the smallest budget should leave little room for sets";
    EngineRun run = RunEngine(World(), MakeConfig(c, json(budget, overlap)), spec);
    ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol,
                           std::string("pieced, smallest budget, overlap ") + (overlap ? "on" : "off"));
    for (const auto& r : run.log.results) EXPECT_LE(r.host_high_water, budget);
  }
}

// The gather window (how far ahead stage 3 prefetches) changes when parameters move,
// never the arithmetic; DeepSpeed's bounds on it shrink the device memory it takes.
TEST(Engine, GatherWindowBoundsAreHonouredAndChangeNoResult) {
  zero::TrainSpec spec = SmallSpec(4);
  spec.model.hidden.assign(8, 64);
  const Combo c{3, "cpu", "nvme"};
  EngineRun wide = RunEngine(World(), MakeConfig(c), spec);
  // Without keeping chunks from forward to backward, which would take the room back.
  EngineRun no_prefetch = RunEngine(
      World(),
      MakeConfig(
          c, R"({"zero_optimization": {"stage3_prefetch_bucket_size": 1, "stage3_max_reuse_distance": 0}})"),
      spec);
  EngineRun one_live =
      RunEngine(World(), MakeConfig(c, R"({"zero_optimization": {"stage3_max_live_parameters": 1}})"), spec);
  for (const EngineRun* r : {&wide, &no_prefetch, &one_live})
    ASSERT_TRUE(r->status.ok()) << r->status.ToString();
  EXPECT_TRUE(BitIdentical(wide, no_prefetch));
  EXPECT_TRUE(BitIdentical(wide, one_live));
  EXPECT_LT(no_prefetch.device_high_water, wide.device_high_water);
  EXPECT_LT(one_live.device_high_water, wide.device_high_water);
  // The depth is measured each step, within what the bounds leave: none when they leave
  // no room for a module ahead, as deep as the budget allows in the first (unmeasured)
  // step.
  for (const auto& r : no_prefetch.log.results) EXPECT_EQ(r.prefetch_modules, 0);
  for (const auto& r : one_live.log.results) EXPECT_EQ(r.prefetch_modules, 0);
  ASSERT_FALSE(wide.log.results.empty());
  const int first = wide.log.results.front().prefetch_modules;
  EXPECT_GT(first, 1) << "the first step prefetches as far as the budget allows";
  for (const auto& r : wide.log.results) {
    EXPECT_GE(r.prefetch_modules, 1);
    EXPECT_LE(r.prefetch_modules, first);
  }
}

// `strata_keys` (JSON members without braces) with no prefetch window and reuse distance
// 0: the last module's chunk kept, the first module's carried, nothing else.
Config LeastKeepingConfig(const Combo& c, const std::string& strata_keys) {
  return MakeConfig(c, "{" + strata_keys + R"(, "zero_optimization": {"stage3_max_reuse_distance": 0,
                                                                      "stage3_prefetch_bucket_size": 1}})");
}

// Gathered chunks released early for lack of a planned buffer, over a run: the buffer
// plan and the engine disagreed.
int GatherEvictions(const EngineRun& r) {
  int n = 0;
  for (const auto& s : r.log.results) n += s.gather_evictions;
  return n;
}

// Bytes all-gathered over a run; with one rank nothing else counts as collective bytes.
uint64_t AllGatheredBytes(const EngineRun& r) {
  uint64_t b = 0;
  for (const auto& s : r.log.results) b += s.bytes_comm;
  return b;
}

// Chunks kept gathered from forward to backward are not fetched, copied and gathered a
// second time, and change nothing in the result. Kept is what the device budget leaves
// after the prefetch window, nearest reuse first, within stage3_max_reuse_distance and
// stage3_max_live_parameters; chunks of tensors under stage3_param_persistence_threshold
// are kept whatever the reuse distance.
TEST(Engine, KeptChunksAreGatheredOnceAndChangeNoResult) {
  zero::TrainSpec spec = SmallSpec(4);
  spec.model.hidden.assign(8, 64);
  for (const Combo& c : {Combo{3, "nvme", "nvme"}, Combo{3, "cpu", "cpu"}}) {
    SCOPED_TRACE(ComboName(c));
    const std::string small = R"("strata": {"chunk_size": "16KiB", "device_budget": "16MiB"})";
    EngineRun kept = RunEngine(World(), MakeConfig(c, "{" + small + "}"), spec);
    EngineRun none = RunEngine(World(), LeastKeepingConfig(c, small), spec);
    EngineRun live = RunEngine(
        World(), MakeConfig(c, "{" + small + R"(, "zero_optimization": {"stage3_max_live_parameters": 1}})"),
        spec);
    EngineRun persist = RunEngine(
        World(), MakeConfig(c, "{" + small + R"(, "zero_optimization": {"stage3_max_reuse_distance": 0,
                                     "stage3_prefetch_bucket_size": 1,
                                     "stage3_param_persistence_threshold": 1e9}})"),
        spec);
    for (const EngineRun* r : {&kept, &none, &live, &persist}) {
      ASSERT_TRUE(r->status.ok()) << r->status.ToString();
      EXPECT_EQ(GatherEvictions(*r), 0) << "the planned buffers held every chunk the engine kept";
    }
    ASSERT_FALSE(kept.log.results.empty());
    const int chunks = kept.num_chunks;
    EXPECT_EQ(kept.kept_chunks, chunks) << "the device budget holds every chunk";
    EXPECT_EQ(none.kept_chunks, 1) << "distance 0: only the last module's chunk";
    // stage3_max_live_parameters leaves room for the running module's chunk alone: the
    // last chunk is kept (it costs no buffer: its backward follows its forward), and no
    // more buffers are allocated than with no window and nothing else kept.
    EXPECT_EQ(live.kept_chunks, 1);
    EXPECT_EQ(live.device_high_water, none.device_high_water);
    EXPECT_EQ(persist.kept_chunks, chunks) << "every tensor is under the threshold";
    EXPECT_TRUE(BitIdentical(kept, none));
    EXPECT_TRUE(BitIdentical(kept, live));
    EXPECT_TRUE(BitIdentical(kept, persist));
    // Each chunk is all-gathered once per micro-batch when kept; without a window and with
    // only the last chunk kept, every other chunk twice (one rank: only gathers count).
    ASSERT_GT(AllGatheredBytes(kept), 0u);
    EXPECT_EQ(AllGatheredBytes(none) * chunks, AllGatheredBytes(kept) * (2 * chunks - 1));
    EXPECT_EQ(AllGatheredBytes(kept), AllGatheredBytes(persist));
    if (std::string(c.param) == "nvme") {
      auto read = [](const EngineRun& r) {
        uint64_t b = 0;
        for (const auto& s : r.log.results) b += s.bytes_nvme_read;
        return b;
      };
      EXPECT_LT(read(kept), read(none)) << "kept chunks are not read from NVMe again";
    }
  }
}

// With gradient accumulation, chunks also stay from one micro-batch's backward to the
// next one's forward (the parameters change only at the step): with a budget that holds
// them all, each chunk is all-gathered once per step instead of twice per micro-batch,
// and the result is the same.
TEST(Engine, CarriedChunksAreGatheredOncePerStepAndChangeNoResult) {
  zero::TrainSpec spec = SmallSpec(3);
  spec.model.hidden.assign(8, 64);
  spec.micro_batch = 2;
  const int micro_batches = 4;
  for (const Combo& c : {Combo{3, "nvme", "nvme"}, Combo{3, "cpu", "cpu"}}) {
    SCOPED_TRACE(ComboName(c));
    const std::string base =
        R"("gradient_accumulation_steps": 4, "strata": {"chunk_size": "16KiB", "device_budget": "16MiB"})";
    EngineRun all = RunEngine(World(), MakeConfig(c, "{" + base + "}"), spec);
    // Distance 0: the last chunk kept, the first carried, no window.
    EngineRun least = RunEngine(World(), LeastKeepingConfig(c, base), spec);
    ASSERT_TRUE(all.status.ok()) << all.status.ToString();
    ASSERT_TRUE(least.status.ok()) << least.status.ToString();
    EXPECT_EQ(GatherEvictions(all), 0);
    EXPECT_EQ(GatherEvictions(least), 0);
    // A budget that holds some of the chunks: the plan keeps and carries what fits, and the
    // engine never needs a buffer the plan did not count.
    EngineRun part = RunEngine(
        World(), MakeConfig(c, R"({"gradient_accumulation_steps": 4, "strata": {"chunk_size": "16KiB",
                                                                            "device_budget": "200KiB"}})"),
        spec);
    ASSERT_TRUE(part.status.ok()) << part.status.ToString();
    // (5 kept and 5 carried of 8 today.)
    EXPECT_LT(part.kept_chunks + part.carried_chunks, 2 * all.num_chunks)
        << "the budget must not hold everything";
    EXPECT_GT(part.carried_chunks, 0);
    EXPECT_EQ(GatherEvictions(part), 0);
    EXPECT_TRUE(BitIdentical(all, part));
    const int chunks = all.num_chunks;
    EXPECT_EQ(all.carried_chunks, chunks);
    EXPECT_EQ(least.carried_chunks, 1);
    EXPECT_TRUE(BitIdentical(all, least));
    ASSERT_GT(AllGatheredBytes(all), 0u);
    // least: every chunk twice per micro-batch but the kept last one, and the carried
    // first one's forward gather saved in every micro-batch after the first.
    const uint64_t least_per_step = micro_batches * (2 * chunks - 1) - (micro_batches - 1);
    EXPECT_EQ(AllGatheredBytes(least) * chunks, AllGatheredBytes(all) * least_per_step);
  }
}

// A device budget that cannot hold the persistent chunks is refused at creation, naming
// the key that asks for them.
TEST(Engine, PersistentChunksBeyondTheDeviceBudgetAreRefused) {
  zero::TrainSpec spec = SmallSpec(1);
  spec.model.hidden.assign(8, 64);
  const Combo c{3, "cpu", "cpu"};
  const std::string base = R"("strata": {"chunk_size": "16KiB", "device_budget": "200KiB"})";
  EngineRun fits = RunEngine(World(), MakeConfig(c, "{" + base + "}"), spec);
  ASSERT_TRUE(fits.status.ok()) << fits.status.ToString();
  EngineRun refused = RunEngine(
      World(),
      MakeConfig(c, "{" + base + R"(, "zero_optimization": {"stage3_param_persistence_threshold": 1e9}})"),
      spec);
  ASSERT_FALSE(refused.status.ok());
  EXPECT_EQ(refused.status.code(), StatusCode::kOutOfBudget) << refused.status.ToString();
  EXPECT_NE(refused.status.message().find("stage3_param_persistence_threshold"), std::string::npos)
      << refused.status.ToString();
}

// The prefetch window with shards on NVMe is no deeper than the pinned staging buffers
// their reads go through (three): gathers beyond them would only queue. With shards in
// pinned host memory it may go deeper, as the device budget allows. Either way the result
// equals the narrowest window's. The run is watched: fetches that wait for staging
// buffers held by gathers queued behind them deadlock (they did once the window was
// deeper than the buffers), and that should fail here rather than hang until ctest's
// timeout.
TEST(Engine, PrefetchWindowFollowsWhereTheShardsAre) {
  zero::TrainSpec spec = SmallSpec(6);
  spec.model.hidden.assign(16, 256);
  spec.micro_batch = 32;
  for (const Combo& c : {Combo{3, "nvme", "nvme"}, Combo{3, "nvme", "cpu"}}) {
    auto run = std::async(std::launch::async, [&] {
      return RunEngine(World(), MakeConfig(c, R"({"strata": {"chunk_size": "256KiB"}})"), spec);
    });
    if (run.wait_for(std::chrono::seconds(120)) != std::future_status::ready) {
      std::fprintf(stderr, "PrefetchWindowFollowsWhereTheShardsAre: no progress in 120 s (deadlock)\n");
      std::_Exit(1);
    }
    EngineRun deep = run.get();
    ASSERT_TRUE(deep.status.ok()) << deep.status.ToString();
    ASSERT_FALSE(deep.log.results.empty());
    const int first = deep.log.results.front().prefetch_modules;
    if (std::string(c.param) == "nvme") {
      EXPECT_EQ(first, 3) << "as many modules ahead as staging buffers";
    } else {
      EXPECT_GT(first, 3) << "pinned shards: as deep as the device budget allows";
    }
    EngineRun narrow = RunEngine(
        World(),
        MakeConfig(
            c,
            R"({"strata": {"chunk_size": "256KiB"}, "zero_optimization": {"stage3_prefetch_bucket_size": 1}})"),
        spec);
    ASSERT_TRUE(narrow.status.ok()) << narrow.status.ToString();
    EXPECT_TRUE(BitIdentical(deep, narrow)) << ComboName(c);
  }
}

// With parameters and optimizer on NVMe the next forward copies the shards the step
// wrote last from the pinned buffers they were written from, instead of reading them
// back. The result must stay bit-identical to parameters on the host (same arithmetic),
// also when clipping redoes the speculative steps and when fp16 overflow skips a step
// (the speculated shards are then republished from the master, so the copies in memory
// are stale and must not be served).
TEST(Engine, ShardsServedFromMemoryChangeNoResult) {
  zero::TrainSpec spec = SmallSpec(8);
  spec.model.hidden.assign(8, 64);
  for (const std::string& extra :
       {std::string("{}"), std::string(R"({"gradient_clipping": 0.05})"),
        std::string(R"({"fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 4}})")}) {
    EngineRun nvme = RunEngine(World(), MakeConfig({3, "nvme", "nvme"}, extra), spec);
    EngineRun host = RunEngine(World(), MakeConfig({3, "nvme", "cpu"}, extra), spec);
    ASSERT_TRUE(nvme.status.ok()) << extra << ": " << nvme.status.ToString();
    ASSERT_TRUE(host.status.ok()) << extra << ": " << host.status.ToString();
    EXPECT_TRUE(BitIdentical(nvme, host)) << extra;
    ASSERT_EQ(nvme.log.results.size(), static_cast<size_t>(spec.steps));
    EXPECT_EQ(nvme.log.results[0].shards_from_memory, 0) << "the first forward has only what was initialised";
    int served = 0;
    for (const auto& r : nvme.log.results) served += r.shards_from_memory;
    EXPECT_GT(served, 0) << extra;
    for (size_t i = 1; extra == "{}" && i < nvme.log.results.size(); ++i) {
      EXPECT_GT(nvme.log.results[i].shards_from_memory, 0) << "step " << i;
    }
    for (const auto& r : host.log.results) EXPECT_EQ(r.shards_from_memory, 0);
  }
}

// Training may stop between hooks: reads already issued (the optimizer-state read-ahead
// starts with the first forward) must finish before their buffers go. Under ASan a read
// landing in freed memory fails this test.
TEST(Engine, DestroyedMidStepWaitsForItsReads) {
  auto t = MakeEngine(MakeConfig({3, "nvme", "nvme", "nvme"}), SmallSpec(1));
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(t->engine->Fetch(0).ok());
  ASSERT_TRUE(t->engine->Release(0).ok());
  t->engine.reset();
}

// A model kernel that fails between BeginBackward and EndBackward leaves that
// backward open: its chunk's gradients were never reduced, so Step() refuses, at every
// stage (stage 3 also sees the chunk still held).
TEST(Engine, StepWithABackwardLeftOpenIsRefused) {
  const zero::TrainSpec spec = SmallSpec(1);
  const int last = static_cast<int>(model::MlpModules(spec.model).modules.size()) - 1;
  for (const Combo& c : {Combo{1, "cpu", "none"}, Combo{2, "none", "none"}, Combo{3, "cpu", "cpu"}}) {
    auto t = MakeEngine(MakeConfig(c), spec);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    Engine& e = *t->engine;
    ASSERT_TRUE(e.BeginMicroBatch().ok());
    ASSERT_TRUE(e.BeginBackward(last).ok());
    auto step = e.Step();
    ASSERT_FALSE(step.ok()) << ComboName(c);
    EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition) << step.status().ToString();
    const bool named = step.status().message().find("is open") != std::string::npos ||
                       step.status().message().find("hooks hold chunk") != std::string::npos;
    EXPECT_TRUE(named) << ComboName(c) << ": " << step.status().message();
  }
}

TEST(Engine, HookWithABadModuleIndexIsRefusedByName) {
  const zero::TrainSpec spec = SmallSpec(1);
  auto t = MakeEngine(MakeConfig({3, "cpu", "cpu"}), spec);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Engine& e = *t->engine;
  const int n = static_cast<int>(model::MlpModules(spec.model).modules.size());
  std::vector<Status> refused = {e.Fetch(-1).status(), e.Fetch(n).status(), e.Release(n),
                                 e.BeginBackward(n).status(), e.EndBackward(-1)};
  for (const Status& st : refused) {
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.message();
  }
}

// Flush waits for the writes behind between steps; inside a micro-batch the optimizer
// worker owns them, so it is refused there, and allowed again after Step().
TEST(Engine, FlushInsideAMicroBatchIsRefused) {
  const zero::TrainSpec spec = SmallSpec(1);
  auto t = MakeEngine(MakeConfig({3, "nvme", "nvme"}), spec);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Engine& e = *t->engine;
  EXPECT_TRUE(e.Flush().ok());
  ASSERT_TRUE(e.BeginMicroBatch().ok());
  Status st = e.Flush();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("after Step()"), std::string::npos) << st.message();
}

TEST(Engine, GradientsOnNvmeNeedTheOptimizerOnNvme) {
  EngineRun run = RunEngine(World(), MakeConfig({3, "cpu", "nvme", "nvme"}), SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.ToString();
  EXPECT_NE(run.status.message().find("strata.gradients"), std::string::npos) << run.status.message();
}

TEST(Engine, NvmeOptimizerOffloadNeedsStage3) {
  Config c = MakeConfig({2, "none", "none"});
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  c.zero.offload_optimizer.nvme_path = {SwapDir()};
  EngineRun run = RunEngine(World(), c, SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.ToString();
  EXPECT_NE(run.status.message().find("stage 3"), std::string::npos);
}

}  // namespace
}  // namespace strata::testing
