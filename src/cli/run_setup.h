// What every `strata train` job does around its training loop, whatever the model: the
// swap files of the run (named to the interrupt guard, stale ones of earlier runs swept),
// the peers' pids for naming a rank that vanished, the start-up summary of what was
// configured and where each setting came from, and one progress line per step.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "cli/interrupt.h"
#include "strata/comm.h"
#include "strata/config.h"
#include "strata/engine.h"

namespace strata::cli {

// Config key path -> "--flag", "the config file" or a default's description.
using Origins = std::map<std::string, std::string>;

// The swap directories of every store the engine may open, without repeats.
std::vector<std::string> SwapDirs(const Config& config);

// Tells the guard this rank's swap directories and its peers' pids, and removes swap
// files that runs with more ranks left behind (rank 0 says what it removed and what
// belongs to a live process). Collective over `world`; throws CliError.
void StartRun(Communicator& world, const Config& config, InterruptGuard& guard);

// The summary's lines after the model's own (rank 0 prints): stage, world, device and
// dtype; where each plane lives; the batch in `unit`s ("samples" or "sequences of N
// tokens"); the optimizer and clipping; the memory needed per tier beside its budget.
void PrintConfigSummary(const Config& config, const Origins& origin, const EngineLayoutInfo& layout,
                        int world_size, const std::string& batch_unit);

// One line per step as it ends: step, loss, learning rate, rate in `unit`s per second,
// time per step and ETA (the first step, which records the trace and touches memory,
// is left out of the ETA), the loss scale under fp16, a skipped step.
class StepProgress {
 public:
  StepProgress(int steps, double items_per_step, std::string unit, bool fp16)
      : steps_(steps), items_(items_per_step), unit_(std::move(unit)), fp16_(fp16) {}
  // `step` counts from 0.
  std::string Line(int step, double loss, double lr, double seconds, const StepResult& r);

 private:
  int steps_;
  double items_;
  std::string unit_;
  bool fp16_;
  double sum_s_ = 0;
  int timed_ = 0, seen_ = 0;
};

// The measured memory beside the plan's, for the end of a run: "memory: peak RSS 1.42
// GiB; the plan: device 200 MiB + pinned host 976 MiB (the sim device's memory is in the
// RSS; the rest is the process: activations, batches, the binary)".
// `base_rss`: the process's resident set before the engine was made; activation bytes a
// sample keeps (tools/plan_model.h). Beside the peak RSS: the plan's device, pinned host
// and process figures (tools/process_memory.h); `data_bytes`: the token files the job
// maps (ProcessMemory::data).
std::string MemoryAccountLine(const EngineLayoutInfo& layout, const Config& config, uint64_t base_rss,
                              double activation_bytes_per_sample, uint64_t data_bytes = 0);

// The unwinding after a failed training call: an interrupt's message and exit status
// (returned), else the failure thrown as CliError, prefixed by the peers that vanished.
int EndFailedRun(const Status& status, InterruptGuard& guard);

}  // namespace strata::cli
