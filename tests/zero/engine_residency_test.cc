// Partial residency of the NVMe optimizer (strata.optimizer_resident): the host budget
// decides how many chunks stay in pinned memory, their NVMe traffic goes, and training
// still equals the single-rank reference. Every stage x offload combination with half
// the chunks resident is in AllCombos (engine_test, engine_mpi_test at 2 and 4 ranks),
// and so are a CPU optimizer's chunks kept on the device (offload_optimizer.ratio).
#include "residency_sweep.h"

namespace strata::testing {
namespace {

// The gradients in memory, so that the only NVMe traffic is the optimizer state's.
Config Auto(uint64_t host_budget) {
  return MakeConfig({3, "nvme", "none", "host", 0, -1},
                    R"({"strata": {"host_budget": )" + std::to_string(host_budget) + "}}");
}

// Host budgets from the least that fits, in 16 KiB steps, until every chunk is resident.
std::vector<std::pair<uint64_t, int>> Sweep(const zero::TrainSpec& spec, int* num_chunks) {
  return SweepBudgets(spec,
                      {64 * 1024, 16 * 1024 * 1024, 16 * 1024, Auto,
                       [](const EngineLayoutInfo& l) { return l.optimizer_resident_chunks; }},
                      num_chunks);
}

TEST(EngineResidency, ResidentChunksGrowWithTheHostBudget) {
  int n = 0;
  const auto sweep = Sweep(ManyChunks(1), &n);
  ASSERT_FALSE(sweep.empty()) << "no budget up to 16 MiB holds the plan";
  ASSERT_GE(n, 6);
  EXPECT_EQ(sweep.front().second, 0) << "the least budget that fits holds no chunk";
  EXPECT_EQ(sweep.back().second, n) << "a large enough budget holds every chunk";
  // Once the chunks left on disk are fewer than the pipeline's depth, each more resident
  // chunk frees a staging set of about its size, so the last counts come almost at once.
  EXPECT_GE(DistinctNonDecreasing(sweep), n / 2) << "partial counts are planned on the way";
  // With the default host budget (half this machine's memory) everything is resident.
  auto roomy = PlanOnly(MakeConfig({3, "nvme", "nvme", "auto", 0, -1}), ManyChunks(1));
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  EXPECT_EQ(roomy->optimizer_resident_chunks, roomy->num_chunks);
}

// NVMe bytes per step fall in proportion to the chunks resident, and every budget's run
// equals the reference.
TEST(EngineResidency, NvmeBytesFallInProportionAndResultsStayTheReferences) {
  const zero::TrainSpec spec = ManyChunks(3);
  int n = 0;
  const auto sweep = Sweep(spec, &n);
  ASSERT_FALSE(sweep.empty());
  uint64_t read0 = 0, written0 = 0;
  const auto runs = RunEachCount(spec, sweep, Auto, [](const EngineRun& r) { return r.resident_chunks; });
  ASSERT_EQ(static_cast<int>(runs.size()), DistinctNonDecreasing(sweep));
  for (const auto& [k, last] : runs) {
    if (k == 0) {
      read0 = last.bytes_nvme_read, written0 = last.bytes_nvme_written;
      ASSERT_GT(read0, 0u);
      continue;
    }
    EXPECT_EQ(last.bytes_nvme_read * n, read0 * (n - k)) << k << " of " << n << " resident";
    EXPECT_EQ(last.bytes_nvme_written * n, written0 * (n - k)) << k << " of " << n << " resident";
  }
}

// Clipping sends every gradient shard on the NVMe path to disk (a clipped step is
// redone from it): what the budget leaves keeps shards in pinned memory instead, with
// the state on disk (optimizer_resident 0), and their writes and reads go.
Config ClippedAt(uint64_t host_budget) {
  return MakeConfig(
      {3, "nvme", "none", "auto", 0, 0},
      R"({"gradient_clipping": 0.05, "strata": {"host_budget": )" + std::to_string(host_budget) + "}}");
}

// Gradient shards in pinned memory: every one once the budget holds them all (the plan
// then takes them off the NVMe path).
int KeptShards(const EngineLayoutInfo& l) {
  return l.gradients_on_nvme ? l.optimizer_resident_chunks + l.gradient_resident_chunks : l.num_chunks;
}

TEST(EngineResidency, KeptGradientShardsGrowWithTheBudgetAndTheirDiskTrafficGoes) {
  const zero::TrainSpec spec = ManyChunks(3);
  int n = 0;
  const auto sweep = SweepBudgets(spec, {64 * 1024, 16 * 1024 * 1024, 8 * 1024, ClippedAt, KeptShards}, &n);
  ASSERT_FALSE(sweep.empty()) << "no budget up to 16 MiB holds the plan";
  ASSERT_GE(n, 6);
  EXPECT_EQ(sweep.front().second, 0);
  EXPECT_EQ(sweep.back().second, n);
  EXPECT_GE(DistinctNonDecreasing(sweep), n / 2);
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, R"({"gradient_clipping": 0.05})"), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  // Per kept shard, the same bytes fewer each way: a line from none kept to all kept.
  std::vector<std::pair<int, StepResult>> runs;
  for (const auto& [budget, k] : sweep) {
    if (!runs.empty() && runs.back().first == k) continue;
    EngineRun run = RunEngine(World(), ClippedAt(budget), spec);
    ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, std::to_string(k) + " gradient shards kept");
    ASSERT_TRUE(run.status.ok() && !run.log.results.empty());
    EXPECT_EQ(run.resident_chunks, 0);
    if (k < run.num_chunks) {
      EXPECT_EQ(run.grad_resident_chunks, k);
    }
    EXPECT_LE(run.log.results.back().host_high_water, budget) << k << " kept";
    runs.emplace_back(k, run.log.results.back());
  }
  ASSERT_GE(runs.size(), 3u);
  const StepResult& none = runs.front().second;
  const StepResult& all = runs.back().second;
  ASSERT_GT(none.bytes_nvme_written, all.bytes_nvme_written) << "the shards of the first run went to disk";
  for (const auto& [k, last] : runs) {
    EXPECT_EQ((none.bytes_nvme_written - last.bytes_nvme_written) * n,
              k * (none.bytes_nvme_written - all.bytes_nvme_written))
        << k << " of " << n << " kept";
    EXPECT_EQ((none.bytes_nvme_read - last.bytes_nvme_read) * n,
              k * (none.bytes_nvme_read - all.bytes_nvme_read))
        << k << " of " << n << " kept";
  }
}

