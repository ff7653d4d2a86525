#include "tools/engine_calibration.h"

#include <algorithm>
#include <string>

#include "tools/mirror_world.h"
#include "tools/step_traffic.h"

namespace strata::tools {
namespace {

// Each figure is its median over the steps (PlanModel::run_cut).
struct Cut {
  const PlanModel& model;
  int64_t micro_batch;
  int steps;
};

// The serial and overlapped steps of `c`. The rest of the serial step is what the
// compute at `compute_s` (the rate's time for the cut, not this run's own), the optimizer,
// and the copies and collectives the traffic model gives this run's layout (at the probe's
// copy rate) leave. The lanes' own timers shift time between one another from run to run
// (the cut's compute alone varied 57-71 ms over six processes whose steps were within 7%
// of one another), so the rest takes up what they missed and the lanes the plan sums for
// this variant come to its step. It is negative where they overlap within a serial step:
// stage 3's gathers run beside the compute even with overlap off.
//
// The serial run is taken twice, before and after the overlapped one, and the faster
// kept: a slow spell of the shared machine only ever lengthens a run, and one that fell
// on a single serial run skewed every candidate of its variant (the GPT's device split,
// 10x its usual rest per element and an overlap factor of 0.67: +29-40% on its rows).
Result<EngineRates> CalibrateOnce(Communicator& world, Config c, const Cut& t, double compute_s,
                                  double copy_bytes_per_s, CutRun* serial_out) {
  c.strata.overlap_auto = false;  // each run in one mode
  c.strata.overlap = false;
  STRATA_ASSIGN_OR_RETURN(CutRun serial, t.model.run_cut(world, c, t.micro_batch, t.steps));
  c.strata.overlap = true;
  STRATA_ASSIGN_OR_RETURN(CutRun overlapped, t.model.run_cut(world, c, t.micro_batch, t.steps));
  c.strata.overlap = false;
  STRATA_ASSIGN_OR_RETURN(CutRun again, t.model.run_cut(world, c, t.micro_batch, t.steps));
  if (again.step_s < serial.step_s) serial = std::move(again);
  const double elems = std::max(serial.optimizer_elems, 1.0);
  const LaneWork w = PredictTraffic(c, world.size(), serial.layout);
  const double moves = copy_bytes_per_s > 0 ? (w.copy_bytes + w.comm_bytes) / copy_bytes_per_s : 0;
  EngineRates e;
  e.optimizer_params_per_s = elems / std::max(serial.optimizer_s, 1e-9);
  const double compute = compute_s > 0 ? compute_s : serial.compute_s;
  e.other_s_per_param = (serial.step_s - compute - serial.optimizer_s - moves) / elems;
  e.overlap_factor = overlapped.step_s / std::max(serial.step_s, 1e-9);
  *serial_out = serial;
  return e;
}

// CalibrateOnce under the run's budgets, or, where those cannot hold this variant of the
// cut model (a variant the plan will then mostly find does not fit either), under the
// device's capacity and the derived host budget: at most ~16 bytes per parameter of
// the cut model, for a few seconds.
Result<EngineRates> Calibrate(Communicator& world, Config c, const Cut& t, double compute_s,
                              double copy_bytes_per_s, CutRun* serial_out) {
  Result<EngineRates> e = CalibrateOnce(world, c, t, compute_s, copy_bytes_per_s, serial_out);
  if (e.ok() || e.status().code() != StatusCode::kOutOfBudget) return e;
  c.strata.device_budget = c.strata.host_budget = 0;
  return CalibrateOnce(world, c, t, compute_s, copy_bytes_per_s, serial_out);
}

// The five or six variants, into `out`'s compute and engine rates.
Status CalibrateVariants(Communicator& world, const Config& base, Config c, const Cut& t, LaneRates* out) {
  const std::string what =
      "calibrating the plan's rates on the model (or its first layers); or give the rates with --profile "
      "FILE";
  const double copy = out->copy_bytes_per_s;
  CutRun serial;
  c.zero.stage = 0;
  c.zero.offload_optimizer.device = OffloadDevice::kNone;
  Result<EngineRates> dev = Calibrate(world, c, t, 0, copy, &serial);
  if (!dev.ok()) return dev.status().WithContext(what + ", optimizer on the device");
  out->device_optimizer = *dev;
  const double compute_s = std::max(serial.compute_s, 1e-9);
  out->compute_flops_per_s = serial.flops_per_step / compute_s;
  c.zero.stage = 1;
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  Result<EngineRates> host = Calibrate(world, c, t, compute_s, copy, &serial);
  if (!host.ok()) return host.status().WithContext(what + ", optimizer on the CPU");
  out->host_optimizer = *host;
  // The CPU optimizer with every chunk on the device (offload_optimizer.ratio 0): the
  // path a device split's chunks take, which the stage-0 run above does not.
  c.zero.offload_optimizer.ratio = 0;
  Result<EngineRates> split = Calibrate(world, c, t, compute_s, copy, &serial);
  if (!split.ok())
    return split.status().WithContext(what + ", optimizer on the CPU, every chunk on the device");
  out->device_split = *split;
  c.zero.offload_optimizer.ratio = 1;
  // Stage 3 with the parameters on the device: what its gathers and hooks add.
  c.zero.stage = 3;
  Result<EngineRates> host3 = Calibrate(world, c, t, compute_s, copy, &serial);
  if (!host3.ok()) return host3.status().WithContext(what + ", optimizer on the CPU, stage 3");
  out->host_optimizer_stage3 = *host3;
  // The NVMe optimizer's path with every chunk's state resident: its code, not the disk
  // (whose time the probe gives).
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  if (c.zero.offload_optimizer.nvme_path.empty())
    c.zero.offload_optimizer.nvme_path = SwapPaths(base, c.zero.offload_optimizer);
  c.strata.optimizer_resident = 1;
  Result<EngineRates> nvme = Calibrate(world, c, t, compute_s, copy, &serial);
  if (!nvme.ok()) return nvme.status().WithContext(what + ", optimizer on NVMe, resident");
  out->nvme_optimizer = *nvme;
  out->nvme_optimizer_master = *nvme;
  if (ComputeBytes(c) != 4) return OkStatus();
  // fp32 with the parameters on NVMe too: the master is the parameter shard
  // (params_in_optimizer_state), so the step writes no parameter copy and publishes none.
  // Measured at 100M (serial): the optimizer lane 64 ms against 120, the step 316 ms
  // against 391 with the parameters on the device.
  c.zero.offload_param.device = OffloadDevice::kNvme;
  c.zero.offload_param.nvme_path = c.zero.offload_optimizer.nvme_path;
  Result<EngineRates> master = Calibrate(world, c, t, compute_s, copy, &serial);
  if (!master.ok()) return master.status().WithContext(what + ", optimizer and parameters on NVMe, resident");
  out->nvme_optimizer_master = *master;
  return OkStatus();
}

}  // namespace

Status CalibrateEngine(const Config& base, const PlanModel& model, int64_t micro_batch, LaneRates* rates,
                       int steps) {
  if (micro_batch < 1) return InvalidArgumentError("calibration: micro_batch must be at least 1");
  const Cut t{model, micro_batch, std::max(steps, 1)};
  // The device and, where they hold the cut model, the budgets stay the run's.
  Config c = base;
  c.zero.offload_param.device = OffloadDevice::kNone;
  c.strata.plan = "off";
  c.strata.optimizer_resident = -1;
  c.strata.param_resident = -1;  // the parameters stay on the device
  c.strata.param_on_device = -1;
  c.strata.gradients = "auto";
  c.strata.trace_file.clear();
  c.gradient_accumulation_steps = 1;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, CreateMirrorWorld(1));
  return CalibrateVariants(*world, base, c, t, rates);
}

}  // namespace strata::tools
