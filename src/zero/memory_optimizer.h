// The optimizer state of chunks kept in memory, device HBM or pinned host memory: each
// chunk's master | m | v in one buffer, stepped in place. A speculative step (during
// the backward, before the step is known to be kept) copies the state into a spare
// buffer and steps that; Commit makes the spare the chunk's state and frees the old one,
// Discard frees the spare.
//
// The device's Adam is the device ops' (on the optimizer lane), writing device memory;
// the host's is the CPU Adam on oneTBB threads. The buffers are the engine's: it allocates them and hands
// them over before the first step (SetState, AddSpare); this class only swaps them.
//
// Threads: as OptimizerBackend; the spares are shared by every chunk (a BufferPool).
#pragma once

#include <vector>

#include "zero/buffer_pool.h"
#include "zero/device_ops.h"
#include "zero/optimizer_backend.h"
#include "zero/save_gate.h"

namespace strata::zero {

class MemoryOptimizer final : public OptimizerBackend {
 public:
  // ops: the arithmetic on the tier's memory (the device's, or HostMemoryOps()).
  // gate: checkpoint saves that may still read a state buffer this overwrites.
  MemoryOptimizer(ZeroTier tier, DeviceOps* ops, int64_t opt_elems, int num_chunks, SaveGate* gate);

  // --- set-up, before the first step ---
  void SetState(int chunk, float* state) { state_[chunk] = state; }
  void AddSpare(float* spare) { spares_.Add(spare); }

  // The chunk's committed state (nullptr for a chunk of another backend).
  float* state(int chunk) const { return state_[chunk]; }
  // Whether a speculative step would find a spare now (the stepping thread's view).
  bool HasSpare() { return spares_.FreeCount() > 0; }

  ZeroTier tier() const override { return tier_; }
  Result<bool> Step(const OptimizerStep& s, const float* grad, void* out) override;
  void Commit(int chunk, int64_t epoch) override;
  void Discard(int chunk) override;
  Status ReadMaster(int chunk, float* master) override;

 private:
  const ZeroTier tier_;
  DeviceOps* const ops_;
  const int64_t opt_elems_;
  SaveGate* const gate_;
  std::vector<float*> state_;    // by chunk
  std::vector<float*> pending_;  // by chunk: a speculative result, in a spare
  BufferPool spares_;            // free spare buffers, one chunk's state each
};

}  // namespace strata::zero
