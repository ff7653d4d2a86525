// Budget sweeps for the partial residency tests (engine_residency_test,
// engine_param_residency_test, engine_param_device_test): plans at growing host (or
// device) budgets and the resident count each one gets.
#pragma once

#include <functional>
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

}  // namespace strata::testing
