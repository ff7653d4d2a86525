#include "zero/memory_optimizer.h"

#include <string>

namespace strata::zero {

MemoryOptimizer::MemoryOptimizer(ZeroTier tier, DeviceOps* ops, int64_t opt_elems, int num_chunks,
                                 SaveGate* gate)
    : tier_(tier), ops_(ops), opt_elems_(opt_elems), gate_(gate), state_(num_chunks), pending_(num_chunks) {}

Result<bool> MemoryOptimizer::Step(const OptimizerStep& s, const float* grad, void* out) {
  float* st = state_[s.chunk];
  if (s.speculative) {
    st = static_cast<float*>(spares_.TryTake());
    if (st == nullptr) return false;  // no room to keep the old state
  }
  // A checkpoint save in flight may not have read this buffer yet (save_gate.h).
  gate_->WaitFree(SaveGate::MemoryKey(st));
  Status done;
  if (s.speculative) done = ops_->Copy(OpsLane::kOptimizer, st, state_[s.chunk], 3 * opt_elems_ * 4);
  if (done.ok()) {
    done = tier_ == ZeroTier::kDevice
               ? ops_->Adam(OpsLane::kOptimizer, s.adam, st, opt_elems_, grad, s.compute, out)
               : AdamOnHost(s.adam, st, opt_elems_, grad, s.compute, out, s.arena);
  }
  if (s.speculative) {
    if (done.ok()) {
      pending_[s.chunk] = st;
    } else {
      spares_.Give(st);
    }
  }
  if (!done.ok()) return done;
  return true;
}

void MemoryOptimizer::Commit(int chunk, int64_t /*epoch*/) {
  if (pending_[chunk] == nullptr) return;  // stepped in place
  spares_.Give(state_[chunk]);
  state_[chunk] = pending_[chunk];
  pending_[chunk] = nullptr;
}

void MemoryOptimizer::Discard(int chunk) {
  if (pending_[chunk] == nullptr) return;
  spares_.Give(pending_[chunk]);
  pending_[chunk] = nullptr;
}

Status MemoryOptimizer::ReadMaster(int chunk, float* master) {
  return ops_->ReadToHost(OpsLane::kTraining, master, state_[chunk], opt_elems_ * 4);
}

}  // namespace strata::zero
