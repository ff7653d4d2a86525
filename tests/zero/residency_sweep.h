// Budget sweeps for the partial residency tests (engine_residency_test,
// engine_param_residency_test, engine_param_device_test): plans at growing host (or
// device) budgets and the resident count each one gets.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine_checks.h"
#include "engine_plan.h"

namespace strata::testing {

// Many equal chunks (one 64 x 64 layer each), so that bytes per chunk are equal.
inline zero::TrainSpec ManyChunks(int steps) {
  zero::TrainSpec spec = SmallSpec(steps);
  spec.model.hidden.assign(8, 64);
  return spec;
}

struct BudgetSweep {
  uint64_t from = 0, to = 0, step = 0;                   // budgets, bytes
  std::function<Config(uint64_t)> config;                // the config at a budget
  std::function<int(const EngineLayoutInfo&)> resident;  // the count to follow
  bool device = false;                                   // device budgets, not host ones
};

// The budgets from `from` to `to` whose plan fits, with the resident count of each,
// until every chunk is resident; *num_chunks: the layout's.
inline std::vector<std::pair<uint64_t, int>> SweepBudgets(const zero::TrainSpec& spec, const BudgetSweep& s,
                                                          int* num_chunks) {
  std::vector<std::pair<uint64_t, int>> out;
  for (uint64_t b = s.from; b <= s.to; b += s.step) {
    auto plan = PlanOnly(s.config(b), spec);
    if (!plan.ok()) continue;
    EXPECT_LE(s.device ? plan->device_need : plan->host_need, b);
    out.emplace_back(b, s.resident(*plan));
    *num_chunks = plan->num_chunks;
    if (out.back().second == plan->num_chunks) break;
  }
  return out;
}

// The distinct counts of a sweep, checking that none falls as the budget grows.
inline int DistinctNonDecreasing(const std::vector<std::pair<uint64_t, int>>& sweep) {
  int distinct = 0;
  for (size_t i = 0; i < sweep.size(); ++i) {
    if (i == 0 || sweep[i].second != sweep[i - 1].second) ++distinct;
    if (i > 0) {
      EXPECT_GE(sweep[i].second, sweep[i - 1].second) << "at " << sweep[i].first << " bytes";
    }
  }
  return distinct;
}

// One run of `spec` at the least budget of each count in `sweep` (configs from
// `config`), each checked against the single-rank reference and its budget, with
// `run_count` of it equal to the count; the last step of each run, by count. device:
// the budgets are device budgets.
inline std::vector<std::pair<int, StepResult>> RunEachCount(
    const zero::TrainSpec& spec, const std::vector<std::pair<uint64_t, int>>& sweep,
    const std::function<Config(uint64_t)>& config, const std::function<int(const EngineRun&)>& run_count,
    bool device = false) {
  std::vector<std::pair<int, StepResult>> out;
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, 1);
  EXPECT_TRUE(ref.ok()) << ref.status().ToString();
  if (!ref.ok()) return out;
  for (const auto& [budget, k] : sweep) {
    if (!out.empty() && out.back().first == k) continue;
    EngineRun run = RunEngine(World(), config(budget), spec);
    ExpectMatchesReference(run, *ref, 1e-5, kAtol, kRtol, std::to_string(k) + " resident");
    if (!run.status.ok() || run.log.results.empty()) continue;
    EXPECT_EQ(run_count(run), k);
    EXPECT_LE(device ? run.device_high_water : run.log.results.back().host_high_water, budget)
        << k << " resident";
    out.emplace_back(k, run.log.results.back());
  }
  return out;
}

// Where a parameter shard lives changes no value: 16-bit runs (the shards rounded once,
// published through each optimizer tier's path, the NVMe optimizer's write-behind one
// included) with each (strata.param_resident, strata.param_on_device) placement are
// bit-identical with all of the shards on NVMe; `moved` counts the shards a placement
// took off the disk, which must not be 0.
inline void CheckSixteenBitRunsBitIdentical(const std::vector<std::pair<double, double>>& placements,
                                            const std::function<int(const EngineRun&)>& moved) {
  const zero::TrainSpec spec = SmallSpec(6);
  const std::pair<Combo, const char*> cases[] = {
      {{3, "cpu", "nvme"}, R"({"bf16": {"enabled": true}})"},
      {{3, "nvme", "nvme"}, R"({"bf16": {"enabled": true}})"},
      {{3, "nvme", "nvme", "nvme", kPiecedSubGroup},
       R"({"bf16": {"enabled": true}, "gradient_clipping": 0.05})"},
      {{3, "none", "nvme"}, R"({"fp16": {"enabled": true, "initial_scale_power": 30}})"}};
  for (const auto& [combo, extra] : cases) {
    Combo c = combo;
    EngineRun none = RunEngine(World(), MakeConfig(c, extra), spec);
    ASSERT_TRUE(none.status.ok()) << ComboName(c) << " " << extra << ": " << none.status.ToString();
    ASSERT_EQ(moved(none), 0);
    for (const auto& [host, device] : placements) {
      c.param_resident = host;
      c.param_on_device = device;
      EngineRun some = RunEngine(World(), MakeConfig(c, extra), spec);
      ASSERT_TRUE(some.status.ok()) << ComboName(c) << " " << extra << ": " << some.status.ToString();
      EXPECT_GT(moved(some), 0) << ComboName(c);
      EXPECT_EQ(some.param_resident_chunks > 0, host > 0) << ComboName(c);
      EXPECT_TRUE(BitIdentical(none, some)) << ComboName(c) << " " << extra;
    }
  }
}

// strata.<key> (param_resident or param_on_device) at 0.5 is refused where there is no
// parameter swap: parameters on the device or the CPU, or fp32 with both planes on NVMe
// (the gathers read the optimizer's master; strata.optimizer_resident keeps those).
inline void ExpectParamKeyNeedsASwap(const std::string& key) {
  const std::string half = R"({"strata": {")" + key + R"(": 0.5}})";
  for (const char* param : {"none", "cpu"}) {
    EngineRun run = RunEngine(World(), MakeConfig({3, "cpu", param}, half), SmallSpec(1));
    ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << param << ": " << run.status.ToString();
    EXPECT_NE(run.status.message().find("offload_param.device \"nvme\""), std::string::npos)
        << run.status.message();
  }
  EngineRun run = RunEngine(World(), MakeConfig({3, "nvme", "nvme"}, half), SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.ToString();
  EXPECT_NE(run.status.message().find("strata." + key), std::string::npos) << run.status.message();
  EXPECT_NE(run.status.message().find("strata.optimizer_resident"), std::string::npos)
      << run.status.message();
}

}  // namespace strata::testing
