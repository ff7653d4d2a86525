#include "zero/gpt_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "zero/timed_hooks.h"

namespace strata::zero {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// SplitMix64: the same draws on every rank and every platform (std's distributions are
// not specified bit for bit).
uint64_t NextRandom(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Index drawn from softmax(logits / temperature), in double so that the draw does not
// depend on the summation order of the vocabulary.
int32_t Draw(const float* logits, int64_t vocab, double temperature, uint64_t* state) {
  const double top = *std::max_element(logits, logits + vocab);
  std::vector<double> p(vocab);
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i) sum += p[i] = std::exp((logits[i] - top) / temperature);
  const double u = static_cast<double>(NextRandom(state) >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    acc += p[i];
    if (u < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(vocab - 1);
}

Status CheckFile(const model::TokenFile& f, const model::GptSpec& m, int64_t seq) {
  if (f.vocab() > m.vocab_size) {
    return InvalidArgumentError(f.path() + ": its vocabulary has " + std::to_string(f.vocab()) +
                                " token ids, more than the model's vocab_size " +
                                std::to_string(m.vocab_size));
  }
  if (f.size() <= seq + 1) {
    return InvalidArgumentError(f.path() + ": " + std::to_string(f.size()) +
                                " tokens, too few for samples of " + std::to_string(seq) +
                                " tokens plus a target; use a shorter --seq or more text");
  }
  return OkStatus();
}

}  // namespace

GptTrainer::GptTrainer(Engine& engine, Communicator& world, const Config& config, GptTrainSpec spec,
                       const model::TokenFile& train, const model::TokenFile* val)
    : engine_(engine),
      world_(world),
      config_(config),
      spec_(std::move(spec)),
      train_(train),
      val_(val),
      gpt_(spec_.model, engine.model_backend(), engine.model_stream()) {
  gpt_.set_recompute(spec_.recompute);
}

Status GptTrainer::Check() const {
  if (spec_.seq < 1 || spec_.seq > spec_.model.block_size) {
    return InvalidArgumentError("sequence length " + std::to_string(spec_.seq) + ": must be in 1.." +
                                std::to_string(spec_.model.block_size) + " (the model's block_size)");
  }
  STRATA_RETURN_IF_ERROR(CheckFile(train_, spec_.model, spec_.seq));
  if (val_) STRATA_RETURN_IF_ERROR(CheckFile(*val_, spec_.model, spec_.seq));
  return OkStatus();
}

Result<GptStepReport> GptTrainer::RunStep(int64_t step, bool flush) {
  const int accum = config_.gradient_accumulation_steps;
  const int64_t b = spec_.micro_batch, t = spec_.seq;
  tokens_.resize(b * t);
  targets_.resize(b * t);
  GptStepReport report;
  const double scale = engine_.loss_scale();
  TimedHooks hooks(engine_, spec_.check_stop, no_before_backward_);
  const auto t0 = std::chrono::steady_clock::now();
  double loss = 0;
  for (int m = 0; m < accum; ++m) {
    if (spec_.check_stop) STRATA_RETURN_IF_ERROR(spec_.check_stop());
    const model::BatchSlice slice{step, world_.rank(), world_.size(), m, accum, b};
    model::FillBatch(train_, spec_.data_seed, slice, t, tokens_.data(), targets_.data());
    STRATA_RETURN_IF_ERROR(engine_.BeginMicroBatch());
    // Dividing by the global token count / scale multiplies every gradient by the scale.
    const double normaliser = static_cast<double>(slice.GlobalBatchSize() * t) / scale;
    STRATA_ASSIGN_OR_RETURN(double l,
                            gpt_.ForwardBackward(tokens_.data(), targets_.data(), b, t, normaliser, hooks));
    loss += l / scale;
  }
  const auto t1 = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(report.result, engine_.Step());
  if (flush) STRATA_RETURN_IF_ERROR(engine_.Flush());
  report.timing.forward_backward_s = Seconds(t0, t1);
  report.timing.hooks_s = hooks.seconds();
  report.timing.model_wait_s = report.result.model_wait_s;
  report.timing.step_s = Seconds(t1, std::chrono::steady_clock::now());
  STRATA_ASSIGN_OR_RETURN(report.loss, SumInRankOrder(world_, loss));
  return report;
}

Status GptTrainer::Evaluating(const std::function<Status(ModuleHooks& hooks)>& passes) {
  STRATA_RETURN_IF_ERROR(engine_.SetEvaluating(true));
  TimedHooks hooks(engine_, spec_.check_stop, no_before_backward_);
  const Status status = passes(hooks);
  const Status off = engine_.SetEvaluating(false);
  return status.ok() ? off : status;
}

Result<double> GptTrainer::Evaluate() {
  if (!val_) return FailedPreconditionError("GptTrainer::Evaluate: no validation file");
  const int64_t b = spec_.micro_batch, t = spec_.seq, n = spec_.eval_batches;
  tokens_.resize(b * t);
  targets_.resize(b * t);
  double loss = 0;
  STRATA_RETURN_IF_ERROR(Evaluating([&](ModuleHooks& hooks) -> Status {
    for (int64_t i = 0; i < n; ++i) {
      const model::BatchSlice slice{0, world_.rank(), world_.size(), static_cast<int>(i), static_cast<int>(n),
                                    b};
      model::FillBatch(*val_, spec_.data_seed + kValidationSeedOffset, slice, t, tokens_.data(),
                       targets_.data());
      STRATA_ASSIGN_OR_RETURN(const double l,
                              gpt_.Forward(tokens_.data(), targets_.data(), b, t,
                                           static_cast<double>(slice.GlobalBatchSize() * t), hooks));
      loss += l;
    }
    return OkStatus();
  }));
  return SumInRankOrder(world_, loss);
}

Result<std::vector<int32_t>> GptTrainer::Sample(const std::vector<int32_t>& prompt, int64_t count,
                                                uint64_t seed, double temperature) {
  if (prompt.empty() || !(temperature > 0)) {
    return InvalidArgumentError("GptTrainer::Sample: needs a non-empty prompt and a temperature above 0");
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= spec_.model.vocab_size)
      return InvalidArgumentError("GptTrainer::Sample: prompt token " + std::to_string(id) +
                                  " is outside the vocabulary");
  }
  std::vector<int32_t> text = prompt, out;
  uint64_t state = seed;
  const int64_t vocab = spec_.model.vocab_size;
  std::vector<float> last(static_cast<size_t>(vocab));  // the logits of the context's last token
  STRATA_RETURN_IF_ERROR(Evaluating([&](ModuleHooks& hooks) -> Status {
    while (static_cast<int64_t>(out.size()) < count) {
      const int64_t len = std::min<int64_t>(static_cast<int64_t>(text.size()), spec_.model.block_size);
      const std::vector<int32_t> context(text.end() - len, text.end()), zeros(len, 0);
      STRATA_RETURN_IF_ERROR(
          gpt_.Forward(context.data(), zeros.data(), 1, len, static_cast<double>(len), hooks).status());
      STRATA_RETURN_IF_ERROR(gpt_.CopyLogits(len - 1, 1, last.data()));
      const int32_t next = Draw(last.data(), vocab, temperature, &state);
      text.push_back(next);
      out.push_back(next);
    }
    return OkStatus();
  }));
  return out;
}

}  // namespace strata::zero
