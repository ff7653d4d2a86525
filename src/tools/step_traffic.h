// The work one training step gives each lane of the step-time model (step_model.h), per
// rank, predicted from an engine's plan (Engine::Plan) instead of measured: what `strata
// plan` times a configuration by before anything runs.
//
// The bytes follow the engine's own accounting (StepResult's bytes_*), path by path:
// reductions and gathers, the optimizer's gradients and parameters between the device
// and the host, the NVMe optimizer's state (resident chunks move none), gradients and
// parameter shards on NVMe. Tests compare them with a real step's counters.
#pragma once

#include "strata/config.h"
#include "strata/engine.h"
#include "tools/step_model.h"

namespace strata::tools {

// Bytes per compute value: 2 for bf16 or fp16, else 4.
int ComputeBytes(const Config& config);

// Bytes and optimizer parameters of one step (gradient_accumulation_steps micro-batches)
// on one of `world_size` ranks; compute_s is left 0 (PredictComputeSeconds).
LaneWork PredictTraffic(const Config& config, int world_size, const EngineLayoutInfo& plan);

// The model's forward and backward over one step: flops_per_sample (PlanModel's) for
// micro_batch samples per micro-batch, at flops_per_s.
double PredictComputeSeconds(double flops_per_sample, int64_t micro_batch, int accumulation,
                             double flops_per_s);

}  // namespace strata::tools
