// `strata train` and `strata bench step`: the reference MLP trained by the engine.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "strata/comm.h"
#include "strata/units.h"
#include "zero/step_bench.h"

namespace strata::cli {
namespace {

struct TrainFlags {
  std::string config_path;
  std::string params = "20M";  // with the default chunk size: a few chunks, seconds per step
  int depth = 4;
  int stage = -1;
  std::string offload_optimizer, offload_param, nvme_path;
  std::string device = "sim";
  std::string device_budget, host_budget, chunk_size;
  int steps = 0;
  int64_t micro_batch = 32;
  bool no_overlap = false, serial_too = true, json = false;
  int repeat = 1;  // bench step: whole rounds, medians reported
  std::string trace;
};

void AddFlags(CLI::App* cmd, TrainFlags* f, int default_steps) {
  f->steps = default_steps;
  cmd->add_option("--config", f->config_path, "JSON config (DeepSpeed keys + strata block); flags override it");
  cmd->add_option("--params", f->params, "MLP parameter count, e.g. 20M, 2e9")->capture_default_str();
  cmd->add_option("--depth", f->depth, "hidden layers")->capture_default_str();
  cmd->add_option("--stage", f->stage, "zero_optimization.stage (0-3)");
  cmd->add_option("--offload-optimizer", f->offload_optimizer, "none|cpu|nvme");
  cmd->add_option("--offload-param", f->offload_param, "none|cpu|nvme (stage 3)");
  cmd->add_option("--nvme-path", f->nvme_path, "swap directory for nvme offload");
  cmd->add_option("--device", f->device, "sim|cuda|auto")->capture_default_str();
  cmd->add_option("--device-budget", f->device_budget, "strata.device_budget, e.g. 2GiB");
  cmd->add_option("--host-budget", f->host_budget, "strata.host_budget, e.g. 4GiB");
  cmd->add_option("--chunk-size", f->chunk_size, "strata.chunk_size, e.g. 64MiB (default 16MiB here)");
  cmd->add_option("--steps", f->steps, "measured steps")->capture_default_str();
  cmd->add_option("--micro-batch", f->micro_batch, "samples per rank per micro-batch")->capture_default_str();
  cmd->add_flag("--no-overlap", f->no_overlap, "strata.overlap false");
  cmd->add_flag("--json", f->json, "print the report as JSON");
  cmd->add_option("--trace", f->trace, "write a Chrome trace (open in Perfetto)");
}

Result<zero::StepBenchOptions> Build(const TrainFlags& f) {
  nlohmann::json j = nlohmann::json::object();
  if (!f.config_path.empty()) {
    std::ifstream in(f.config_path);
    if (!in) return NotFoundError("config file \"" + f.config_path + "\" cannot be opened");
    try {
      j = nlohmann::json::parse(in, nullptr, true, true);
    } catch (const nlohmann::json::exception& e) {
      return InvalidArgumentError(f.config_path + ": not valid JSON: " + e.what());
    }
  }
  auto& z = j["zero_optimization"];
  if (f.config_path.empty() && f.stage < 0 && f.offload_optimizer.empty() && f.offload_param.empty()) {
    // No arguments: the configuration strata exists for (ZeRO-Infinity: stage 3 with
    // optimizer state and parameters on NVMe, here in the temp directory).
    z["stage"] = 3;
    z["offload_optimizer"]["device"] = "nvme";
    z["offload_param"]["device"] = "nvme";
  }
  if (f.stage >= 0) z["stage"] = f.stage;
  const std::string swap = f.nvme_path.empty() ? (std::filesystem::temp_directory_path() / "strata-swap").string()
                                               : f.nvme_path;
  if (!f.offload_optimizer.empty()) z["offload_optimizer"]["device"] = f.offload_optimizer;
  if (!f.offload_param.empty()) z["offload_param"]["device"] = f.offload_param;
  for (const char* k : {"offload_optimizer", "offload_param"}) {
    if (z.contains(k) && z[k].value("device", "") == "nvme" && !z[k].contains("nvme_path")) z[k]["nvme_path"] = swap;
  }
  if (z.empty()) j.erase("zero_optimization");
  j["strata"]["device"] = f.device;
  if (!f.device_budget.empty()) j["strata"]["device_budget"] = f.device_budget;
  if (!f.host_budget.empty()) j["strata"]["host_budget"] = f.host_budget;
  if (!f.chunk_size.empty()) {
    j["strata"]["chunk_size"] = f.chunk_size;
  } else if (!j["strata"].contains("chunk_size")) {
    j["strata"]["chunk_size"] = "16MiB";  // several chunks even for small models, so the pipeline shows
  }
  if (f.no_overlap) j["strata"]["overlap"] = false;
  if (!f.trace.empty()) j["strata"]["trace_file"] = f.trace;
  STRATA_ASSIGN_OR_RETURN(Config config, ParseConfig(j));
  auto params_or = ParseCount(f.params);
  if (!params_or.ok()) return params_or.status().WithContext("--params");
  const uint64_t params = *params_or;
  if (f.depth < 1) return InvalidArgumentError("--depth must be >= 1");
  if (f.steps < 1) return InvalidArgumentError("--steps must be >= 1");
  zero::StepBenchOptions o;
  o.config = config;
  o.spec.model = model::MlpSpecForParams(static_cast<double>(params), f.depth, 256, 16, model::LossKind::kMse,
                                         config.seed);
  o.spec.data.seed = config.seed + 1;
  o.spec.steps = f.steps;
  o.spec.micro_batch = f.micro_batch;
  return o;
}

void Run(const TrainFlags& f, bool bench) {
  auto opts = Build(f);
  ThrowIfError(opts.status());
  opts->compare_serial = bench && !f.no_overlap;
  opts->measure_rates = bench;
  opts->print_losses = !bench && !f.json;
  auto world = InitWorld(CommOptions{"world", opts->config.strata.collective_timeout_s});
  ThrowIfError(world.status());
  std::string text;
  Result<nlohmann::json> report = nlohmann::json();
  if (f.repeat <= 1) {
    report = zero::RunStepBench(**world, *opts, &text);
  } else {
    std::vector<nlohmann::json> rounds;
    for (int i = 0; i < f.repeat && report.ok(); ++i) {
      report = zero::RunStepBench(**world, *opts, nullptr);
      if (report.ok()) rounds.push_back(*report);
    }
    if (report.ok()) report = zero::SummarizeRounds(rounds, &text);
  }
  ThrowIfError(report.status());
  if ((*world)->rank() == 0) {
    if (f.json) {
      std::printf("%s\n", report->dump(2).c_str());
    } else {
      std::fputs(text.c_str(), stdout);
    }
  }
  world->reset();
  ThrowIfError(FinalizeWorld());
}

}  // namespace

void AddTrainCommand(CLI::App& app) {
  auto* f = new TrainFlags;  // lives as long as the process, like the App
  auto* cmd = app.add_subcommand("train", "train the reference MLP with the ZeRO engine (mpirun for several ranks)");
  AddFlags(cmd, f, 10);
  cmd->callback([f] { Run(*f, /*bench=*/false); });
}

void AddBenchStepCommand(CLI::App& bench) {
  auto* f = new TrainFlags;
  auto* cmd = bench.add_subcommand("step", "training steps: time, breakdown, bytes per link, high water, model bound");
  AddFlags(cmd, f, 3);
  cmd->add_option("--repeat", f->repeat, "whole rounds (run, probe, overlap off, probe); medians reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->callback([f] { Run(*f, /*bench=*/true); });
}

}  // namespace strata::cli
