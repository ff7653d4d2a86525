// `strata train`'s run: the engine over the reference MLP, a summary of what was
// configured at start, one progress line per step as it ends, and an orderly stop on
// SIGINT/SIGTERM (interrupt.h).
#pragma once

#include <map>
#include <string>

#include "cli/interrupt.h"
#include "cli/run_checkpoints.h"
#include "cli/run_setup.h"
#include "strata/comm.h"
#include "strata/config.h"
#include "strata/model.h"

namespace strata::cli {

struct TrainJob {
  Config config;  // batch sizes resolved (ResolveBatchSizes)
  model::MlpSpec model;
  uint64_t data_seed = 0;
  int steps = 0;
  bool json = false;  // the report as JSON at the end instead of text lines
  SaveSettings save;  // checkpoints (run_checkpoints.h)
  // Where a setting came from, for the start-up summary: config key path ->
  // "--flag", "the config file" or a default's description. Absent: not mentioned.
  Origins origin;
};

// Runs the job, collective over `world`. Returns the process's exit status: 0, or
// 128 + the signal after an interrupt (the guard's message printed). Other failures
// are thrown as CliError, after the steps that ended were printed.
int RunTrainJob(Communicator& world, const TrainJob& job, InterruptGuard& guard);

}  // namespace strata::cli
