// What `strata plan --measure` learns from the engine itself: a few real steps of the
// model, whole up to 128M parameters and 32 GFLOP a step, else cut to its first layers
// (PlanModel::run_cut: up to four, about 48M parameters at most; the model's width,
// micro-batch and dtype),
// serial and overlapped, with the optimizer on the device (stage 0), on the host (stage 1,
// also with every chunk on the device by offload_optimizer.ratio, and stage 3 with the
// parameters on the device) and on NVMe (stage 3, every chunk's
// state resident in pinned memory, so the disk is left to the probe; in fp32 also with
// the parameters on NVMe, whose shards are then the master's).
//
// The probes of step_model.h time each lane alone at its peak; a real step adds what no
// probe sees (the gradient statistics, the loss scaler's checks, the hooks, the data) and,
// on the sim device, its lanes share two cores. The calibration measures those per
// element the optimizer steps, so that the plan predicts the step the engine will take,
// not its bound.
#pragma once

#include "strata/config.h"
#include "strata/status.h"
#include "tools/plan_model.h"
#include "tools/step_model.h"

namespace strata::tools {

// Fills rates->compute_flops_per_s, device_optimizer, device_split, host_optimizer,
// host_optimizer_stage3, nvme_optimizer and nvme_optimizer_master; reads
// rates->copy_bytes_per_s (the probe's) to take the host path's copies out of its rest.
// Runs 1 + `steps` steps three times per variant (serial, overlapped, serial) in this
// process (a world of one rank, the base config's device and budgets; a variant those
// budgets cannot hold runs under the device's capacity and the derived host budget
// instead). InvalidArgument for micro_batch < 1; the engine's errors, with what was
// being calibrated.
Status CalibrateEngine(const Config& base, const PlanModel& model, int64_t micro_batch, LaneRates* rates,
                       int steps = 4);

}  // namespace strata::tools
