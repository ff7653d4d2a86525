#include "tools/engine_calibration.h"

#include <algorithm>

#include "tools/mirror_world.h"
#include "tools/step_traffic.h"

namespace strata::tools {
namespace {

// The fastest step is the one a calibration of a fraction of a second least disturbed
// (PlanModel::run_cut keeps it).
struct Cut {
  const PlanModel& model;
  int64_t micro_batch;
  int steps;
};

// The serial and overlapped steps of `c`; `copy_s_per_elem` is what the path's copies
// take per optimizer element (the probe's rate), left out of the rest.
Result<EngineRates> CalibrateOnce(Communicator& world, Config c, const Cut& t, double copy_s_per_elem,
                                  CutRun* serial_out) {
  c.strata.overlap_auto = false;  // each run in one mode
  c.strata.overlap = false;
  STRATA_ASSIGN_OR_RETURN(CutRun serial, t.model.run_cut(world, c, t.micro_batch, t.steps));
  c.strata.overlap = true;
  STRATA_ASSIGN_OR_RETURN(CutRun overlapped, t.model.run_cut(world, c, t.micro_batch, t.steps));
  const double elems = std::max(serial.optimizer_elems, 1.0);
  EngineRates e;
  e.optimizer_params_per_s = elems / std::max(serial.optimizer_s, 1e-9);
  const double rest = serial.step_s - serial.compute_s - serial.optimizer_s - copy_s_per_elem * elems;
  e.other_s_per_param = std::max(0.0, rest) / elems;
  e.overlap_factor = overlapped.step_s / std::max(serial.step_s, 1e-9);
  *serial_out = serial;
  return e;
}

// CalibrateOnce under the run's budgets, or, where those cannot hold this variant of the
// cut model (a variant the plan will then mostly find does not fit either), under the
// device's capacity and the derived host budget: at most ~16 bytes per parameter of
// the cut model, for a few seconds.
Result<EngineRates> Calibrate(Communicator& world, Config c, const Cut& t, double copy_s_per_elem,
                              CutRun* serial_out) {
  Result<EngineRates> e = CalibrateOnce(world, c, t, copy_s_per_elem, serial_out);
  if (e.ok() || e.status().code() != StatusCode::kOutOfBudget) return e;
  c.strata.device_budget = c.strata.host_budget = 0;
  return CalibrateOnce(world, c, t, copy_s_per_elem, serial_out);
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
  const std::string what = "calibrating the plan's rates on the model cut to " +
                           std::to_string(model.cut_params) +
                           " parameters; or give the rates with --profile FILE";
  CutRun serial;
  c.zero.stage = 0;
  c.zero.offload_optimizer.device = OffloadDevice::kNone;
  Result<EngineRates> dev = Calibrate(*world, c, t, 0, &serial);
  if (!dev.ok()) return dev.status().WithContext(what + ", optimizer on the device");
  rates->device_optimizer = *dev;
  rates->compute_flops_per_s = model.cut_flops_per_sample * micro_batch / std::max(serial.compute_s, 1e-9);
  // Gradients to the host (fp32) and the updated values back, per element.
  const double copy = rates->copy_bytes_per_s > 0 ? (4.0 + ComputeBytes(c)) / rates->copy_bytes_per_s : 0;
  c.zero.stage = 1;
  c.zero.offload_optimizer.device = OffloadDevice::kCpu;
  Result<EngineRates> host = Calibrate(*world, c, t, copy, &serial);
  if (!host.ok()) return host.status().WithContext(what + ", optimizer on the CPU");
  rates->host_optimizer = *host;
  // The NVMe optimizer's path with every chunk's state resident: its code, not the disk
  // (whose time the probe gives). Stage 3 gathers add their copies to the rest.
  c.zero.stage = 3;
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  if (c.zero.offload_optimizer.nvme_path.empty())
    c.zero.offload_optimizer.nvme_path = SwapPaths(base, c.zero.offload_optimizer);
  c.strata.optimizer_resident = 1;
  Result<EngineRates> nvme = Calibrate(*world, c, t, copy, &serial);
  if (!nvme.ok()) return nvme.status().WithContext(what + ", optimizer on NVMe, resident");
  rates->nvme_optimizer = *nvme;
  return OkStatus();
}

}  // namespace strata::tools
