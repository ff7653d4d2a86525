// `strata train --model gpt`'s run: the GPT trained by the engine on token files, with a
// summary of what was configured at start, one progress line per step as it ends
// (tokens/s), the validation loss every few steps, a JSON-lines log of both, text
// sampled from the model at the end, and the orderly stop on SIGINT/SIGTERM of
// interrupt.h.
#pragma once

#include <string>

#include "cli/interrupt.h"
#include "cli/run_checkpoints.h"
#include "cli/run_setup.h"
#include "strata/comm.h"
#include "strata/config.h"
#include "strata/gpt.h"

namespace strata::cli {

// What the loop does besides training: validation, the sample, the log, checkpoints. The
// defaults are `strata train`'s, sized for a few minutes on two cores.
struct GptRunSettings : SaveSettings {
  int eval_every = 50;       // 0: only before the first and after the last step
  int64_t eval_batches = 4;  // micro-batches per rank per evaluation
  int64_t sample = 200;      // tokens sampled at the end; 0: none
  double temperature = 0.8;
  std::string prompt;     // bytes; the sample starts after it (empty: a newline)
  std::string log_path;   // JSON lines; empty: none
  std::string init_from;  // a safetensors file of initial weights; empty: the model's init
};

struct GptTrainJob {
  Config config;  // batch sizes resolved (ResolveBatchSizes)
  model::GptSpec model;
  int64_t seq = 0;
  std::string train_path, val_path;  // token files (strata data prepare)
  uint64_t data_seed = 0;
  int steps = 0;
  GptRunSettings run;
  bool json = false;  // the report as JSON at the end instead of text lines
  Origins origin;
};

// Runs the job, collective over `world`. Returns the process's exit status: 0, or
// 128 + the signal after an interrupt (the guard's message printed). Other failures
// (a bad token file, a log that cannot be written, the engine's errors) are thrown as
// CliError, after the steps that ended were printed.
int RunGptTrainJob(Communicator& world, const GptTrainJob& job, InterruptGuard& guard);

}  // namespace strata::cli
