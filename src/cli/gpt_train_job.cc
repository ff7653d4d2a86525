#include "cli/gpt_train_job.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/gpt_checkpoints.h"
#include "strata/checkpoint.h"
#include "strata/lr_schedule.h"
#include "strata/token_data.h"
#include "strata/units.h"
#include "tools/model_engine.h"
#include "tools/plan_model.h"
#include "tools/process_memory.h"
#include "tools/step_bench.h"
#include "zero/gpt_trainer.h"
#include "zero/safetensors_init.h"

namespace strata::cli {
namespace {

// The JSON-lines log (rank 0): one object per step and one per evaluation, flushed as
// written so that a plot of a live or interrupted run sees every line that ended.
class JsonLog {
 public:
  // A resumed run appends to the log of the run it continues.
  JsonLog(const std::string& path, bool append) : path_(path) {
    if (path.empty()) return;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!out_) {
      throw CliError(UnavailableError("--log " + path + ": cannot be opened for writing (" +
                                      std::strerror(errno) + ")"));
    }
  }
  void Write(const nlohmann::json& line) {
    if (path_.empty()) return;
    // Sampled bytes need not be UTF-8: those are written as U+FFFD, not refused.
    out_ << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    out_.flush();
    if (!out_) throw CliError(IoError("--log " + path_ + ": write failed (disk full?)"));
  }

 private:
  std::string path_;
  std::ofstream out_;
};

model::TokenFile OpenTokens(const std::string& path, const char* what) {
  auto f = model::TokenFile::Open(path);
  if (!f.ok()) throw CliError(f.status().WithContext(std::string(what) + " data"));
  return std::move(*f);
}

void PrintSummary(const GptTrainJob& job, const EngineLayoutInfo& l, const model::TokenFile& train,
                  const model::TokenFile& val, int world_size) {
  const model::GptSpec& m = job.model;
  std::printf(
      "strata train: GPT, %s parameters (%lld layers, %lld heads, n_embd %lld, block %lld, vocab %lld, %s "
      "head), %d chunks of %s\n",
      FormatCount(static_cast<double>(l.num_params)).c_str(), static_cast<long long>(m.n_layer),
      static_cast<long long>(m.n_head), static_cast<long long>(m.n_embd),
      static_cast<long long>(m.block_size), static_cast<long long>(m.vocab_size),
      m.tied_head ? "tied" : "untied", l.num_chunks,
      FormatBytes(static_cast<uint64_t>(l.chunk_elems) * 4).c_str());
  std::printf("  data: %s (%s tokens), validation %s (%s tokens); activation checkpointing %s\n",
              train.path().c_str(), FormatCount(static_cast<double>(train.size())).c_str(),
              val.path().c_str(), FormatCount(static_cast<double>(val.size())).c_str(),
              job.config.activation_checkpointing ? "on (every block recomputed in backward)" : "off");
  PrintConfigSummary(job.config, job.origin, l, world_size,
                     "sequences of " + std::to_string(job.seq) + " tokens");
}

std::string Printable(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s.push_back(id < 256 ? static_cast<char>(id) : '?');
  return s;
}

struct Loop {
  const GptTrainJob& job;
  Communicator& world;
  Engine& engine;
  zero::GptTrainer& trainer;
  const model::TokenFile& train;
  JsonLog& log;
  bool print;  // rank 0 in text mode
  nlohmann::json steps = nlohmann::json::array();
  nlohmann::json evals = nlohmann::json::array();
  int saving = -1;  // the steps done of the save in progress; -1: none

  Status Evaluate(int step) {
    STRATA_ASSIGN_OR_RETURN(const double loss, trainer.Evaluate());
    const nlohmann::json line = {{"step", step}, {"val_loss", loss}};
    evals.push_back(line);
    if (world.rank() == 0) log.Write(line);
    if (print) std::printf("validation loss %.6f after %d steps\n", loss, step), std::fflush(stdout);
    return OkStatus();
  }

