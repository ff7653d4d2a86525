#include "tools/engine_calibration.h"

#include <algorithm>

#include "tools/mirror_world.h"
#include "tools/model_engine.h"
#include "zero/trainer.h"

namespace strata::tools {
namespace {

constexpr int64_t kCutParams = 48 << 20;

struct Measured {
  double step_s = 0, compute_s = 0, optimizer_s = 0;
  double optimizer_elems = 0;  // every chunk's (padding included), as the lane steps it
};

// The fastest of the steps after the first (which records the call order and touches
// memory): a calibration of a fraction of a second is easily disturbed, and the
// quickest step is the one least so.
Result<Measured> RunSteps(Communicator& world, const Config& config, const zero::TrainSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(ModelEngine e, CreateMlpEngine(world, config, spec.model, nullptr));
  STRATA_ASSIGN_OR_RETURN(zero::TrainLog log, zero::TrainWithEngine(*e.engine, world, config, spec));
  const EngineLayoutInfo& l = e.engine->layout_info();
  Measured m{1e30, 0, 0, static_cast<double>(l.num_chunks) * static_cast<double>(l.chunk_elems)};
  for (size_t i = 1; i < log.timing.size(); ++i) {
    if (log.timing[i].total_s() >= m.step_s) continue;
    m.step_s = log.timing[i].total_s();
    m.compute_s = log.timing[i].compute_s();
    m.optimizer_s = log.results[i].optimizer_busy_s;
  }
  return m;
}

// The serial and overlapped steps of `c`; `copy_s_per_elem` is what the path's copies
// take per optimizer element (the probe's rate), left out of the rest.
Result<EngineRates> CalibrateOnce(Communicator& world, Config c, const zero::TrainSpec& t, double copy_s_per_elem,
                              Measured* serial_out) {
  c.strata.overlap = false;
  STRATA_ASSIGN_OR_RETURN(Measured serial, RunSteps(world, c, t));
  c.strata.overlap = true;
  STRATA_ASSIGN_OR_RETURN(Measured overlapped, RunSteps(world, c, t));
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
Result<EngineRates> Calibrate(Communicator& world, Config c, const zero::TrainSpec& t, double copy_s_per_elem,
                              Measured* serial_out) {
  Result<EngineRates> e = CalibrateOnce(world, c, t, copy_s_per_elem, serial_out);
  if (e.ok() || e.status().code() != StatusCode::kOutOfBudget) return e;
  c.strata.device_budget = c.strata.host_budget = 0;
  return CalibrateOnce(world, c, t, copy_s_per_elem, serial_out);
}

}  // namespace

Status CalibrateEngine(const Config& base, const model::MlpSpec& spec, int64_t micro_batch, LaneRates* rates,
                       int steps) {
  if (micro_batch < 1) return InvalidArgumentError("calibration: micro_batch must be at least 1");
  STRATA_RETURN_IF_ERROR(model::ValidateSpec(spec));
  zero::TrainSpec t;
  t.model = spec;
  // As many hidden layers as fit in kCutParams, at least one and at most four: two
  // layers measured the optimizer at twice its per-parameter cost in the full model.
  const int64_t width = spec.hidden.empty() ? 1 : spec.hidden.front();
  const size_t layers = static_cast<size_t>(std::clamp<int64_t>(kCutParams / (width * width + 1), 1, 4));
  if (t.model.hidden.size() > layers) t.model.hidden.resize(layers);
  t.steps = 1 + std::max(steps, 1);
  t.micro_batch = micro_batch;
  // The device and, where they hold the cut model, the budgets stay the run's.
  Config c = base;
  c.zero.offload_param.device = OffloadDevice::kNone;
  c.strata.plan = "off";
  c.strata.optimizer_resident = -1;
  c.strata.gradients = "auto";
  c.strata.trace_file.clear();
  c.gradient_accumulation_steps = 1;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, CreateMirrorWorld(1));
  const std::string what = "calibrating the plan's rates on the model cut to " +
                           std::to_string(t.model.hidden.size()) + " hidden layers (" +
                           std::to_string(model::MlpParameterCount(t.model)) +
                           " parameters); or give the rates with --profile FILE";
  Measured serial;
  c.zero.stage = 0;
  c.zero.offload_optimizer.device = OffloadDevice::kNone;
  Result<EngineRates> dev = Calibrate(*world, c, t, 0, &serial);
  if (!dev.ok()) return dev.status().WithContext(what + ", optimizer on the device");
  rates->device_optimizer = *dev;
  const double params = static_cast<double>(model::MlpParameterCount(t.model));
  rates->compute_flops_per_s = 6.0 * params * micro_batch / std::max(serial.compute_s, 1e-9);
  // Gradients to the host (fp32) and the updated values back, per element.
  const int cs = c.bf16 || c.fp16.enabled ? 2 : 4;
  const double copy = rates->copy_bytes_per_s > 0 ? (4.0 + cs) / rates->copy_bytes_per_s : 0;
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
