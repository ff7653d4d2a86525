// What the process itself holds beside the engine's tiers: its resident set now and at
// its peak, and the plan's estimate of what a training run will add (#26's honest memory
// account). Linux: /proc/self/statm and getrusage. Any thread.
#pragma once

#include <cstdint>
#include <string>

#include "strata/config.h"
#include "strata/engine.h"

namespace strata::tools {

// The process's peak resident set since it started or since ResetPeakRss
// (/proc/self/status VmHWM; getrusage where that cannot be read); 0 where neither can.
uint64_t PeakRssBytes();

// Lowers the peak to the resident set now (/proc/self/clear_refs), so that a run
// measures its own peak after an earlier run in the process freed its memory. false
// where the kernel does not allow it; the peak then stays the process's.
bool ResetPeakRss();

// The process's resident set now (/proc/self/statm); 0 where it cannot be read.
uint64_t CurrentRssBytes();

// The process's executable mappings now (/proc/self/smaps): this executable's, found by
// device and inode (so a path with spaces, or a binary replaced while it runs, still
// counts), and every other's (libraries, a JIT's anonymous code). Zeros where smaps
// cannot be read.
struct CodeResidency {
  uint64_t own_bytes = 0, own_resident = 0, other_resident = 0;
  // This executable's code not resident now: a run may still execute any of it.
  uint64_t own_untouched() const { return own_bytes - own_resident; }
};
CodeResidency ReadCodeResidency();

// ProcessMemory::base, measured now, before the engine and the model exist: the resident
// set after model::WarmMatrixProducts (so the BLAS's generated kernels and code are in
// it, which a run's first products would add: about 6 MB of oneDNN's here), plus
// CodeResidency::own_untouched. Call it on the thread that will train, once MPI has started.
uint64_t MeasureProcessBase();

// The process memory a training run needs beside the engine's device and pinned host
// needs, as `strata plan` counts it: the binary, libraries and MPI as loaded, with the
// code a run will execute (`base`, MeasureProcessBase), the
// engine's creation scratch (a whole fp32 chunk, its compute copy, and one fp32 master |
// m | v of the elements this rank steps, as InitParams fills them; it also bounds the
// shard of compute values that streamed shards keep for whole-shard writes, which comes
// later and is smaller), and the model's activations. On the sim device all of it is
// host memory; on a GPU the activations are device memory beside the engine's budget.
struct ProcessMemory {
  uint64_t base = 0;
  uint64_t creation = 0;
  uint64_t activations = 0;
  // The token files a training job maps (strata train's GPT): opening one checks every
  // id, which leaves the whole file resident.
  uint64_t data = 0;
  // false: the model's activations are unknown (PlanModel::activations_counted), so
  // `activations` is 0 and the total leaves them out; reports say so.
  bool activations_counted = true;
  // On a GPU the activations are device memory, beside the engine's device budget
  // (DeviceOptions::model_bytes), and not in the process's total.
  bool activations_on_device = false;
  uint64_t total() const { return base + creation + (activations_on_device ? 0 : activations) + data; }
};
// `layout`: the engine's plan under `config`.
ProcessMemory EstimateProcessMemory(uint64_t base, const EngineLayoutInfo& layout, const Config& config,
                                    double activation_bytes_per_sample, int64_t micro_batch);

// "the plan: device D + pinned host H + process P (binary, libraries and MPI B, creation
// scratch C, activations at most A[, data files F])", as the training jobs and bench step
// print it.
std::string PlanMemoryText(const EngineLayoutInfo& layout, const ProcessMemory& process);

}  // namespace strata::tools