// Accumulation reads each gradient shard back in ranges and adds each as it lands
// (ReadAndAccumulateGrad). The shards here are 24 KiB: with the default 1 MiB stripe
// each goes in one range; with 4 KiB stripes in four; with 16 KiB stripes every other
// slot starts mid-stripe, so its ranges end on its own boundaries (8 and 24 KiB). The
// runs must be bit for bit the same, move the same bytes, and equal the reference.
TEST(EngineResidency, GradientShardsReadBackInRangesChangeNothing) {
  const zero::TrainSpec spec = ManyChunks(3);
  const std::string accumulate = R"("gradient_accumulation_steps": 3, "strata": {"gradient_resident": 0})";
  const Combo grads_on_nvme{3, "nvme", "none", "nvme"};
  EngineRun whole = RunEngine(World(), MakeConfig(grads_on_nvme, "{" + accumulate + "}"), spec);
  ASSERT_TRUE(whole.status.ok()) << whole.status.ToString();
  ASSERT_FALSE(whole.log.results.empty());
  EXPECT_GT(whole.log.results.back().bytes_nvme_read, 0u);
  auto ref =
      zero::TrainReference(MakeConfig({0, "none", "none"}, R"({"gradient_accumulation_steps": 3})"), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const char* stripe : {"4096", "16384"}) {
    const std::string aio = R"({"aio": {"block_size": )" + std::string(stripe) + "}, ";
    EngineRun ranges = RunEngine(World(), MakeConfig(grads_on_nvme, aio + accumulate + "}"), spec);
    ASSERT_TRUE(ranges.status.ok()) << stripe << ": " << ranges.status.ToString();
    EXPECT_TRUE(BitIdentical(whole, ranges)) << stripe;
    ASSERT_FALSE(ranges.log.results.empty());
    EXPECT_EQ(ranges.log.results.back().bytes_nvme_read, whole.log.results.back().bytes_nvme_read) << stripe;
    ExpectMatchesReference(ranges, *ref, 1e-5, kAtol, kRtol,
                           std::string("ranges of ") + stripe + " B stripes");
  }
}

