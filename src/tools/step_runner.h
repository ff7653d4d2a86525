// A model's training steps on an engine of its own, as `strata bench step` measures them
// and `strata plan` times a cut of the model (plan_model.h): the reference MLP on its
// synthetic data, or the GPT on a token file. One function type for both, so that the
// bench and the planner run either model through the same code.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/engine.h"
#include "strata/gpt.h"
#include "strata/mlp.h"
#include "strata/timeline.h"
#include "strata/token_data.h"
#include "zero/trainer.h"

namespace strata::tools {

struct StepRunOptions {
  int steps = 1;            // every step run, the first (which records the call order) included
  int64_t micro_batch = 1;  // samples (the GPT's: sequences) per rank per micro-batch
  uint64_t data_seed = 1;
  Timeline* timeline = nullptr;  // may be null
  // Called on the training thread as step `step` begins (end false: where its timing
  // starts) and ends (end true: where it stops, after Step() and, for the last step,
  // Flush()). Empty: nothing.
  std::function<void(int step, bool end)> step_boundary;
};

// What each step took and did, and the engine's layout (read before it is destroyed).
struct StepLog {
  std::vector<zero::StepTiming> timing;
  std::vector<StepResult> results;
  std::vector<double> losses;  // global mean loss of each step, before its update
  EngineLayoutInfo layout;
};

// Creates the model's engine under `config` over `world` (collective), runs the steps
// and returns their log. Errors: the engine's creation and the steps'.
using StepRunner =
    std::function<Result<StepLog>(Communicator& world, const Config& config, const StepRunOptions& options)>;

// The reference MLP on its synthetic data (zero::TrainWithEngine).
StepRunner MlpStepRunner(const model::MlpSpec& spec);

// The GPT on sequences of `seq` tokens of `train` (zero::GptTrainer), with every block
// recomputed in backward when `recompute`.
StepRunner GptStepRunner(const model::GptSpec& spec, int64_t seq,
                         std::shared_ptr<const model::TokenFile> train, bool recompute);

}  // namespace strata::tools
