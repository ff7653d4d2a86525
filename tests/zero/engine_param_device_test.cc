// Stage-3 parameter shards kept in device memory (strata.param_on_device): with
// offload_param nvme, what the device budget leaves after the gather buffers keeps chunks'
// 16-bit shards on the device, their NVMe traffic and host copies go, and training still
// equals the single-rank reference. ParamDeviceCombos also run at 2 and 4 ranks
// (engine_mpi_test).
#include <cmath>

#include "residency_sweep.h"

namespace strata::testing {
namespace {

// The optimizer on the CPU (its state is host memory) and no shard pinned on the host,
// with nothing kept gathered between a chunk's uses: the device budget alone decides,
// and a chunk's two gathers a step both read the disk unless its shard is on the device.
Config Auto(uint64_t device_budget) {
  Combo c{3, "cpu", "nvme"};
  c.param_on_device = -1;
  return MakeConfig(c, R"({"zero_optimization": {"stage3_max_reuse_distance": 0},
                           "strata": {"device_budget": )" +
                           std::to_string(device_budget) + "}}");
}

// Device budgets from the least that fits, in 4 KiB steps, until every shard is on the
// device.
std::vector<std::pair<uint64_t, int>> Sweep(const zero::TrainSpec& spec, int* num_chunks) {
  return SweepBudgets(spec,
                      {16 * 1024, 4 * 1024 * 1024, 4 * 1024, Auto,
                       [](const EngineLayoutInfo& l) { return l.param_device_chunks; }, /*device=*/true},
                      num_chunks);
}

TEST(EngineParamDevice, ShardsOnTheDeviceGrowWithTheDeviceBudget) {
  int n = 0;
  const auto sweep = Sweep(ManyChunks(1), &n);
  ASSERT_FALSE(sweep.empty()) << "no device budget up to 4 MiB holds the plan";
  ASSERT_GE(n, 6);
  EXPECT_EQ(sweep.front().second, 0) << "the least budget that fits holds no shard";
  EXPECT_EQ(sweep.back().second, n) << "a large enough budget holds every shard";
  EXPECT_EQ(DistinctNonDecreasing(sweep), n + 1) << "every count from 0 to all is planned on the way";
  auto all = PlanOnly(Auto(sweep.back().first), ManyChunks(1));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(all->nvme_need, 0u) << "no parameter slot on disk when every shard is on the device";
  // One byte under the budget that first holds every shard holds one shard less.
  auto short_one = PlanOnly(Auto(sweep.back().first - 1), ManyChunks(1));
  ASSERT_TRUE(short_one.ok()) << short_one.status().ToString();
  EXPECT_EQ(short_one->param_device_chunks, n - 1);
}

// Each shard on disk is written once a step and read at its gathers, and goes to the
// device from pinned staging each time; a shard on the device reads and writes no disk,
// and only its step's new values go up. Every budget's run equals the reference.
TEST(EngineParamDevice, NvmeBytesAndCopiesFallWithEachShardOnTheDeviceAndResultsStayTheReferences) {
  const zero::TrainSpec spec = ManyChunks(3);
  int n = 0;
  const auto sweep = Sweep(spec, &n);
  ASSERT_FALSE(sweep.empty());
  const auto runs = RunEachCount(
      spec, sweep, Auto, [](const EngineRun& r) { return r.param_device_chunks; }, /*device=*/true);
  ASSERT_EQ(runs.size(), static_cast<size_t>(n + 1));
  const StepResult& none = runs.front().second;
  ASSERT_GT(none.bytes_nvme_written, 0u);
  ASSERT_GT(none.bytes_nvme_read, 0u);
  for (size_t i = 1; i < runs.size(); ++i) {
    const auto& [k, last] = runs[i];
    const StepResult& before = runs[i - 1].second;
    // The optimizer is on the CPU: the parameter shards are all the disk moves, each
    // written once a step.
    EXPECT_EQ(last.bytes_nvme_written * n, none.bytes_nvme_written * (n - k)) << k << " of " << n;
    EXPECT_LT(last.bytes_nvme_read, before.bytes_nvme_read) << k << " of " << n;
    // A shard gathered twice a step went up twice, and on the device goes up once; the
    // chunk at the turn of forward and backward is gathered once, the same either way.
    EXPECT_LE(last.bytes_h2d, before.bytes_h2d) << k << " of " << n;
  }
  EXPECT_EQ(runs.back().second.bytes_nvme_read + runs.back().second.bytes_nvme_written, 0u);
  EXPECT_LT(runs.back().second.bytes_h2d, none.bytes_h2d);
}

TEST(EngineParamDevice, AFractionTheBudgetCannotHoldIsRefusedNamingTheKey) {
  const zero::TrainSpec spec = ManyChunks(1);
  int n = 0;
  const auto sweep = Sweep(spec, &n);
  ASSERT_FALSE(sweep.empty());
  Combo all{3, "cpu", "nvme"};
  all.param_on_device = 1.0;
  const std::string least = R"({"strata": {"device_budget": )" + std::to_string(sweep.front().first) + "}}";
  auto refused = PlanOnly(MakeConfig(all, least), spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(refused.status().message().find("strata.param_on_device"), std::string::npos)
      << refused.status().message();
  Combo half{3, "cpu", "nvme"};
  half.param_on_device = 0.5;
  auto planned = PlanOnly(MakeConfig(half), spec);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  const int half_n = static_cast<int>(std::lround(0.5 * n));
  EXPECT_EQ(planned->param_device_chunks, half_n);
  // With both keys explicit, each gets its share: the device's first.
  half.param_resident = 0.25;
  auto both = PlanOnly(MakeConfig(half), spec);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->param_device_chunks, half_n);
  EXPECT_EQ(both->param_resident_chunks, std::lround(0.25 * n));
  half.param_resident = 0.75;
  auto too_many = PlanOnly(MakeConfig(half), spec);
  ASSERT_EQ(too_many.status().code(), StatusCode::kInvalidArgument) << too_many.status().ToString();
  EXPECT_NE(too_many.status().message().find("strata.param_resident and strata.param_on_device"),
            std::string::npos)
      << too_many.status().message();
}

// Where a shard lives changes no value (CheckSixteenBitRunsBitIdentical): half or all
// of the shards on the device, and the three tiers at once.
TEST(EngineParamDevice, SixteenBitRunsAreBitIdenticalWhereverTheShardsLive) {
  CheckSixteenBitRunsBitIdentical({{0.0, 0.5}, {0.0, 1.0}, {0.25, 0.5}},
                                  [](const EngineRun& r) { return r.param_device_chunks; });
}

TEST(EngineParamDevice, HalfTheShardsOnTheDeviceMatchTheReferenceWithEveryOptimizerTier) {
  CheckCombos(World(), ParamDeviceCombos());
}

TEST(EngineParamDevice, TheKeyNeedsParametersOnNvmeWithASwapOfTheirOwn) {
  ExpectParamKeyNeedsASwap("param_on_device");
  auto parsed = ParseConfig(nlohmann::json::parse(R"({"strata": {"param_on_device": 2}})"));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("strata.param_on_device"), std::string::npos)
      << parsed.status().message();
}

}  // namespace
}  // namespace strata::testing