TEST(EngineResidency, TheGradientKeyNeedsGradientsOnTheNvmePath) {
  for (const auto& [combo, extra] :
       {std::pair<Combo, const char*>{{3, "cpu", "none"}, R"({"strata": {"gradient_resident": 0.5}})"},
        {{3, "nvme", "none", "host"}, R"({"strata": {"gradient_resident": 0.5}})"}}) {
    EngineRun run = RunEngine(World(), MakeConfig(combo, extra), SmallSpec(1));
    ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << ComboName(combo) << run.status.ToString();
    EXPECT_NE(run.status.message().find("strata.gradient_resident"), std::string::npos)
        << run.status.message();
  }
  for (const char* bad : {R"("most")", "1.5", "-0.5"}) {
    auto parsed =
        ParseConfig(nlohmann::json::parse(std::string(R"({"strata": {"gradient_resident": )") + bad + "}}"));
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_NE(parsed.status().message().find("strata.gradient_resident"), std::string::npos)
        << parsed.status().message();
  }
  // A fraction the budget cannot hold is refused naming it.
  int n = 0;
  const auto sweep =
      SweepBudgets(ManyChunks(1), {64 * 1024, 16 * 1024 * 1024, 16 * 1024, ClippedAt, KeptShards}, &n);
  ASSERT_FALSE(sweep.empty());
  auto all =
      PlanOnly(MakeConfig({3, "nvme", "none", "auto", 0, 0, 1, 0, 0, 1.0},
                          R"({"strata": {"host_budget": )" + std::to_string(sweep.front().first) + "}}"),
               ManyChunks(1));
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(all.status().message().find("strata.gradient_resident"), std::string::npos)
      << all.status().message();
}

