// Training loops for the reference MLP: one driven by the Engine (any stage, offload,
// world size) and the plain reference it is tested against (one rank, no sharding, no
// offload, everything in memory, the same data and the same precision rules).
#pragma once

#include <functional>
#include <vector>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/engine.h"
#include "strata/mlp.h"
#include "strata/model.h"

namespace strata::zero {

struct TrainSpec {
  model::MlpSpec model;
  model::DataSpec data;
  int steps = 20;
  int64_t micro_batch = 4;  // per rank
  // Test instrumentation: called on the training thread once the engine's BeginBackward
  // hook of module `m` returned, before the module's backward runs. Empty: nothing.
  std::function<void(int m)> before_backward;
  // Called on the training thread as step `step` begins (end false: before its first
  // micro-batch, where its timing starts) and ends (end true: where its timing stops,
  // after Step() and, for the last step, Flush()). Empty: nothing.
  std::function<void(int step, bool end)> step_boundary;
  // Called on the training thread before each micro-batch and around each module's
  // hooks; a non-OK Status stops the run and is returned (an interrupt). Empty: never.
  std::function<Status()> check_stop;
  // A resumed run: the step it starts from (its data and index) and the optimizer steps
  // applied before it (the learning-rate schedule's count).
  int first_step = 0;
  int64_t first_applied = 0;
  // Called on every rank after each step's Step() and loss: `done` steps of the run
  // taken, `applied` of them applied. Collectives (a checkpoint) may be issued there; a
  // non-OK Status stops the run and is returned. Empty: nothing.
  std::function<Status(int done, int64_t applied)> after_step;
};

// Wall time of one step on the training thread.
struct StepTiming {
  double forward_backward_s = 0;  // the model's passes, hooks included
  double hooks_s = 0;             // inside the engine's hooks (gathers, waits for buffers)
  double model_wait_s = 0;        // of hooks_s, the model's kernels (StepResult::model_wait_s)
  double step_s = 0;              // inside Engine::Step()
  double compute_s() const { return forward_backward_s - hooks_s + model_wait_s; }
  double hook_wait_s() const { return hooks_s - model_wait_s; }  // the engine's own waits
  double total_s() const { return forward_backward_s + step_s; }
};

struct TrainLog {
  std::vector<StepTiming> timing;
  std::vector<double> losses;       // global mean loss of each step (before its update)
  std::vector<double> lrs;          // the learning rate of each step (config.scheduler)
  std::vector<bool> skipped;        // fp16 overflow steps
  std::vector<double> loss_scales;  // the scale each step's backward used
  std::vector<double> clip_coefs;
  std::vector<StepResult> results;  // engine runs only
};

// The sum of every rank's `value`, added in rank order so that every rank gets the same
// bits (collective over `world`; `value` itself at world size 1).
Result<double> SumInRankOrder(Communicator& world, double value);

// Runs steps [spec.first_step, spec.steps) of the engine at the learning rates of
// config.scheduler (the log holds those steps only). Every
// rank calls it; the loss is reduced over `world` (host collectives, issued after each
// Step).
// `on_step`, when given, is called on every rank after each step, once its global
// loss is in `log` (log.losses.size() == step + 1): live progress.
Result<TrainLog> TrainWithEngine(Engine& engine, Communicator& world, const Config& config,
                                 const TrainSpec& spec,
                                 const std::function<void(const TrainLog& log)>& on_step = {});

// The reference: a DenseMlp holding fp32 master parameters (and the 16-bit compute copy
// when bf16/fp16 is on), gradients accumulated over micro-batches in fp32 (fp16: each
// micro-batch's gradient rounded to fp16 first, as the engine does), DeepSpeed's loss
// scaling and clipping rules, and the double-precision AdamStepReference. The global
// batch of `world_size` ranks is computed on one rank.
struct ReferenceRun {
  TrainLog log;
  std::vector<std::vector<std::vector<float>>> params;  // [module][tensor] final fp32
};
Result<ReferenceRun> TrainReference(const Config& config, const TrainSpec& spec, int world_size);

}  // namespace strata::zero
