// `strata plan`'s library call: which stage and offload configurations of a model fit
// the budgets, where each byte goes, and how long a step of each should take.
//
// Each candidate is the base config with zero_optimization.stage and the two offload
// devices set (stage 0-3, optimizer none/cpu/nvme, parameters none/cpu/nvme at stage 3)
// and every other key as given: a key a combination cannot honour (e.g.
// strata.optimizer_resident without an NVMe optimizer) makes the engine refuse it, and
// the candidate says so. Partial residency is the engine's own. Its memory account is
// the engine's plan (Engine::Plan over a mirror world of world_size ranks), so a
// candidate that fits here is one `strata train` accepts. Its time is the plan's time
// model (plan_time.h) over the work the plan implies (step_traffic.h) at the rates given.
//
// Allocates nothing but the engine's small bookkeeping and a device object of the base
// config's kind (no memory on it); reads the swap directories' file systems for their
// free space. Any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/config.h"
#include "strata/engine.h"
#include "tools/plan_model.h"
#include "tools/plan_time.h"
#include "tools/process_memory.h"
#include "tools/step_model.h"

namespace strata::tools {

struct PlanRequest {
  Config base;  // budgets, swap paths, batch sizes and every key the plan does not vary
  PlanModel model;
  int world_size = 1;
  int64_t micro_batch = 1;  // per rank
  LaneRates rates;          // with compute_flops_per_s
  // The process's resident set before the run's own allocations (the binary and its
  // libraries); 0: measured when planning (CurrentRssBytes), after the rates' probes.
  uint64_t process_base = 0;
};

struct PlanCandidate {
  std::string name;  // "stage 3, optimizer nvme, params nvme"
  Config config;
  bool valid = true;  // false: the engine refuses the combination with these keys (not a budget)
  bool fits = false;
  std::string refusal;  // why it does not fit or is not valid
  EngineLayoutInfo layout;
  // The process beside the engine's tiers (process_memory.h): host memory on the sim
  // device, where it counts against the machine's RAM with the pinned need.
  ProcessMemory process;
  // The layout, work and lanes of the way the plan chose (config.strata.overlap); the
  // time's serial_s and overlapped_s are each from that way's own placement.
  LaneWork work;
  PlanTime time;
  // The faster of the serial and the overlapped step when the base config leaves
  // strata.overlap on (config.strata.overlap then says which), else the serial one.
  double predicted_s = 0;
  std::string critical_lane;  // what the predicted step waits on ("serial": every lane in turn)
};

// The rates of this machine for the request: each lane's probe (the disk under the base
// config's first swap path) and the engine's calibration on the model cut to a few
// layers (engine_calibration.h). Takes seconds to tens of seconds.
Result<LaneRates> MeasurePlanRates(const PlanRequest& request);

// The base config with the stage and offload devices of one candidate (strata.plan
// "off"; an NVMe plane swaps to the base config's swap paths): what `strata train
// --config auto` runs with the choice.
Config CandidateConfig(const Config& base, int stage, OffloadDevice opt, OffloadDevice param);

// Predictions closer than this share of the fastest are ties (planner.cc says why).
inline constexpr double kTieBand = 0.02;

// Orders candidates as PlanConfigurations returns them: those that fit, fastest first
// but for the ties with the fastest, which lead by the memory they reserve (device +
// pinned host); then those that do not fit; then those the engine refuses.
void RankCandidates(std::vector<PlanCandidate>& candidates);

// Every combination, ranked by RankCandidates. Errors: InvalidArgument (world_size < 1, micro_batch < 1),
// Unavailable (the configured device is missing), and any
// engine error other than a budget or a key's refusal, with the candidate named.
Result<std::vector<PlanCandidate>> PlanConfigurations(const PlanRequest& request);

// Why PlanConfigurations' first candidate is first: "the fastest predicted", or the tie
// with the fastest it won by memory, both named. Empty when nothing fits.
std::string ChoiceReason(const std::vector<PlanCandidate>& ranked);

nlohmann::json ToJson(const PlanCandidate& c);

}  // namespace strata::tools