TEST(EngineResidency, AFractionTheBudgetCannotHoldIsRefusedNamingTheKey) {
  const zero::TrainSpec spec = ManyChunks(1);
  int n = 0;
  const auto sweep = Sweep(spec, &n);
  ASSERT_FALSE(sweep.empty());
  const std::string least = R"({"strata": {"host_budget": )" + std::to_string(sweep.front().first);
  auto all = PlanOnly(MakeConfig({3, "nvme", "none", "host", 0, 1.0}, least + "}}"), spec);
  ASSERT_FALSE(all.ok());
  EXPECT_EQ(all.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(all.status().message().find("strata.optimizer_resident"), std::string::npos)
      << all.status().message();
  auto half = PlanOnly(MakeConfig({3, "nvme", "none", "host", 0, 0.5}), spec);
  ASSERT_TRUE(half.ok()) << half.status().ToString();
  EXPECT_EQ(half->optimizer_resident_chunks, (n + 1) / 2);
}

TEST(EngineResidency, TheKeyNeedsTheOptimizerOnNvme) {
  EngineRun run = RunEngine(
      World(), MakeConfig({3, "cpu", "nvme"}, R"({"strata": {"optimizer_resident": 0.5}})"), SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.ToString();
  EXPECT_NE(run.status.message().find("offload_optimizer.device \"nvme\""), std::string::npos)
      << run.status.message();
  auto parsed = ParseConfig(nlohmann::json::parse(R"({"strata": {"optimizer_resident": "most"}})"));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("strata.optimizer_resident"), std::string::npos)
      << parsed.status().message();
  parsed = ParseConfig(nlohmann::json::parse(R"({"strata": {"optimizer_resident": 1.5}})"));
  ASSERT_FALSE(parsed.ok());
}

// offload_optimizer.ratio: the plan of a CPU optimizer with part of its chunks on a
// device of `device_bytes` (the sim device's default size when 0).
Result<EngineLayoutInfo> PlanWithRatio(double ratio, uint64_t device_bytes = 0) {
  const zero::TrainSpec spec = ManyChunks(1);
  const std::string extra =
      R"({"zero_optimization": {"offload_optimizer": {"ratio": )" + std::to_string(ratio) + "}}" +
      (device_bytes ? R"(, "strata": {"device_budget": )" + std::to_string(device_bytes) + "}" : "") + "}";
  DeviceOptions d;
  d.kind = DeviceKind::kSim;
  d.capacity = device_bytes;
  STRATA_ASSIGN_OR_RETURN(auto device, CreateDevice(d));
  return Engine::Plan(MakeConfig({2, "cpu", "none"}, extra), model::MlpModules(spec.model),
                      EngineResources{&World(), device.get()});
}

TEST(EngineResidency, TheRatioMovesWholeChunksOfStateToTheDevice) {
  auto all_cpu = PlanWithRatio(1);
  ASSERT_TRUE(all_cpu.ok()) << all_cpu.status().ToString();
  const int n = all_cpu->num_chunks;
  ASSERT_GE(n, 6);
  EXPECT_EQ(all_cpu->optimizer_device_chunks, 0);
  const uint64_t per_chunk = 16ull * all_cpu->shard_elems;  // master, m, v and the gradient shard
  for (double ratio : {0.75, 0.5, 0.25, 0.0}) {
    auto plan = PlanWithRatio(ratio);
    ASSERT_TRUE(plan.ok()) << ratio << ": " << plan.status().ToString();
    const int on_device = n - static_cast<int>(std::lround(ratio * n));
    EXPECT_EQ(plan->optimizer_device_chunks, on_device) << ratio;
    // Stage 2 with the optimizer on the CPU keeps no optional part on the device.
    EXPECT_EQ(plan->device_need, all_cpu->device_need + on_device * per_chunk) << ratio;
    EXPECT_LT(plan->host_need, all_cpu->host_need) << ratio;
  }
}

TEST(EngineResidency, TheRatioNeedsTheCpuOptimizerInAConfigMadeInCode) {
  for (const char* opt : {"none", "nvme"}) {
    Config c = MakeConfig({3, opt, "none"});
    c.zero.offload_optimizer.ratio = 0.5;  // ParseConfig refuses this; code can still build it
    EngineRun run = RunEngine(World(), c, SmallSpec(1));
    ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << opt << ": " << run.status.ToString();
    EXPECT_NE(run.status.message().find("offload_optimizer.ratio"), std::string::npos)
        << run.status.message();
  }
}

TEST(EngineResidency, ARatioTheDeviceCannotHoldIsRefusedNamingTheKey) {
  auto all_cpu = PlanWithRatio(1);
  ASSERT_TRUE(all_cpu.ok()) << all_cpu.status().ToString();
  const uint64_t per_chunk = 16ull * all_cpu->shard_elems;
  // Room for exactly one chunk on the device: a ratio that leaves one there fits, two do not.
  const uint64_t budget = all_cpu->device_need + per_chunk;
  const int n = all_cpu->num_chunks;
  auto one = PlanWithRatio(1.0 - 1.0 / n, budget);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->optimizer_device_chunks, 1);
  auto two = PlanWithRatio(1.0 - 2.0 / n, budget);
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.status().code(), StatusCode::kOutOfBudget) << two.status().ToString();
  EXPECT_NE(two.status().message().find("offload_optimizer.ratio"), std::string::npos)
      << two.status().message();
}

}  // namespace
}  // namespace strata::testing
