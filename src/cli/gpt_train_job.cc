#include "cli/gpt_train_job.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/gpt_throughput.h"
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
      "head), %d chunks of %s%s\n",
      FormatCount(static_cast<double>(l.num_params)).c_str(), static_cast<long long>(m.n_layer),
      static_cast<long long>(m.n_head), static_cast<long long>(m.n_embd),
      static_cast<long long>(m.block_size), static_cast<long long>(m.vocab_size),
      m.tied_head ? "tied" : "untied", l.num_chunks,
      FormatBytes(static_cast<uint64_t>(l.chunk_elems) * 4).c_str(),
      l.run_chunks > 0
          ? (", " + std::to_string(l.run_chunks) + " of them held by tensors larger than a chunk").c_str()
          : "");
  std::printf("  data: %s (%s tokens), validation %s (%s tokens); activation checkpointing %s\n",
              train.path().c_str(), FormatCount(static_cast<double>(train.size())).c_str(),
              val.path().c_str(), FormatCount(static_cast<double>(val.size())).c_str(),
              job.config.activation_checkpointing ? "on (every block recomputed in backward)" : "off");
  PrintConfigSummary(job.config, job.origin, l, world_size,
                     "sequences of " + std::to_string(job.seq) + " tokens");
}

// The text of `ids`: their BPE bytes, or the bytes they are (byte-level tokens).
Result<std::string> Printable(const std::vector<int32_t>& ids,
                              const std::optional<model::BpeTokenizer>& bpe) {
  if (bpe) return bpe->Decode(ids);
  std::string s;
  for (int32_t id : ids) s.push_back(id < 256 ? static_cast<char>(id) : '?');
  return s;
}

// The prompt's tokens: BPE, or its bytes.
Result<std::vector<int32_t>> PromptTokens(const std::string& prompt,
                                          std::optional<model::BpeTokenizer>& bpe) {
  const std::string text = prompt.empty() ? "\n" : prompt;
  if (bpe) {
    Result<std::vector<int32_t>> ids = bpe->Encode(text);
    if (!ids.ok()) return ids.status().WithContext("--prompt");
    return ids;
  }
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

// What a resumed run must share with the saved one to continue it bit for bit.
nlohmann::json RunIdentity(const GptTrainJob& job, const model::TokenFile& train) {
  const model::GptSpec& m = job.model;
  return {{"model",
           {{"vocab_size", m.vocab_size},
            {"block_size", m.block_size},
            {"n_layer", m.n_layer},
            {"n_head", m.n_head},
            {"n_embd", m.n_embd},
            {"tied_head", m.tied_head},
            {"seed", m.seed}}},
          {"seq", job.seq},
          {"data_seed", job.data_seed},
          {"train_tokens", train.size()}};
}

struct Loop {
  const GptTrainJob& job;
  Communicator& world;
  Engine& engine;
  zero::GptTrainer& trainer;
  const model::TokenFile& train;
  JsonLog& log;
  bool print;  // rank 0 in text mode
  RunSaver& saver;
  std::optional<model::BpeTokenizer>& bpe;  // the data's tokenizer; byte-level when empty
  nlohmann::json steps = nlohmann::json::array();
  nlohmann::json evals = nlohmann::json::array();

  Status Evaluate(int step) {
    STRATA_ASSIGN_OR_RETURN(const double loss, trainer.Evaluate());
    const nlohmann::json line = {{"step", step}, {"val_loss", loss}};
    evals.push_back(line);
    if (world.rank() == 0) log.Write(line);
    if (print) std::printf("validation loss %.6f after %d steps\n", loss, step), std::fflush(stdout);
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
      STRATA_RETURN_IF_ERROR(saver.AfterStep(step + 1, applied));
    }
    return saver.Finish();
  }

  Status Sample() {
    if (job.run.sample <= 0) return OkStatus();
    STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptTokens(job.run.prompt, bpe));
    STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> text,
                            trainer.Sample(prompt, job.run.sample, job.data_seed + 101, job.run.temperature));
    STRATA_ASSIGN_OR_RETURN(const std::string sample, Printable(text, bpe));
    if (print)
      std::printf("sample (temperature %g):\n%s%s\n", job.run.temperature, job.run.prompt.c_str(),
                  sample.c_str());
    if (world.rank() == 0) log.Write({{"step", job.steps}, {"sample", sample}, {"sample_tokens", text}});
    return OkStatus();
  }
};

}  // namespace

