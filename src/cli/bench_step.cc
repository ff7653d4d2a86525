// `strata bench step` and `strata bench swap`: training steps of the MLP (or, for bench
// step, the GPT) measured beside the step-time model's bound (tools/step_bench.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/gpt_flags.h"
#include "cli/train_flags.h"
#include "strata/comm.h"
#include "strata/token_data.h"
#include "tools/plan_model.h"
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

// The GPT the flags describe over its token files, found (or the default corpus
// prepared) before MPI starts, as `strata train` does; seeded once the config is read.
struct GptBenchModel {
  TokenPaths paths;
  model::GptSpec spec;
};

GptBenchModel PrepareGpt(const TrainFlags& f) {
  ThrowIfError(CheckModelFlags(f));  // before the flags make a model
  auto paths = FindOrPrepareData(f.gpt);
  ThrowIfError(paths.status());
  auto train = model::TokenFile::Open(paths->train);  // for its vocabulary
  ThrowIfError(train.status().WithContext("training data"));
  auto spec = GptSpecFromFlags(f.gpt, train->vocab(), 0);
  ThrowIfError(spec.status());
  return {*paths, *spec};
}

// The model of the bench's options: the reference MLP, or the GPT on sequences of --seq.
void SetModel(const TrainFlags& f, const Prepared& p, std::optional<GptBenchModel> gpt,
              tools::StepBenchOptions* o) {
  Result<tools::PlanModel> m = InvalidArgumentError("bench step: no model");
  if (gpt) {
    gpt->spec.seed = p.config.seed;
    const model::GptSpec& s = gpt->spec;
    m = tools::GptPlanModel(s, f.gpt.seq, gpt->paths.train, p.config.activation_checkpointing);
    o->model_keys = {{"kind", "gpt"},      {"n_layer", s.n_layer},       {"n_head", s.n_head},
                     {"n_embd", s.n_embd}, {"vocab_size", s.vocab_size}, {"block_size", s.block_size},
                     {"seq", f.gpt.seq},   {"tied_head", s.tied_head},   {"data", gpt->paths.train}};
  } else {
    m = tools::MlpPlanModel(p.model);
    o->model_keys = {{"kind", "mlp"}, {"hidden", p.model.hidden}};
  }
  ThrowIfError(m.status());
  o->model = std::move(*m);
}

void RunBench(const TrainFlags& f, bool swap) {
  std::map<std::string, std::string> origin;
  if (swap) {  // before MPI starts, as Prepare's own refusals
    Result<Config> config = BuildConfig(f, &origin);
    if (config.ok()) RefuseWithoutSwap(*config);
  }
  std::optional<GptBenchModel> gpt;
  if (f.model == "gpt") gpt = PrepareGpt(f);
  Prepared p = Prepare(f, &origin);
  tools::StepBenchOptions o;
  o.config = p.config;
  SetModel(f, p, std::move(gpt), &o);
  o.data_seed = p.config.seed + 1;
  o.steps = f.steps;
  o.micro_batch = p.config.train_micro_batch_size_per_gpu;
  o.compare_serial = !f.no_overlap;
  o.measure_rates = !f.no_probes;
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
  AddGptModelFlags(cmd, &f->gpt);
  cmd->add_option("--model", f->model,
                  "mlp: the reference MLP on synthetic data; gpt: the GPT of `strata train` on token files")
      ->check(CLI::IsMember({"gpt", "mlp"}))
      ->capture_default_str();
  cmd->add_option("--repeat", f->repeat, "whole rounds (run, probe, overlap off, probe); medians reported")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_flag("--no-probes", f->no_probes,
                "skip the disk, Adam and copy probes: steps, bytes and peaks only, with no model bound or "
                "efficiency (a grid of runs that needs only those)");
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
