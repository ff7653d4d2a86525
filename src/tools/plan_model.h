// The model `strata plan` plans: its declaration for the engine's plan, its compute per
// sample, and how to run a few steps of it cut to a few layers (the calibration of
// engine_calibration.h). The reference MLP and the GPT are built in; a safetensors
// header is another (safetensors_plan_model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/gpt.h"
#include "strata/mlp.h"
#include "strata/model.h"
#include "strata/token_data.h"
#include "tools/step_runner.h"

namespace strata::tools {

// Timings of steps of the model the calibration ran (the whole or its cut): each
// figure's median over the steps after the first (which records the call order and
// touches memory), what the optimizer stepped (every chunk's elements at stage 0,
// padding included), the engine's layout, and that model's size and flops a step.
struct CutRun {
  double step_s = 0, compute_s = 0, optimizer_s = 0;
  double optimizer_elems = 0;
  EngineLayoutInfo layout;
  int64_t params = 0;
  double flops_per_step = 0;
};

struct PlanModel {
  std::string description;  // "MLP of 101M parameters (8 hidden layers of 3776)"
  ModelDecl decl;
  int64_t params = 0;
  double flops_per_sample = 0;  // forward and backward, per sample (a sequence for the GPT)
  // fp32 activations and batch buffers the model keeps per sample through a micro-batch
  // (an upper bound: the backward's transients are counted as if all live at once).
  double activation_bytes_per_sample = 0;
  // false: the model has no forward code to count them from (a safetensors header); the
  // plan reports them as not counted, not as zero.
  bool activations_counted = true;
  // The token files a training run maps and reads whole (the GPT's training and
  // validation files; ProcessMemory::data); 0 for a model without them.
  uint64_t data_bytes = 0;
  // Non-empty: how the compute time is estimated where it is not timed on the model
  // itself ("estimated, not measured: 6 flops per parameter per token, ...").
  std::string compute_basis;
  // Runs 1 + `steps` steps under `config` over `world` (one rank) of the whole model
  // where it has at most 128M parameters and 32 GFLOP a step at `micro_batch`, else of
  // the model cut to its first layers.
  std::function<Result<CutRun>(Communicator& world, const Config& config, int64_t micro_batch, int steps)>
      run_cut;
  // The whole model's steps (`strata bench step`); empty for a model without forward
  // code (a safetensors header).
  StepRunner run_steps;
};

// fp32 activation bytes a sample keeps through a micro-batch (PlanModel's
// activation_bytes_per_sample): the reference MLP, and the GPT on sequences of `seq`.
double MlpActivationBytes(const model::MlpSpec& spec);
double GptActivationBytes(const model::GptSpec& spec, int64_t seq, bool recompute);

// The reference MLP; its cut keeps as many hidden layers as fit in about 48M parameters
// (one to four). InvalidArgument for an invalid spec.
Result<PlanModel> MlpPlanModel(const model::MlpSpec& spec);

// The GPT on sequences of `seq` tokens, calibrated on the token file `train_path`
// (opened here, held by run_cut); its cut keeps as many blocks as fit in about 48M
// parameters (one to four). InvalidArgument for an invalid spec or seq; the file's errors.
Result<PlanModel> GptPlanModel(const model::GptSpec& spec, int64_t seq, const std::string& train_path,
                               bool recompute);

}  // namespace strata::tools
