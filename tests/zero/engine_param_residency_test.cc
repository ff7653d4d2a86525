// Partial residency of the stage-3 parameter shards (strata.param_resident): with
// offload_param nvme, the host budget decides how many chunks keep their 16-bit shard in
// pinned memory, their NVMe traffic goes, and training still equals the single-rank
// reference. Half-resident runs with every optimizer tier are in AllCombos
// (ParamResidencyCombos: engine_test, and engine_mpi_test at 2 and 4 ranks).
#include "residency_sweep.h"

namespace strata::testing {
namespace {

// The optimizer state on the device, so that the only NVMe traffic is the parameter
// shards'.
Config Auto(uint64_t host_budget) {
  Combo c{3, "none", "nvme"};
  c.param_resident = -1;
  return MakeConfig(c, R"({"strata": {"host_budget": )" + std::to_string(host_budget) + "}}");
}

// Host budgets from the least that fits, in 4 KiB steps, until every shard is resident.
std::vector<std::pair<uint64_t, int>> Sweep(const zero::TrainSpec& spec, int* num_chunks) {
  return SweepBudgets(spec,
                      {16 * 1024, 4 * 1024 * 1024, 4 * 1024, Auto,
                       [](const EngineLayoutInfo& l) { return l.param_resident_chunks; }},
                      num_chunks);
}

TEST(EngineParamResidency, ResidentShardsGrowWithTheHostBudget) {
  int n = 0;
  const auto sweep = Sweep(ManyChunks(1), &n);
  ASSERT_FALSE(sweep.empty()) << "no budget up to 4 MiB holds the plan";
  ASSERT_GE(n, 6);
  EXPECT_EQ(sweep.front().second, 0) << "the least budget that fits holds no shard";
  EXPECT_EQ(sweep.back().second, n) << "a large enough budget holds every shard";
  EXPECT_EQ(DistinctNonDecreasing(sweep), n + 1) << "every count from 0 to all is planned on the way";
  // With the default host budget (half this machine's memory) every shard is resident,
  // and the plan asks the disk for no parameter slot.
  Combo c{3, "none", "nvme"};
  c.param_resident = -1;
  auto roomy = PlanOnly(MakeConfig(c), ManyChunks(1));
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  EXPECT_EQ(roomy->param_resident_chunks, roomy->num_chunks);
  EXPECT_EQ(roomy->nvme_need, 0u);
}

// Each shard on disk is written once a step and read at its gathers; a resident one
// moves nothing. Every budget's run equals the reference.
TEST(EngineParamResidency, NvmeBytesFallWithEachResidentShardAndResultsStayTheReferences) {
  const zero::TrainSpec spec = ManyChunks(3);
  int n = 0;
  const auto sweep = Sweep(spec, &n);
  ASSERT_FALSE(sweep.empty());
  uint64_t written0 = 0, last_read = 0;
  const auto runs =
      RunEachCount(spec, sweep, Auto, [](const EngineRun& r) { return r.param_resident_chunks; });
  ASSERT_EQ(runs.size(), static_cast<size_t>(n + 1));
  for (const auto& [k, last] : runs) {
    if (k == 0) {
      written0 = last.bytes_nvme_written, last_read = last.bytes_nvme_read;
      ASSERT_GT(written0, 0u);
      ASSERT_GT(last_read, 0u);
      continue;
    }
    EXPECT_EQ(last.bytes_nvme_written * n, written0 * (n - k)) << k << " of " << n << " resident";
    // Kept chunks are read once a step, the others twice: the reads fall with every
    // shard, but not in exact proportion.
    EXPECT_LT(last.bytes_nvme_read, last_read) << k << " of " << n << " resident";
    if (k == n) {
      EXPECT_EQ(last.bytes_nvme_read, 0u);
    }
    last_read = last.bytes_nvme_read;
  }
}

TEST(EngineParamResidency, AFractionTheBudgetCannotHoldIsRefusedNamingTheKey) {
  const zero::TrainSpec spec = ManyChunks(1);
  int n = 0;
  const auto sweep = Sweep(spec, &n);
  ASSERT_FALSE(sweep.empty());
  const std::string least = R"({"strata": {"host_budget": )" + std::to_string(sweep.front().first) + "}}";
  Combo all{3, "none", "nvme"};
  all.param_resident = 1.0;
  auto refused = PlanOnly(MakeConfig(all, least), spec);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(refused.status().message().find("strata.param_resident"), std::string::npos)
      << refused.status().message();
  Combo half{3, "none", "nvme"};
  half.param_resident = 0.5;
  auto planned = PlanOnly(MakeConfig(half), spec);
  ASSERT_TRUE(planned.ok()) << planned.status().ToString();
  EXPECT_EQ(planned->param_resident_chunks, (n + 1) / 2);
}

TEST(EngineParamResidency, SixteenBitRunsAreBitIdenticalWhereverTheShardsLive) {
  CheckSixteenBitRunsBitIdentical({{0.5, 0.0}, {1.0, 0.0}},
                                  [](const EngineRun& r) { return r.param_resident_chunks; });
}

TEST(EngineParamResidency, TheKeyNeedsParametersOnNvmeWithASwapOfTheirOwn) {
  ExpectParamKeyNeedsASwap("param_resident");
  auto parsed = ParseConfig(nlohmann::json::parse(R"({"strata": {"param_resident": "half"}})"));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("strata.param_resident"), std::string::npos)
      << parsed.status().message();
}

}  // namespace
}  // namespace strata::testing