  // A save after `done` steps when one is due (every --save-every steps and after the
  // last): started here, written while the next step runs, finished after it.
  Status MaybeStartSave(int done, int64_t applied) {
    const bool due = done == job.steps || (job.run.save_every > 0 && done % job.run.save_every == 0);
    if (job.run.save_dir.empty() || !due) return OkStatus();
    STRATA_RETURN_IF_ERROR(StartSave(engine, job, train, done, applied));
    saving = done;
    return OkStatus();
  }

  Status FinishPendingSave() {
    if (saving < 0) return OkStatus();
    const int done = saving;
    saving = -1;
    STRATA_ASSIGN_OR_RETURN(const CheckpointTimes t, FinishSave(engine, job, world.rank()));
    const std::string path = CheckpointPath(job.run.save_dir, done);
    if (world.rank() == 0)
      log.Write({{"step", done}, {"checkpoint", path}, {"save_s", t.total_s}, {"stall_s", t.stalled_s()}});
    if (print) {
      std::printf("checkpoint %s saved in %s, written behind training (training waited %s)\n", path.c_str(),
                  FormatSeconds(t.total_s).c_str(), FormatSeconds(t.stalled_s()).c_str());
    }
    return OkStatus();
  }

  // Steps from `from` (the resume point's, or 0) to job.steps.
  Status Train(const ResumePoint& from) {
    StepProgress progress(job.steps, static_cast<double>(job.config.train_batch_size) * job.seq, "tokens",
                          job.config.fp16.enabled);
    if (from.dir.empty()) STRATA_RETURN_IF_ERROR(Evaluate(0));
    int64_t applied = from.applied;  // the schedule advances on applied steps only, as DeepSpeed's
    for (int step = static_cast<int>(from.next_step); step < job.steps; ++step) {
      const double lr = LearningRateAt(job.config.scheduler, applied, job.config.optimizer.lr);
      STRATA_RETURN_IF_ERROR(engine.SetLearningRate(lr));
      STRATA_ASSIGN_OR_RETURN(zero::GptStepReport r, trainer.RunStep(step, step + 1 == job.steps));
      applied += r.result.skipped ? 0 : 1;
      const double seconds = r.timing.total_s();
      const double tokens_per_s = static_cast<double>(job.config.train_batch_size) * job.seq / seconds;
      const nlohmann::json line = {{"step", step + 1},
                                   {"loss", r.loss},
                                   {"lr", lr},
                                   {"tokens_per_s", tokens_per_s},
                                   {"seconds", seconds},
                                   {"grad_norm", r.result.grad_norm},
                                   {"skipped", r.result.skipped},
                                   {"overlapped", r.result.overlapped}};
      steps.push_back(line);
      if (world.rank() == 0) log.Write(line);
      if (print)
        std::printf("%s\n", progress.Line(step, r.loss, lr, seconds, r.result).c_str()), std::fflush(stdout);
      const bool last = step + 1 == job.steps;
      if (last || (job.run.eval_every > 0 && (step + 1) % job.run.eval_every == 0))
        STRATA_RETURN_IF_ERROR(Evaluate(step + 1));
      STRATA_RETURN_IF_ERROR(FinishPendingSave());  // the one started a step ago
      STRATA_RETURN_IF_ERROR(MaybeStartSave(step + 1, applied));
    }
    return FinishPendingSave();
  }

  Status Sample() {
    if (job.run.sample <= 0) return OkStatus();
    std::vector<int32_t> prompt;
    for (unsigned char c : job.run.prompt) prompt.push_back(c);
    if (prompt.empty()) prompt.push_back('\n');
    STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> text,
                            trainer.Sample(prompt, job.run.sample, job.data_seed + 101, job.run.temperature));
    if (print)
      std::printf("sample (temperature %g):\n%s%s\n", job.run.temperature, job.run.prompt.c_str(),
                  Printable(text).c_str());
    if (world.rank() == 0)
      log.Write({{"step", job.steps}, {"sample", Printable(text)}, {"sample_tokens", text}});
    return OkStatus();
  }
};

}  // namespace

