#include "tools/step_bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "strata/device.h"
#include "strata/engine.h"
#include "strata/timeline.h"
#include "strata/units.h"
#include "tools/plan_model.h"
#include "tools/process_memory.h"
#include "tools/step_traffic.h"

namespace strata::tools {
namespace {

// The first directory the engine swaps to (the optimizer's store first), or "" without NVMe.
std::string SwapDir(const Config& c) {
  for (const OffloadConfig* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
    if (o->device != OffloadDevice::kNvme) continue;
    const std::vector<std::string>& paths = SwapPaths(c, *o);
    return paths.empty() ? std::string() : paths.front();
  }
  return "";
}

Result<StepBenchRun> RunOnce(Communicator& world, const Config& config, const StepBenchOptions& o,
                             Timeline* timeline) {
  const uint64_t base_rss = MeasureProcessBase();  // before the engine and the model
  ResetPeakRss();  // this run's own peak, not an earlier run's in this process
  StepRunOptions run;
  run.steps = o.steps + 1;  // one warm-up step records the pattern and touches memory
  run.micro_batch = o.micro_batch;
  run.data_seed = o.data_seed;
  run.timeline = timeline;
  StepBenchRun r;
  // Whether the step waits on the disk or leaves it idle: its counters around the
  // measured steps, opened at the warm-up step's start (the engine has created the swap
  // directory by then).
  std::optional<DiskMonitor> disk;
  DiskCounters disk_from, disk_to;
  Status disk_status = OkStatus();
  const std::string dir = SwapDir(config);
  if (dir.empty()) {
    r.disk_unavailable = "no swap directory (nothing on NVMe)";
  } else if (o.steps < 1) {
    r.disk_unavailable = "no measured steps";
  } else {
    run.step_boundary = [&, first = 1, last = o.steps](int step, bool end) {
      if (step == 0 && !end) {
        Result<DiskMonitor> m = DiskMonitor::ForPath(dir);
        if (m.ok())
          disk.emplace(std::move(*m));
        else
          r.disk_unavailable = m.status().ToString();
      }
      if (!disk || !disk_status.ok() || step != (end ? last : first)) return;
      Result<DiskCounters> c = disk->Read();
      if (!c.ok())
        disk_status = c.status();
      else
        (end ? disk_to : disk_from) = *c;
    };
  }
  STRATA_ASSIGN_OR_RETURN(StepLog log, o.model.run_steps(world, config, run));
  r.peak_rss = PeakRssBytes();
  if (disk && disk_status.ok()) {
    r.disk_name = disk->name();
    r.disk = ActivityBetween(disk_from, disk_to);
  } else if (disk) {
    r.disk_unavailable = disk_status.ToString();
  }
  r.layout = log.layout;
  r.process =
      EstimateProcessMemory(base_rss, r.layout, config, o.model.activation_bytes_per_sample, o.micro_batch);
  r.losses = log.losses;
  const int n = o.steps;
  r.steps = n;
  for (int i = 1; i <= n; ++i) {
    const StepTiming& t = log.timing[i];
    r.timing.forward_backward_s += t.forward_backward_s / n;
    r.timing.hooks_s += t.hooks_s / n;
    r.timing.model_wait_s += t.model_wait_s / n;
    r.timing.step_s += t.step_s / n;
  }
  r.step_s = r.timing.total_s();
  r.last = log.results.back();
  return r;
}

nlohmann::json DiskJson(const StepBenchRun& r) {
  if (r.disk_name.empty()) return {{"unavailable", r.disk_unavailable}};
  const uint64_t steps = std::max(r.steps, 1);
  return {{"device", r.disk_name},
          {"seconds", r.disk.seconds},
          {"busy_fraction", r.disk.busy_fraction},
          {"mean_in_flight", r.disk.mean_in_flight},
          {"read_bytes_per_step", r.disk.read_bytes / steps},
          {"write_bytes_per_step", r.disk.write_bytes / steps},
          {"bytes_per_s", r.disk.bytes_per_s()}};
}

nlohmann::json RunJson(const StepBenchRun& r) {
  const StepResult& s = r.last;
  return {{"step_s", r.step_s},
          {"forward_backward_s", r.timing.forward_backward_s},
          {"compute_s", r.timing.compute_s()},
          {"hook_wait_s", r.timing.hook_wait_s()},
          {"model_wait_s", r.timing.model_wait_s},
          {"step_call_s", r.timing.step_s},
          {"step_wait_s", s.step_wait_s},
          {"optimizer_busy_s", s.optimizer_busy_s},
          {"comm_busy_s", s.comm_busy_s},
          {"io_busy_s", s.io_busy_s},
          {"speculative_steps", s.speculative_steps},
          {"redone_steps", s.redone_steps},
          {"prefetch_modules", s.prefetch_modules},
          {"gather_evictions", s.gather_evictions},
          {"shards_from_memory", s.shards_from_memory},
          {"bytes",
           {{"nvme_read", s.bytes_nvme_read},
            {"nvme_write", s.bytes_nvme_written},
            {"h2d", s.bytes_h2d},
            {"d2h", s.bytes_d2h},
            {"collectives", s.bytes_comm}}},
          {"high_water", {{"device", s.device_high_water}, {"host", s.host_high_water}}},
          {"peak_rss_bytes", r.peak_rss},
          {"process_estimate",
           {{"base", r.process.base},
            {"creation", r.process.creation},
            {"activations", r.process.activations},
            {"total", r.process.total()}}},
          {"losses", r.losses},
          {"disk", DiskJson(r)}};
}

// The report's lines on the run itself: where everything was, times, bytes, memory.
std::string RunText(const Config& c, const StepBenchOptions& o, int world_size, const StepBenchRun& main,
                    const LaneWork& planned) {
  std::string out;
  out += "step: " + std::to_string(main.layout.num_params) + " params, stage " +
         std::to_string(c.zero.stage) + ", optimizer on " +
         std::string(OffloadDeviceName(c.zero.offload_optimizer.device)) + ", params on " +
         std::string(OffloadDeviceName(c.zero.offload_param.device)) + ", overlap " +
         (c.strata.overlap ? "on" : "off") + ", world " + std::to_string(world_size) + "\n";
  out += "  model                " + o.model.description + ", micro-batch " + std::to_string(o.micro_batch) +
         "\n";
  out += "  step time            " + FormatSeconds(main.step_s) + "\n";
  out += "  compute (fwd+bwd)    " + FormatSeconds(main.timing.compute_s()) + "\n";
  out += "  waits in hooks       " + FormatSeconds(main.timing.hook_wait_s()) + "\n";
  out += "  Step() call          " + FormatSeconds(main.timing.step_s) + "  (waiting for work in flight " +
         FormatSeconds(main.last.step_wait_s) + ")\n";
  out += "  lanes busy           optimizer " + FormatSeconds(main.last.optimizer_busy_s) + ", collectives " +
         FormatSeconds(main.last.comm_busy_s) + ", I/O " + FormatSeconds(main.last.io_busy_s) + "\n";
  out += "  bytes                nvme read " + FormatBytes(main.last.bytes_nvme_read) + ", nvme write " +
         FormatBytes(main.last.bytes_nvme_written) + ", h2d " + FormatBytes(main.last.bytes_h2d) + ", d2h " +
         FormatBytes(main.last.bytes_d2h) + ", collectives " + FormatBytes(main.last.bytes_comm) + "\n";
  out += "  plan's bytes         nvme read " + FormatBytes(static_cast<uint64_t>(planned.nvme_read_bytes)) +
         ", nvme write " + FormatBytes(static_cast<uint64_t>(planned.nvme_write_bytes)) + ", copies " +
         FormatBytes(static_cast<uint64_t>(planned.copy_bytes)) + ", collectives " +
         FormatBytes(static_cast<uint64_t>(planned.comm_bytes)) + " (strata plan's prediction)\n";
  out += "  high water           device " + FormatBytes(main.last.device_high_water) + " (budget " +
         (c.strata.device_budget
              ? FormatBytes(c.strata.device_budget)
              : std::string(c.strata.device == DeviceKind::kCuda ? "free memory" : "sim default")) +
         "), host " + FormatBytes(main.last.host_high_water) + " (budget " +
         (c.strata.host_budget ? FormatBytes(c.strata.host_budget) : std::string("derived")) + ")\n";
  out += "  process peak RSS     " + FormatBytes(main.peak_rss) + " (" +
         PlanMemoryText(main.layout, main.process) +
         (c.strata.device == DeviceKind::kCuda ? "; device memory and the activations are not in the RSS"
                                               : "; the sim device's memory is in the RSS") +
         ")\n";
  out += "  speculative steps    " + std::to_string(main.last.speculative_steps) + " chunks, redone " +
         std::to_string(main.last.redone_steps) + "; " + std::to_string(main.layout.optimizer_threads) +
         (main.layout.optimizer_threads == 1 ? " thread" : " threads") + " beside the backward\n";
  if (main.last.prefetch_modules > 0) {
    out += "  prefetch depth       " + std::to_string(main.last.prefetch_modules) +
           " modules (measured: last step's gather latency over module compute)\n";
  }
  if (c.zero.stage == 3) {
    out += "  kept gathered        " + std::to_string(main.layout.kept_chunks) + " of " +
           std::to_string(main.layout.num_chunks) + " chunks, from forward to backward";
    if (c.gradient_accumulation_steps > 1) {
      out += "; " + std::to_string(main.layout.carried_chunks) + " carried between micro-batches";
    }
    out += "\n";
  }
  if (c.zero.offload_optimizer.device == OffloadDevice::kNvme) {
    out += "  optimizer resident   " + std::to_string(main.layout.optimizer_resident_chunks) + " of " +
           std::to_string(main.layout.num_chunks) + " chunks in pinned host memory, the rest on NVMe\n";
    if (main.layout.gradient_resident_chunks > 0) {
      out += "  gradients kept       " + std::to_string(main.layout.gradient_resident_chunks) +
             " more chunks' shards in pinned host memory, the rest to NVMe and back\n";
    }
  }
  if (main.layout.optimizer_device_chunks > 0) {
    out += "  optimizer on device  " + std::to_string(main.layout.optimizer_device_chunks) + " of " +
           std::to_string(main.layout.num_chunks) +
           " chunks (offload_optimizer.ratio), the rest on the CPU\n";
  }
  if (main.layout.params_in_optimizer_state) {
    out += "  parameter shards     read from the optimizer state's master on NVMe (no parameter swap)\n";
  } else if (c.zero.stage == 3 && c.zero.offload_param.device == OffloadDevice::kNvme) {
    out += "  parameters resident  " + std::to_string(main.layout.param_resident_chunks) + " of " +
           std::to_string(main.layout.num_chunks) + " chunks' shards in pinned host memory, " +
           std::to_string(main.layout.param_device_chunks) + " in device memory, the rest on NVMe\n";
  }
  return out;
}

// The report's lines on the step-time model: its bound and the efficiency against it.
std::string ModelText(const StepModel& model, const LaneRates& rates, double step_s) {
  std::string out;
  out += "  model: bound " + FormatSeconds(model.bound_s) + " (cpu lanes " + FormatSeconds(model.cpu_s) +
         ", nvme " + FormatSeconds(model.nvme_s) + "), serial " + FormatSeconds(model.serial_s) +
         ", overlap efficiency (bound / measured) " + FormatDouble("%.2f", model.bound_s / step_s) + "\n";
  if (model.bound_s > step_s) {
    out += model.nvme_s >= model.cpu_s
               ? "  the step beat the bound: the disk ran slower in the probes than in the step (a slow "
                 "spell); these efficiencies are not valid, run again\n"
               : "  the step beat the bound: the CPU lanes (measured compute, probed Adam, copies and "
                 "collectives) add up to more than the step; these efficiencies are not valid\n";
  }
  if (model.bound_mixed_s > 0) {
    out += "  with the disk's reads and writes timed together at its mixed rate (" +
           FormatDouble("%.2f", rates.nvme_mixed_bytes_per_s / 1e9) + " GB/s): bound " +
           FormatSeconds(model.bound_mixed_s) + ", efficiency " +
           FormatDouble("%.2f", model.bound_mixed_s / step_s) +
           (model.bound_mixed_s > step_s ? " (not valid: the step beat this bound)" : "") + "\n";
  }
  return out;
}

// The report's first keys: the config, the model as laid out, the budgets, the run.
nlohmann::json HeaderJson(const Config& c, const StepBenchOptions& o, int world_size,
                          const StepBenchRun& main) {
  nlohmann::json j;
  j["config"] = ConfigToJson(c);
  j["world_size"] = world_size;
  j["model"] = {{"params", main.layout.num_params},
                {"chunks", main.layout.num_chunks},
                {"chunk_elems", main.layout.chunk_elems},
                {"micro_batch", o.micro_batch},
                {"kept_chunks", main.layout.kept_chunks},
                {"optimizer_resident_chunks", main.layout.optimizer_resident_chunks},
                {"gradient_resident_chunks", main.layout.gradient_resident_chunks},
                {"optimizer_threads", main.layout.optimizer_threads},
                {"optimizer_device_chunks", main.layout.optimizer_device_chunks},
                {"param_resident_chunks", main.layout.param_resident_chunks},
                {"param_device_chunks", main.layout.param_device_chunks},
                {"params_in_optimizer_state", main.layout.params_in_optimizer_state},
                {"carried_chunks", main.layout.carried_chunks},
                {"description", o.model.description}};
  j["model"].update(o.model_keys);
  j["budget_need"] = {
      {"device", main.layout.device_need}, {"host", main.layout.host_need}, {"nvme", main.layout.nvme_need}};
  j["run"] = RunJson(main);
  return j;
}

// The step-time model's bound for the work the run did at the probed rates, and the
// efficiency of the step against it, into the report.
StepModel BoundOfStep(const Config& c, const StepBenchRun& main, int64_t opt_params, const LaneRates& rates,
                      nlohmann::json* j) {
  LaneWork w;
  w.compute_s = main.timing.compute_s();
  w.adam_params = static_cast<double>(opt_params);
  w.copy_bytes = static_cast<double>(main.last.bytes_h2d + main.last.bytes_d2h);
  w.comm_bytes = static_cast<double>(main.last.bytes_comm);
  w.nvme_read_bytes = static_cast<double>(main.last.bytes_nvme_read);
  w.nvme_write_bytes = static_cast<double>(main.last.bytes_nvme_written);
  const StepModel model = ModelStep(rates, w, /*shared_cpu=*/c.strata.device != DeviceKind::kCuda);
  (*j)["rates"] = RatesToJson(rates);
  (*j)["model_time"] = ToJson(model);
  (*j)["overlap_efficiency"] = model.bound_s / main.step_s;
  if (model.bound_mixed_s > 0) (*j)["overlap_efficiency_mixed"] = model.bound_mixed_s / main.step_s;
  // A bound the step beat is no bound: the disk was slower in both probes than in the
  // step (seen once in ~30 runs on the shared disk, at efficiency 1.04). The mixed bound
  // is usually the larger, so it is checked on its own.
  (*j)["probe_slower_than_step"] = model.bound_s > main.step_s;
  (*j)["mixed_bound_beaten"] = model.bound_mixed_s > main.step_s;
  return model;
}

// The report's line on the run with overlap off, and the speedup overlap gave against
// the model's prediction (model: nullptr when rates were not measured).
std::string SerialText(const StepBenchRun& main, const StepBenchRun& off, const StepModel* model,
                       bool overlap_auto, nlohmann::json* j) {
  std::string out;
  const double speedup = off.step_s / main.step_s;
  (*j)["speedup"] = speedup;
  out +=
      "  overlap off: step " + FormatSeconds(off.step_s) + "; speedup " + FormatDouble("%.2f", speedup) + "x";
  if (model != nullptr && model->bound_s > 0) {
    const double predicted = model->serial_s / model->bound_s;
    (*j)["predicted_speedup"] = predicted;
    (*j)["speedup_fraction_of_predicted"] = speedup / predicted;
    out += " (model predicts " + FormatDouble("%.2f", predicted) +
           "x: " + FormatDouble("%.0f%%", 100 * speedup / predicted) + " of it)";
  }
  if (!off.disk_name.empty()) out += "; disk busy " + FormatDouble("%.0f%%", 100 * off.disk.busy_fraction);
  out += "\n";
  if (overlap_auto) {
    // What strata.overlap "auto" would keep on these timings (the engine times its own).
    (*j)["overlap_auto_keeps"] = main.step_s <= off.step_s;
    out += std::string("  strata.overlap auto  keeps overlap ") + (main.step_s <= off.step_s ? "on" : "off") +
           " on these timings\n";
  }
  return out;
}

}  // namespace

Result<nlohmann::json> RunStepBench(Communicator& world, const StepBenchOptions& o, std::string* text) {
  if (!o.model.run_steps) {
    return InvalidArgumentError("bench step: " + o.model.description + " has no forward code to run");
  }
  // Each run keeps one mode: with strata.overlap "auto" the overlapped run and the serial
  // one below are what the engine's trial compares.
  Config c = o.config;
  const bool overlap_auto = c.strata.overlap_auto;
  c.strata.overlap_auto = false;
  Timeline timeline(!c.strata.trace_file.empty());
  STRATA_ASSIGN_OR_RETURN(StepBenchRun main, RunOnce(world, c, o, &timeline));
  if (!c.strata.trace_file.empty() && world.rank() == 0) {
    STRATA_RETURN_IF_ERROR(timeline.WriteChromeTrace(c.strata.trace_file));
  }
  nlohmann::json j = HeaderJson(c, o, world.size(), main);
  // What `strata plan` predicts this layout moves, beside the engine's counters: a model
  // whose traffic the prediction misses shows here before it misleads a plan.
  const LaneWork planned = PredictTraffic(c, world.size(), main.layout);
  j["predicted_bytes"] = {{"nvme_read", planned.nvme_read_bytes},
                          {"nvme_write", planned.nvme_write_bytes},
                          {"copies", planned.copy_bytes},
                          {"collectives", planned.comm_bytes}};

  const bool nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme ||
                    c.zero.offload_param.device == OffloadDevice::kNvme;
  const std::string nvme_dir = SwapDir(c);  // the probe runs on the engine's disk
  // The disk has slow spells: a probe taken in one would loosen the bound until the step
  // beat it (seen: efficiency 1.02). So it is probed after the main run and again after
  // the overlap-off run, and each rate is the best either probe reached.
  const int64_t opt_params =
      main.layout.num_chunks * (c.zero.stage == 0 ? main.layout.chunk_elems : main.layout.shard_elems);
  // The disk's rate over as many bytes as a step moves each way (within 256 MiB-2 GiB).
  const uint64_t step_io = std::max(main.last.bytes_nvme_read, main.last.bytes_nvme_written);
  const uint64_t probe = std::clamp<uint64_t>(step_io, 256ull << 20, 2ull << 30);
  const double moved = static_cast<double>(main.last.bytes_nvme_read + main.last.bytes_nvme_written);
  const double read_fraction = moved > 0 ? main.last.bytes_nvme_read / moved : 0.5;
  LaneRates rates;
  int probes = 0;
  auto measure = [&]() -> Status {
    if (!o.measure_rates) return OkStatus();
    STRATA_ASSIGN_OR_RETURN(LaneRates r, MeasureLaneRates(nvme_dir, opt_params, probe, read_fraction));
    rates = probes++ == 0 ? r : BestOf(rates, r);
    return OkStatus();
  };
  STRATA_RETURN_IF_ERROR(measure());
  std::optional<StepBenchRun> off;
  if (o.compare_serial && c.strata.overlap) {
    Config serial = c;
    serial.strata.overlap = false;
    serial.strata.trace_file.clear();
    STRATA_ASSIGN_OR_RETURN(off, RunOnce(world, serial, o, nullptr));
    j["serial_run"] = RunJson(*off);
    STRATA_RETURN_IF_ERROR(measure());
  }
  StepModel model;
  if (o.measure_rates) {
    model = BoundOfStep(c, main, opt_params, rates, &j);
    j["rates"].update(
        {{"nvme_mixed_read_fraction", read_fraction}, {"nvme_probe_bytes", probe}, {"probes", probes}});
  }
  std::string out = RunText(c, o, world.size(), main, planned);
  if (o.measure_rates) out += ModelText(model, rates, main.step_s);
  if (!main.disk_name.empty()) {
    out += FormatDiskLine(main.disk_name, main.disk, main.steps,
                          o.measure_rates ? rates.nvme_mixed_bytes_per_s : 0);
  } else if (nvme) {
    out += "  disk                 no counters: " + main.disk_unavailable + "\n";
  }
  if (off) out += SerialText(main, *off, o.measure_rates ? &model : nullptr, overlap_auto, &j);
  if (text) *text = out;
  return j;
}

std::string FormatDiskLine(const std::string& name, const DiskActivity& d, int steps, double mixed_rate) {
  const uint64_t n = std::max(steps, 1);
  // Values start in the report's column 23; a longer name pushes them on by one space.
  const size_t pad = name.size() < 16 ? 16 - name.size() : 1;
  std::string out = "  disk " + name + std::string(pad, ' ') + "busy " +
                    FormatDouble("%.0f%%", 100 * d.busy_fraction) + " of the measured steps, " +
                    FormatDouble("%.1f", d.mean_in_flight) + " requests in flight on average, " +
                    FormatDouble("%.2f", d.bytes_per_s() / 1e9) + " GB/s (" + FormatBytes(d.read_bytes / n) +
                    " read, " + FormatBytes(d.write_bytes / n) + " written per step, by every process)";
  if (mixed_rate > 0)
    out += "; " + FormatDouble("%.2f", d.bytes_per_s() / mixed_rate) + " of the probe's mixed rate";
  return out + "\n";
}

}  // namespace strata::tools
