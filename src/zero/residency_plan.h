// Partial residency of the NVMe optimizer: which chunks keep their master, m and v in
// pinned host memory instead of on NVMe, and how many staging sets the NVMe pipeline of
// the others keeps (internal).
//
// Why these chunks: the backward finishes chunks in the reverse of their forward order,
// and the NVMe steps of the chunks it finishes early overlap the rest of the backward;
// the chunks it finishes last are stepped after it, on the critical path. Kept in
// memory, their step is one pass over RAM instead of a read and a write of the disk.
// They are also the chunks the next forward needs first. So the chunks whose last use in
// the micro-batch comes latest stay resident. Gradient shards that would go to NVMe and
// back each step are kept along the same order: the shards reduced last are the ones
// whose write and read would sit at the end of the backward. A pure function: tested on
// its own, and `strata plan` can call it ahead of a run.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/layout.h"
#include "zero/trace.h"

namespace strata::zero {

// The pipeline depth of the NVMe optimizer when the host budget allows: staging sets
// beyond what four whole chunks' pieces hold buy nothing on one disk (the reads run
// ahead of the step by more than the disk delivers in the meantime).
inline constexpr int kStagingChunkSets = 4;

// The fewest staging sets at which the pipeline's reads do not wait for its writes: one
// set steps a piece, one writes the piece before it, one reads the next. With two, the
// next read goes into the set still being written, so each piece costs a read, its
// step and a write one after another (measured on the 100M MLP with accumulation: the
// Step() call 0.88-0.99 s with two sets, 0.60-0.79 s with three or more).
inline constexpr int kMinStagingSets = 3;

struct ResidencyInputs {
  const Layout* layout = nullptr;
  const Trace* trace = nullptr;  // the call order residency is chosen along
  int pieces = 1;                // per chunk
  uint64_t set_bytes = 0;        // one staging set: a piece's master | m | v
  uint64_t chunk_bytes = 0;      // pinned bytes one resident chunk adds (its gradient shard too)
  // Gradients on the NVMe path: the pinned bytes of one chunk's gradient shard (part of
  // chunk_bytes); 0 when they wait elsewhere.
  uint64_t grad_bytes = 0;
  // Pinned bytes the budget leaves beyond the fixed needs (which hold one staging set,
  // and the state of the chunks `fraction` asks for, when it is set).
  uint64_t room = 0;
  // strata.optimizer_resident: the fraction of chunks to keep resident (rounded to the
  // nearest chunk), or < 0 for as many as `room` holds beside a full pipeline.
  double fraction = -1;
  // strata.gradient_resident: the fraction of chunks whose gradient shard stays pinned
  // (in the fixed needs, as `fraction`'s state), or < 0 for auto: `keep_grads` then says
  // whether the shards go to disk and back each step, so that what the room leaves
  // keeps more of them.
  double grad_fraction = -1;
  bool keep_grads = false;
  // Auto keeps gradient shards before state: with accumulation over `a` micro-batches a
  // kept shard saves 8a bytes of disk traffic per parameter for 4 pinned bytes, a
  // resident chunk 24 + 8a for 16, so from a = 2 on a pinned byte saves more as a
  // gradient. Otherwise the resident chunks come first. Either way kept shards come
  // before staging sets beyond kMinStagingSets: they cut the disk's bytes, where a
  // deeper pipeline only hides them (as the plan's rule for all of them: pinned if they
  // fit). Below that depth the pipeline serialises, which costs more than a shard's
  // traffic.
  bool grads_first = false;
};

struct ResidencyPlan {
  std::vector<uint8_t> resident;  // by chunk
  int count = 0;
  // By chunk: state on NVMe, gradient shard in pinned memory (grad_bytes > 0); the next
  // chunks along the same order as the resident ones.
  std::vector<uint8_t> grad_resident;
  int grad_count = 0;
  int staging_sets = 1;  // the fixed one included
  // Pinned bytes beyond the fixed needs: the auto mode's resident chunks, the staging
  // sets beyond the first and the kept gradient shards.
  uint64_t extra_bytes = 0;
};

// The chunks in the order they stay resident: latest last use along the trace first
// (ties: the lower chunk, which the forward needs first).
std::vector<int> ResidencyOrder(const Layout& layout, const Trace& trace);

// The chunks in the order their parameter shards stay in host memory (stage 3,
// offload_param nvme): earliest first use along the trace first (ties: the lower chunk).
// The forward's first gathers wait for the disk with nothing ahead of them to hide the
// read behind; the later ones are read while earlier modules compute, and the chunks
// the forward reaches last are the ones kept gathered for the backward (keep_plan.h),
// read once a step rather than twice.
std::vector<int> ParamResidencyOrder(const Layout& layout, const Trace& trace);

// Resident chunks for an explicit fraction of `num_chunks` (rounded to nearest).
int ResidentCount(int num_chunks, double fraction);

ResidencyPlan PlanResidency(const ResidencyInputs& in);

// The staging sets beyond the fixed one that pinned gradient shards leave to the
// pipeline of `chunks_on_disk` chunks of `pieces` pieces each: up to kMinStagingSets in
// all, fewer where the disk holds fewer pieces.
int PipelineFloorSets(int chunks_on_disk, int pieces);

}  // namespace strata::zero
