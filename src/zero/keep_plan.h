// Which stage-3 chunks stay gathered on the device from their forward use to their
// backward use (internal).
//
// Without this, a chunk is released once the prefetch window has passed it and is
// gathered again (read from NVMe or the host, copied, all-gathered) when backward reaches
// it. DeepSpeed keeps a parameter when its next use is within stage3_max_reuse_distance
// parameters, and keeps parameters under stage3_param_persistence_threshold gathered
// always; strata does the same per chunk, with the device memory the budget has left
// after the prefetch window.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/layout.h"

namespace strata::zero {

struct KeepPlan {
  std::vector<uint8_t> kept;  // by chunk: stays gathered until its last backward use
  int persistent = 0;         // kept because every tensor in it is under the threshold
  int reused = 0;             // kept for its reuse distance, within the spare buffers
  int total() const { return persistent + reused; }
};

// Parameters the trace touches between a chunk's last forward use and its first backward
// use: the modules after its last one, once forward and once backward.
std::vector<int64_t> ReuseDistances(const Layout& l);

// Chunks whose tensors all have fewer than `persistence_threshold` elements are kept
// whatever the budget (threshold 0: none). Then, in increasing reuse distance (ties: the
// higher chunk, which backward reaches first), chunks within `max_reuse_distance` while
// `spare_buffers` last.
KeepPlan PlanKeep(const Layout& l, uint64_t max_reuse_distance, uint64_t persistence_threshold,
                  int spare_buffers);

// The most chunks gathered at once over a micro-batch's trace (forward 0..L, backward
// L..0) when each module gathers its chunks and those of the next `window` modules, and
// a chunk is released after a module unless the window or `kept` (until the backward of
// the first module that uses it) holds it: the gather buffers the engine needs
// (engine_gather.cc follows the same rules).
int PeakGathered(const Layout& l, const std::vector<uint8_t>& kept, int window);

}  // namespace strata::zero
