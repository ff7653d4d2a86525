// `strata bench step` and `strata bench swap`: training steps of the MLP measured beside
// the step-time model's bound (tools/step_bench.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/train_flags.h"
#include "strata/comm.h"
#include "tools/step_bench.h"

namespace strata::cli {
namespace {

// `bench swap` measures the engine's NVMe swap: a run that puts nothing on NVMe would
// measure something else under its name.
void RefuseWithoutSwap(const Config& c) {
  if (c.zero.offload_optimizer.device == OffloadDevice::kNvme ||
      c.zero.offload_param.device == OffloadDevice::kNvme) {
    return;
  }
  throw CliError(InvalidArgumentError(
      "bench swap: nothing is offloaded to NVMe (zero_optimization.offload_optimizer.device and "
      "offload_param.device are not \"nvme\"); leave them unset for stage 3 with both on NVMe, or use "
      "`strata bench step` for other configurations"));
}

void RunBench(const TrainFlags& f, bool swap) {
  std::map<std::string, std::string> origin;
  if (swap) {  // before MPI starts, as Prepare's own refusals
    Result<Config> config = BuildConfig(f, &origin);
    if (config.ok()) RefuseWithoutSwap(*config);
  }
  Prepared p = Prepare(f, &origin);
  tools::StepBenchOptions o;
  o.config = p.config;
  o.spec.model = p.model;
  o.spec.data.seed = p.config.seed + 1;
  o.spec.steps = f.steps;
  o.spec.micro_batch = p.config.train_micro_batch_size_per_gpu;
  o.compare_serial = !f.no_overlap;
  o.measure_rates = true;
  std::string text;
  Result<nlohmann::json> report = nlohmann::json();
  if (f.repeat <= 1) {
    report = tools::RunStepBench(*p.world, o, &text);
  } else {
    std::vector<nlohmann::json> rounds;
    for (int i = 0; i < f.repeat && report.ok(); ++i) {
      report = tools::RunStepBench(*p.world, o, nullptr);
      if (report.ok()) rounds.push_back(*report);
    }
    if (report.ok()) report = tools::SummarizeRounds(rounds, &text);
  }
  ThrowIfError(report.status());
  if (p.world->rank() == 0) {
    if (f.json) {
      std::printf("%s\n", report->dump(2).c_str());
    } else {
      std::fputs(text.c_str(), stdout);
    }
  }
  p.world.reset();
  ThrowIfError(FinalizeWorld());
}

}  // namespace

void AddBenchStepCommand(CLI::App& bench) {
  auto* f = new TrainFlags;
  auto* cmd = bench.add_subcommand(
      "step", "training steps: time, breakdown, bytes per link, high water, model bound");
  AddFlags(cmd, f, 3);
  cmd->add_option("--repeat", f->repeat, "whole rounds (run, probe, overlap off, probe); medians reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->callback([f] { RunBench(*f, /*swap=*/false); });
}

void AddBenchSwapCommand(CLI::App& bench) {
  auto* f = new TrainFlags;
  auto* cmd = bench.add_subcommand(
      "swap",
      "NVMe swap experiment: training steps with the engine's own swap (by default stage 3 with optimizer "
      "state and parameters on NVMe), bytes moved and the disk's rate beside its bound (bench step's "
      "report)");
  AddFlags(cmd, f, 3);
  cmd->add_option("--repeat", f->repeat, "whole rounds (run, probe, overlap off, probe); medians reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  f->swap_bench = true;
  cmd->callback([f] { RunBench(*f, /*swap=*/true); });
}

}  // namespace strata::cli
