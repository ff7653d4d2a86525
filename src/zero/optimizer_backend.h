// Where a chunk's optimizer state lives and how one Adam step on it runs: the seam
// between the engine's step (engine_update.cc: which chunks step when, speculation,
// commit or undo) and the memory and I/O the state needs. Three implementations:
// MemoryOptimizer on the device and in pinned host memory (memory_optimizer.h), and
// NvmeOptimizer's pipeline (nvme_optimizer.h). An engine may hold several: a chunk's
// tier picks its backend (offload_optimizer.ratio keeps some on the device, partial
// residency some in host memory).
//
// Threads: one at a time steps (the optimizer worker during the backward, the training
// thread in Step()); Commit, Discard and ReadMaster on the training thread between steps.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <cstdint>
#include <functional>

#include "strata/adam.h"
#include "strata/dtype.h"
#include "strata/status.h"
#include "zero/budget_check.h"

namespace strata::zero {

struct OptimizerStep {
  int chunk = 0;
  AdamParams adam;  // grad_scale set
  DType compute = DType::kF32;
  // The result stays pending, the state as it was, until Commit or Discard.
  bool speculative = false;
  int next_chunk = -1;               // the chunk stepped next (-1: unknown), for backends that read ahead
  bool overlap = true;               // off: read nothing ahead beyond this chunk
  int64_t epoch = 0;                 // the Step() call this step belongs to
  tbb::task_arena* arena = nullptr;  // where a CPU Adam runs (nullptr: the caller's)
  // The NVMe backend with a null `grad`: piece p's fp32 gradient, asked for in ascending
  // order on the stepping thread; valid until the next call.
  std::function<Result<const float*>(int piece)> grad_piece;
  // The NVMe backend with a null `out` and these set: where live piece p's compute values
  // go, and what becomes of them once written (ok false: the step failed, and the
  // buffer only goes back).
  std::function<Result<void*>(int piece)> out_piece;
  std::function<Status(int piece, void* buf, bool ok)> piece_done;
};

class OptimizerBackend {
 public:
  virtual ~OptimizerBackend() = default;
  virtual ZeroTier tier() const = 0;
  // One Adam step of the chunk's state with its fp32 gradient shard `grad` (memory this
  // backend's Adam reads: device memory on the device, host memory otherwise), writing
  // the updated compute values to `out`. False when a speculative step found no room to
  // keep the old state: nothing was done, and the chunk steps in Step() instead.
  virtual Result<bool> Step(const OptimizerStep& s, const float* grad, void* out) = 0;
  // The chunk's result becomes its state: a speculative one pending, or the step just
  // taken (NVMe: once its writes are on disk, SettleCommit).
  virtual void Commit(int chunk, int64_t epoch) = 0;
  // Forgets a pending speculative result; the state stays the committed one.
  virtual void Discard(int chunk) = 0;
  // The committed master values (opt_elems floats) into host memory.
  virtual Status ReadMaster(int chunk, float* master) = 0;
};

}  // namespace strata::zero
