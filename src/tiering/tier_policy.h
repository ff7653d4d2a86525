// Eviction and prefetch policies of the TierManager (internal).
//
// A policy ranks eviction candidates (higher priority = evicted first) and, for the trace
// policy, says what comes next. Calls are made with the manager's lock held; policies
// keep no lock of their own.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "strata/tier.h"

namespace strata::tiering {

class TierPolicyImpl {
 public:
  virtual ~TierPolicyImpl() = default;
  virtual TierPolicy kind() const = 0;

  // A step boundary.
  virtual void BeginStep() = 0;
  // An Acquire(block, tier) call, in program order. Returns true when it diverged from
  // the recorded trace (the policy has then started re-recording).
  virtual bool OnAcquire(BlockId block, Tier tier) = 0;

  // Eviction priority of a candidate copy: the larger, the sooner it goes.
  // `last_use` is the manager's logical clock at the copy's last acquire or release;
  // `duplicate`: a valid copy of the block also sits on a higher tier, so this one is
  // needed only if that one goes first.
  virtual uint64_t EvictionPriority(BlockId block, uint64_t last_use, bool duplicate) const = 0;
  // Priority of a block about to be prefetched: a prefetch may only evict copies whose
  // priority is strictly larger (they are needed later than what is being fetched).
  virtual uint64_t PrefetchPriority(BlockId block, uint64_t now) const = 0;

  // The (block, tier) pairs expected after the current position, nearest first, at most
  // `max` of them (trace policy while following a trace; empty otherwise).
  virtual std::vector<PrefetchRequest> Lookahead(size_t max) const = 0;

  virtual uint64_t trace_length() const = 0;
  virtual bool following() const = 0;
};

std::unique_ptr<TierPolicyImpl> MakeLruPolicy();
std::unique_ptr<TierPolicyImpl> MakeTracePolicy();

}  // namespace strata::tiering
