// `strata train`: the GPT on token files by default, or the reference MLP.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/auto_plan.h"
#include "cli/commands.h"
#include "cli/gpt_flags.h"
#include "cli/gpt_train_job.h"
#include "cli/interrupt.h"
#include "cli/train_flags.h"
#include "cli/train_job.h"
#include "strata/comm.h"
#include "strata/token_data.h"
#include "tools/plan_model.h"

namespace strata::cli {
namespace {

// Says so when a swap directory will be created by the engine (rank 0).
void NoteMissingSwapDirs(const Config& c) {
  std::set<std::string> noted;
  for (const OffloadConfig* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
    if (o->device != OffloadDevice::kNvme) continue;
    for (const std::string& d : SwapPaths(c, *o)) {
      std::error_code ec;
      if (!std::filesystem::exists(d, ec) && noted.insert(d).second) {
        std::fprintf(stderr, "strata: swap directory %s does not exist; creating it\n", d.c_str());
      }
    }
  }
}

// The GPT's job; the data is found (or the default corpus prepared) before MPI starts.
GptTrainJob PrepareGpt(const TrainFlags& f, Prepared* p) {
  GptTrainJob job;
  const GptFlags& g = f.gpt;
  ThrowIfError(CheckModelFlags(f));  // before the flags make a model
  ThrowIfError(CheckSaveSettings(f.save, g.run.init_from));
  auto paths = FindOrPrepareData(g);
  ThrowIfError(paths.status());
  auto train = model::TokenFile::Open(paths->train);
  ThrowIfError(train.status().WithContext("training data"));
  auto spec = GptSpecFromFlags(g, train->vocab(), 0);
  ThrowIfError(spec.status());
  *p = Prepare(f, &job.origin);
  job.model = *spec;
  job.model.seed = p->config.seed;
  job.config = p->config;
  job.seq = g.seq;
  job.train_path = paths->train;
  job.val_path = paths->val;
  job.data_seed = p->config.seed + 1;
  job.steps = f.steps;
  job.run = g.run;
  static_cast<SaveSettings&>(job.run) = f.save;
  job.json = f.json;
  if (paths->prepared && p->world->rank() == 0) {
    std::fprintf(stderr, "strata: tokenised the default corpus (%s) into %s and %s\n",
                 model::kDefaultCorpusDir, paths->train.c_str(), paths->val.c_str());
  }
  return job;
}

// Ends the process after an interrupt or a failure the job reported with an exit status;
// returns normally after a run that succeeded.
void Finish(int code, Prepared& p) {
  if (code != 0) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);  // peers may be mid-collective: no MPI_Finalize
  }
  p.world.reset();
  ThrowIfError(FinalizeWorld());
}

void RunTrain(const TrainFlags& f) {
  // Before MPI and oneTBB start threads, so that they inherit the blocked signals.
  InterruptGuard guard(InterruptGuard::Options{f.keep_swap});
  if (f.model == "gpt") {
    Prepared p;
    GptTrainJob job = PrepareGpt(f, &p);
    if (job.config.strata.plan == "auto") {
      auto model =
          tools::GptPlanModel(job.model, job.seq, job.train_path, job.config.activation_checkpointing);
      ThrowIfError(model.status());
      ApplyAutoPlan(*p.world, *model, &job.config, &job.origin);
    }
    if (p.world->rank() == 0) NoteMissingSwapDirs(job.config);
    Finish(RunGptTrainJob(*p.world, job, guard), p);
    return;
  }
  TrainJob job;
  ThrowIfError(CheckSaveSettings(f.save));  // before MPI starts
  Prepared p = Prepare(f, &job.origin);
  if (p.config.strata.plan == "auto") {
    auto model = tools::MlpPlanModel(p.model);
    ThrowIfError(model.status());
    ApplyAutoPlan(*p.world, *model, &p.config, &job.origin);
  }
  job.steps = f.steps_option->count() || !f.mlp_steps ? f.steps : f.mlp_steps;
  job.config = p.config;
  job.model = p.model;
  job.data_seed = p.config.seed + 1;
  job.json = f.json;
  job.save = f.save;
  if (p.world->rank() == 0) NoteMissingSwapDirs(job.config);
  Finish(RunTrainJob(*p.world, job, guard), p);
}

void AddSaveFlags(CLI::App* cmd, SaveSettings* s) {
  cmd->add_option("--save", s->save_dir,
                  "checkpoint directory: DIR/step-NNNNNNNNN after every --save-every steps and the last");
  cmd->add_option("--save-every", s->save_every, "steps between checkpoints (0: only after the last step)")
      ->capture_default_str();
  cmd->add_option("--keep", s->keep,
                  "checkpoints kept under --save (older ones removed once a new one is complete)")
      ->capture_default_str();
  cmd->add_option(
      "--resume", s->resume,
      "continue from a checkpoint: its directory, a --save directory (its newest), or \"auto\" (the "
      "newest under --save, none: a fresh start); --steps counts the whole run's steps");
}

}  // namespace

void AddTrainCommand(CLI::App& app) {
  auto* f = new TrainFlags;  // lives as long as the process, like the App
  f->model = "gpt";
  auto* cmd = app.add_subcommand(
      "train", "train a GPT on text (or the reference MLP) with the ZeRO engine (mpirun for several ranks)");
  AddFlags(cmd, f, 600);
  f->mlp_steps = 10;
  AddGptFlags(cmd, &f->gpt);
  AddSaveFlags(cmd, &f->save);
  cmd->add_option("--model", f->model, "gpt: a GPT on token files; mlp: the reference MLP on synthetic data")
      ->check(CLI::IsMember({"gpt", "mlp"}))
      ->capture_default_str();
  cmd->add_flag("--keep-swap", f->keep_swap,
                "on SIGINT/SIGTERM, keep the swap files for inspection (named on exit)");
  cmd->callback([f] { RunTrain(*f); });
}

}  // namespace strata::cli
