// LRU: evict the copy acquired or released longest ago; no prefetch of its own.
#include "tiering/tier_policy.h"

namespace strata::tiering {
namespace {

class LruPolicy final : public TierPolicyImpl {
 public:
  TierPolicy kind() const override { return TierPolicy::kLru; }
  void BeginStep() override {}
  bool OnAcquire(BlockId, Tier) override { return false; }
  uint64_t EvictionPriority(BlockId, uint64_t last_use, bool) const override {
    return UINT64_MAX - last_use;
  }
  // A prefetched copy counts as used now: anything older may make room for it.
  uint64_t PrefetchPriority(BlockId, uint64_t now) const override { return UINT64_MAX - now; }
  std::vector<PrefetchRequest> Lookahead(size_t) const override { return {}; }
  uint64_t trace_length() const override { return 0; }
  bool following() const override { return false; }
};

}  // namespace

std::unique_ptr<TierPolicyImpl> MakeLruPolicy() { return std::make_unique<LruPolicy>(); }

}  // namespace strata::tiering
