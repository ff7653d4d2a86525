// The GPT (model::Gpt) trained by the engine on a token file: one training step at a time,
// a validation loss over fixed samples, and text sampled from the model. Collective: every
// rank makes the same calls in the same order (at stage 3 each forward gathers over the
// world).
//
// Data: the training samples of step s are model::FillBatch's over the training file
// with seed spec.data_seed (BatchSlice numbering, so a world of N ranks with micro-batch
// B sees the samples of one rank with micro-batch N * B). Validation uses the same
// fixed samples at every evaluation: sample j of the validation file under seed
// data_seed + kValidationSeedOffset, for j in [0, eval_batches * micro_batch * world),
// rank r taking micro-batch i's slice as BatchSlice{0, r, world, i, eval_batches, B}
// numbers it. Losses are mean cross-entropy per token over the global batch.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/engine.h"
#include "strata/gpt.h"
#include "strata/token_data.h"
#include "zero/trainer.h"

namespace strata::zero {

inline constexpr uint64_t kValidationSeedOffset = 7;

struct GptTrainSpec {
  model::GptSpec model;
  int64_t seq = 0;          // tokens per sample, 1..model.block_size
  int64_t micro_batch = 1;  // samples per rank per micro-batch
  uint64_t data_seed = 0;
  bool recompute = false;    // activation checkpointing of every block
  int64_t eval_batches = 1;  // micro-batches per rank per evaluation
  // Polled before each micro-batch and each module hook; a non-OK Status stops the call
  // and is returned (an interrupt). Empty: never.
  std::function<Status()> check_stop;
};

struct GptStepReport {
  double loss = 0;  // global mean token loss, before the step's update
  StepTiming timing;
  StepResult result;
};

class GptTrainer {
 public:
  // Borrows everything; `val` may be null (no evaluation). The files must hold more
  // than seq + 1 tokens and ids below the model's vocab (InvalidArgument from Check).
  GptTrainer(Engine& engine, Communicator& world, const Config& config, GptTrainSpec spec,
             const model::TokenFile& train, const model::TokenFile* val);

  // InvalidArgument naming the file or setting that cannot work with this model.
  Status Check() const;

  // Training step `step` (its index in the whole run: the data position), its
  // gradient_accumulation_steps micro-batches and the engine's Step(). `flush` waits for
  // the step's writes behind (count them in the last step's time).
  Result<GptStepReport> RunStep(int64_t step, bool flush);
  // The validation loss (the engine in evaluation mode for the passes).
  Result<double> Evaluate();
  // `count` tokens drawn after `prompt` (non-empty), each from the softmax of the last
  // position's logits / temperature (> 0), by a generator seeded with `seed`. The
  // context is the last block_size tokens. Every rank draws the same tokens.
  Result<std::vector<int32_t>> Sample(const std::vector<int32_t>& prompt, int64_t count, uint64_t seed,
                                      double temperature);

  const model::Gpt& model() const { return gpt_; }

 private:
  // Runs `passes` with the engine in evaluation mode (Engine::SetEvaluating), which is
  // left again whatever they return; the first error.
  Status Evaluating(const std::function<Status(ModuleHooks& hooks)>& passes);

  Engine& engine_;
  Communicator& world_;
  const Config& config_;
  GptTrainSpec spec_;
  const model::TokenFile& train_;
  const model::TokenFile* val_;
  model::Gpt gpt_;
  std::vector<int32_t> tokens_, targets_;
  std::function<void(int)> no_before_backward_;
};

}  // namespace strata::zero
