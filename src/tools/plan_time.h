// The step time `strata plan` predicts for one configuration: the work of a step
// (step_traffic.h) over the lane rates, with the engine's own rates where the
// calibration measured them (engine_calibration.h), serial and overlapped.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "strata/config.h"
#include "tools/step_model.h"

namespace strata::tools {

struct PlanTime {
  std::vector<std::pair<std::string, double>> lanes;  // name -> seconds
  double cpu_s = 0;  // the lanes on the CPU cores (all but the disk on the sim device)
  // Reads and writes, at the mixed rate where one was measured; with an NVMe optimizer
  // of fewer than zero::kMinStagingSets sets, its pieces' read, step and write in turn.
  double disk_s = 0;
  double serial_s = 0;      // every lane one after another (strata.overlap false)
  double overlapped_s = 0;  // the slowest resource, slowed by the measured overlap factor
  // Of overlapped_s, the micro-batches before the last where their gradient shards go
  // through the disk (accumulation); 0 where the step is one overlapped stretch.
  double accumulation_s = 0;
  std::string critical;  // what the overlapped step waits on: "cpu", "nvme" or a lane
};

// shared_cpu: the sim device, whose compute, optimizer, copies and collectives share
// the CPU cores (the overlapped step is then max(cpu x overlap_factor + gather reads,
// disk)); on a GPU it is the slowest lane, compute with its gather reads. The gathers'
// parameter reads from NVMe sit on the compute's path: the forward and backward wait for
// them. With accumulation and gradient shards on disk the overlapped step is two such
// stretches: the micro-batches before the last (their compute, copies and collectives
// beside the shards' traffic) and then the last one with the optimizer (beside the rest
// of the disk's bytes). `opt_device` (offload_optimizer.device) and, for the CPU's,
// `stage` (for NVMe's, work.params_in_optimizer_state) pick the calibration that applies.
PlanTime PredictPlanTime(const LaneRates& rates, const LaneWork& work, bool shared_cpu,
                         OffloadDevice opt_device, int stage);

nlohmann::json ToJson(const PlanTime& t);

}  // namespace strata::tools
