// Partial residency of the NVMe optimizer: which chunks keep their master, m and v in
// pinned host memory instead of on NVMe, and how many staging sets the NVMe pipeline of
// the others keeps (internal).
//
// Why these chunks: the backward finishes chunks in the reverse of their forward order,
// and the NVMe steps of the chunks it finishes early overlap the rest of the backward;
// the chunks it finishes last are stepped after it, on the critical path. Kept in
// memory, their step is one pass over RAM instead of a read and a write of the disk.
// They are also the chunks the next forward needs first. So the chunks whose last use in
// the micro-batch comes latest stay resident. A pure function: tested on its own, and
// `strata plan` can call it ahead of a run.
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

struct ResidencyInputs {
  const Layout* layout = nullptr;
  const Trace* trace = nullptr;  // the call order residency is chosen along
  int pieces = 1;                // per chunk
  uint64_t set_bytes = 0;        // one staging set: a piece's master | m | v
  uint64_t chunk_bytes = 0;      // pinned bytes one resident chunk adds
  // Pinned bytes the budget leaves beyond the fixed needs (which hold one staging set,
  // and the state of the chunks `fraction` asks for, when it is set).
  uint64_t room = 0;
  // strata.optimizer_resident: the fraction of chunks to keep resident (rounded to the
  // nearest chunk), or < 0 for as many as `room` holds beside a full pipeline.
  double fraction = -1;
};

struct ResidencyPlan {
  std::vector<uint8_t> resident;  // by chunk
  int count = 0;
  int staging_sets = 1;  // the fixed one included
  // Pinned bytes beyond the fixed needs: the auto mode's resident chunks and the staging
  // sets beyond the first.
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

}  // namespace strata::zero