int RunGptTrainJob(Communicator& world, const GptTrainJob& job, InterruptGuard& guard) {
  const bool rank0 = world.rank() == 0;
  StartRun(world, job.config, guard);
  const uint64_t base_rss = tools::CurrentRssBytes();  // before the engine and the model
  const model::TokenFile train = OpenTokens(job.train_path, "training");
  const model::TokenFile val = OpenTokens(job.val_path, "validation");
  // A log that cannot be written is refused before the engine's set-up, which takes
  // minutes for a large model (opened for append: a resumed run's log must survive).
  if (rank0 && !job.run.log_path.empty()) JsonLog(job.run.log_path, /*append=*/true);
  const model::GptSpec spec = job.model;
  ParamInit init = [spec](TensorId t, int64_t b, int64_t n, float* out) {
    model::InitGptTensor(spec, t, b, n, out);
  };
  std::shared_ptr<Status> init_error;
  if (!job.run.init_from.empty()) {
    auto from = zero::OpenSafetensorsInit(job.run.init_from, model::GptModel(spec));
    if (!from.ok()) return EndFailedRun(from.status().WithContext("--init-from"), guard);
    init = from->init;
    init_error = from->read_error;
    if (rank0 && !job.json)
      std::printf("initial weights: %s (%d tensors)\n", job.run.init_from.c_str(), from->tensors);
  }
  auto setup = tools::CreateModelEngine(world, job.config, model::GptModel(spec), init, nullptr);
  if (!setup.ok()) return EndFailedRun(setup.status(), guard);
  if (init_error && !init_error->ok()) return EndFailedRun(init_error->WithContext("--init-from"), guard);
  zero::GptTrainSpec ts;
  ts.model = spec;
  ts.seq = job.seq;
  ts.micro_batch = job.config.train_micro_batch_size_per_gpu;
  ts.data_seed = job.data_seed;
  ts.recompute = job.config.activation_checkpointing;
  ts.eval_batches = job.run.eval_batches;
  ts.check_stop = [&guard] { return guard.Check(); };
  zero::GptTrainer trainer(*setup->engine, world, job.config, ts, train, &val);
  ThrowIfError(trainer.Check());
  const EngineLayoutInfo layout = setup->engine->layout_info();
  if (rank0 && !job.json) PrintSummary(job, layout, train, val, world.size());
  auto from = Resume(*setup->engine, job, train);
  if (!from.ok()) return EndFailedRun(from.status(), guard);
  if (rank0 && !job.json && !from->dir.empty()) {
    std::printf("resumed from %s after %lld steps", from->dir.c_str(),
                static_cast<long long>(from->next_step));
    if (from->saved_world != world.size() || from->saved_stage != job.config.zero.stage) {
      std::printf(" (saved by %d rank%s at stage %d, loaded by %d at stage %d)", from->saved_world,
                  from->saved_world == 1 ? "" : "s", from->saved_stage, world.size(), job.config.zero.stage);
    }
    std::printf("\n");
  }
  JsonLog log(rank0 ? job.run.log_path : std::string(), /*append=*/!from->dir.empty());
  Loop loop{job, world, *setup->engine, trainer, train, log, rank0 && !job.json};
  Status status = loop.Train(*from);
  if (status.ok()) status = loop.Sample();
  if (!status.ok()) {
    setup->engine.reset();  // closes the stores: their swap and lock files go
    return EndFailedRun(status, guard);
  }
  if (rank0 && job.json) {
    const nlohmann::json report = {
        {"config", ConfigToJson(job.config)},
        {"world_size", world.size()},
        {"model", {{"params", layout.num_params}, {"chunks", layout.num_chunks}}},
        {"budget_need", {{"device", layout.device_need}, {"host", layout.host_need}}},
        {"peak_rss_bytes", tools::PeakRssBytes()},
        {"steps", loop.steps},
        {"evaluations", loop.evals}};
    std::printf("%s\n", report.dump(2).c_str());
  } else if (rank0) {
    std::printf("%s\n", MemoryAccountLine(layout, job.config, base_rss,
                                          tools::GptActivationBytes(job.model, job.seq,
                                                                    job.config.activation_checkpointing))
                            .c_str());
  }
  return 0;
}

}  // namespace strata::cli
