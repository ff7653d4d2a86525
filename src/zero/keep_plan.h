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
#include "zero/trace.h"

namespace strata::zero {

struct KeepPlan {
  std::vector<uint8_t> kept;  // by chunk: stays gathered until its last backward use
  int persistent = 0;         // kept because every tensor in it is under the threshold
  int reused = 0;             // kept for its reuse distance, within the spare buffers
  int total() const { return persistent + reused; }
};

// Parameters the trace touches between a chunk's last use before the backward begins and
// its next use (in the plain order: the modules after its last one, once forward and once
// backward); INT64_MAX for a chunk with no such pair of uses.
std::vector<int64_t> ReuseDistances(const Layout& l, const Trace& trace);

// Chunks whose tensors all have fewer than `persistence_threshold` elements are kept
// whatever the budget (threshold 0: none). Then, in increasing reuse distance (ties: the
// higher chunk, which backward reaches first), chunks within `max_reuse_distance` while
// `spare_buffers` last.
KeepPlan PlanKeep(const Layout& l, const Trace& trace, uint64_t max_reuse_distance,
                  uint64_t persistence_threshold, int spare_buffers);

// Parameters the trace touches between a chunk's last use in one micro-batch and its
// first use in the next (gradient accumulation); in the plain order the modules before
// its first one, once backward and once forward.
std::vector<int64_t> CarryDistances(const Layout& l, const Trace& trace);

// The `count` chunks of least carry distance within `max_reuse_distance` (ties: the
// lower chunk, which forward reaches first).
std::vector<uint8_t> PlanCarry(const Layout& l, const Trace& trace, uint64_t max_reuse_distance, int count);

// Whether gathered chunk `c`, which no module uses now, stays gathered after the use at
// trace position `pos` ran, the prefetch window aside: a kept chunk until its last use; a
// carried chunk from then on (unless this is the last micro-batch before the step), and
// before the backward begins until its last use there.
bool StaysGathered(const ChunkUses& uses, const std::vector<uint8_t>& kept,
                   const std::vector<uint8_t>& carried, int c, int pos, bool last_micro_batch);

// The most chunks gathered at once over `micro_batches` micro-batches of the trace when
// each module gathers its chunks and those of the next `window` modules (within its
// micro-batch) and releases what neither the window nor StaysGathered holds: the gather
// buffers the engine needs (param_gatherer.h follows the same rules). A run's chunks are
// not counted: they have a buffer of their own. Three micro-batches stand for any more
// (the middle ones repeat).
int PeakGathered(const Layout& l, const Trace& trace, const std::vector<uint8_t>& kept, int window,
                 const std::vector<uint8_t>& carried = {}, int micro_batches = 1);

}  // namespace strata::zero