int RunGptTrainJob(Communicator& world, const GptTrainJob& job, InterruptGuard& guard) {
  const bool rank0 = world.rank() == 0;
  StartRun(world, job.config, guard);
  const uint64_t base_rss = tools::MeasureProcessBase();  // before the engine and the model
  const model::TokenFile train = OpenTokens(job.train_path, "training");
  const model::TokenFile val = OpenTokens(job.val_path, "validation");
  Result<std::optional<model::BpeTokenizer>> bpe = model::LoadDataTokenizer(job.train_path, train.vocab());
  if (!bpe.ok()) return EndFailedRun(bpe.status(), guard);
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
  const double activations =
      tools::GptActivationBytes(job.model, job.seq, job.config.activation_checkpointing) *
      static_cast<double>(job.config.train_micro_batch_size_per_gpu);
  auto setup = tools::CreateModelEngine(world, job.config, model::GptModel(spec), init, nullptr,
                                        static_cast<uint64_t>(activations));
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
  auto trainer = std::make_unique<zero::GptTrainer>(*setup->engine, world, job.config, ts, train, &val);
  ThrowIfError(trainer->Check());
  const EngineLayoutInfo layout = setup->engine->layout_info();
  if (rank0 && !job.json) PrintSummary(job, layout, train, val, world.size());
  const nlohmann::json identity = RunIdentity(job, train);
  auto from = Resume(*setup->engine, job.run, identity);
  if (!from.ok()) return EndFailedRun(from.status(), guard);
  if (rank0 && !job.json && !from->dir.empty())
    std::printf("%s\n", ResumeLine(*from, world.size(), job.config.zero.stage).c_str());
  JsonLog log(rank0 ? job.run.log_path : std::string(), /*append=*/!from->dir.empty());
  const bool print = rank0 && !job.json;
  RunSaver saver(*setup->engine, job.run, identity, job.steps, world.rank(), [&](const nlohmann::json& line) {
    if (rank0) log.Write(line);
    if (print) std::printf("%s\n", SaveLine(line).c_str());
  });
  Loop loop{job, world, *setup->engine, *trainer, train, log, print, saver, *bpe};
  Status status = loop.Train(*from);
  if (status.ok()) status = loop.Sample();
  if (!status.ok()) {
    setup->engine.reset();  // closes the stores: their swap and lock files go
    return EndFailedRun(status, guard);
  }
  // The model and the engine go first: the matrices of the products' probe then take
  // memory they freed instead of adding to the run's peak. Every rank measures them at
  // once, sharing the cores as training did.
  const Backend backend = setup->engine->model_backend();
  const DType weights = setup->engine->compute_dtype();
  trainer.reset();  // `loop` calls it no more
  setup->engine.reset();
  const nlohmann::json throughput =
      GptThroughput(job.model, job.seq, job.config.train_micro_batch_size_per_gpu, world.size(), loop.steps,
                    backend, weights);
  if (rank0 && !throughput.empty()) log.Write({{"throughput", throughput}});
  if (rank0 && job.json) {
    const nlohmann::json report = {
        {"config", ConfigToJson(job.config)},
        {"world_size", world.size()},
        {"model", {{"params", layout.num_params}, {"chunks", layout.num_chunks}}},
        {"budget_need", {{"device", layout.device_need}, {"host", layout.host_need}}},
        {"peak_rss_bytes", tools::PeakRssBytes()},
        {"steps", loop.steps},
        {"throughput", throughput},
        {"evaluations", loop.evals}};
    std::printf("%s\n", report.dump(2).c_str());
  } else if (rank0) {
    std::printf("%s\n", ThroughputLine(throughput).c_str());
    std::printf("%s\n", MemoryAccountLine(layout, job.config, base_rss,
                                          tools::GptActivationBytes(job.model, job.seq,
                                                                    job.config.activation_checkpointing),
                                          train.token_bytes() + val.token_bytes())
                            .c_str());
  }
  return 0;
}

}  // namespace strata::cli
