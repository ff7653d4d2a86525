// How stage 3 spends the device memory left after the fixed needs on gather buffers
// (internal): the prefetch window's depth, and the chunks kept gathered between their
// uses (keep_plan.h). A pure function of the layout, the trace and DeepSpeed's stage-3
// keys, so `strata plan` and tests get the engine's answer without allocating anything.
#pragma once

#include <cstdint>

#include "strata/config.h"
#include "zero/layout.h"
#include "zero/param_gatherer.h"
#include "zero/trace.h"

namespace strata::zero {

// Gather buffers for at most this many modules ahead of the running one; the depth used
// is measured (prefetch_depth.h) within what the budget and DeepSpeed's keys leave.
inline constexpr uint64_t kMaxPrefetchModules = 8;

struct GatherInputs {
  const Layout* layout = nullptr;
  const Trace* trace = nullptr;
  const ZeroConfig* zero = nullptr;  // the stage3_* keys
  int micro_batches = 1;             // gradient_accumulation_steps
  uint64_t chunk_bytes = 0;          // one gather buffer: a chunk's compute values
  int max_module_chunks = 1;         // the most chunks one module touches
  int fixed_buffers = 0;             // the buffers every configuration needs (a fixed need)
  uint64_t room = 0;                 // device bytes left for more
  // Shards come from NVMe through this many pinned staging buffers (0: from memory): a
  // deeper window would hold device memory only to queue behind them.
  int staging_limit = 0;
};

struct GatherPlanResult {
  GatherPlan plan;
  uint64_t extra_bytes = 0;  // device bytes beyond the fixed buffers
};

GatherPlanResult PlanGather(const GatherInputs& in);

}  // namespace strata::zero
