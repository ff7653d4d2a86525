// Partial residency of the stage-3 parameter shards (strata.param_resident): with
// offload_param nvme, the host budget decides how many chunks keep their 16-bit shard in
// pinned memory, their NVMe traffic goes, and training still equals the single-rank
// reference. Half-resident runs with every optimizer tier are in AllCombos
// (ParamResidencyCombos: engine_test, and engine_mpi_test at 2 and 4 ranks).
#include <set>

#include "engine_checks.h"
#include "engine_plan.h"

namespace strata::testing {
namespace {

// Many equal chunks (one 64 x 64 layer each); the optimizer state on the device, so
// that the only NVMe traffic is the parameter shards'.
zero::TrainSpec ManyChunks(int steps) {
  zero::TrainSpec spec = SmallSpec(steps);
  spec.model.hidden.assign(8, 64);
  return spec;
}

Config Auto(uint64_t host_budget, const char* opt = "none") {
  Combo c{3, opt, "nvme"};
  c.param_resident = -1;
  return MakeConfig(c, R"({"strata": {"host_budget": )" + std::to_string(host_budget) + "}}");
}

// Host budgets from the least that fits, in 4 KiB steps, until every shard is resident;
// the resident count at each.
std::vector<std::pair<uint64_t, int>> Sweep(const zero::TrainSpec& spec, int* num_chunks) {
  std::vector<std::pair<uint64_t, int>> out;
  for (uint64_t b = 16 * 1024; b <= 4 * 1024 * 1024; b += 4 * 1024) {
    auto plan = PlanOnly(Auto(b), spec);
    if (!plan.ok()) continue;
    EXPECT_LE(plan->host_need, b);
    out.emplace_back(b, plan->param_resident_chunks);
    *num_chunks = plan->num_chunks;
    if (plan->param_resident_chunks == plan->num_chunks) break;
  }
  return out;
}

TEST(EngineParamResidency, ResidentShardsGrowWithTheHostBudget) {
  int n = 0;
  const auto sweep = Sweep(ManyChunks(1), &n);
  ASSERT_FALSE(sweep.empty()) << "no budget up to 4 MiB holds the plan";
  ASSERT_GE(n, 6);
  EXPECT_EQ(sweep.front().second, 0) << "the least budget that fits holds no shard";
  EXPECT_EQ(sweep.back().second, n) << "a large enough budget holds every shard";
  std::set<int> counts;
  for (size_t i = 0; i < sweep.size(); ++i) {
    counts.insert(sweep[i].second);
    if (i > 0) {
      EXPECT_GE(sweep[i].second, sweep[i - 1].second) << "at " << sweep[i].first << " bytes";
    }
  }
  EXPECT_EQ(static_cast<int>(counts.size()), n + 1) << "every count from 0 to all is planned on the way";
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
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  uint64_t written0 = 0, last_read = 0;
  std::set<int> seen;
  for (const auto& [budget, k] : sweep) {
    if (!seen.insert(k).second) continue;  // the least budget of each count
    EngineRun run = RunEngine(World(), Auto(budget), spec);
    ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, std::to_string(k) + " shards resident");
    ASSERT_EQ(run.param_resident_chunks, k);
    const StepResult& last = run.log.results.back();
    EXPECT_LE(last.host_high_water, budget) << k << " resident";
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

TEST(EngineParamResidency, TheKeyNeedsParametersOnNvmeWithASwapOfTheirOwn) {
  for (const char* param : {"none", "cpu"}) {
    EngineRun run = RunEngine(
        World(), MakeConfig({3, "cpu", param}, R"({"strata": {"param_resident": 0.5}})"), SmallSpec(1));
    ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << param << ": " << run.status.ToString();
    EXPECT_NE(run.status.message().find("offload_param.device \"nvme\""), std::string::npos)
        << run.status.message();
  }
  // fp32 with both on NVMe: the gathers read the optimizer's master, there is no swap of
  // parameters to keep; strata.optimizer_resident is the key that keeps them.
  Combo both{3, "nvme", "nvme"};
  both.param_resident = 0.5;
  EngineRun run = RunEngine(World(), MakeConfig(both), SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.ToString();
  EXPECT_NE(run.status.message().find("strata.optimizer_resident"), std::string::npos)
      << run.status.message();
  auto parsed = ParseConfig(nlohmann::json::parse(R"({"strata": {"param_resident": "half"}})"));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("strata.param_resident"), std::string::npos)
      << parsed.status().message();
}

}  // namespace
}  // namespace strata::testing
