// Trace-driven policy: record the first step's acquisitions, then follow them; prefetch
// what comes next and evict the copy whose next use is furthest away (Belady's MIN, with
// the recorded step as the oracle, repeated cyclically step after step).
#include <algorithm>

#include "strata/log.h"
#include "tiering/tier_policy.h"

namespace strata::tiering {
namespace {

// Priorities above every distance, for blocks the trace never uses: evicted first,
// oldest first among them.
constexpr uint64_t kUnknownBase = 1ull << 62;
constexpr uint64_t kDuplicateBase = 1ull << 63;

class TracePolicy final : public TierPolicyImpl {
 public:
  TierPolicy kind() const override { return TierPolicy::kTrace; }

  void BeginStep() override {
    if (!following_ && !recording_.empty()) Adopt();
    cursor_ = -1;
    current_step_.clear();
  }

  bool OnAcquire(BlockId block, Tier tier) override {
    PrefetchRequest r{block, tier};
    current_step_.push_back(r);
    if (!following_) {
      recording_.push_back(r);
      return false;
    }
    const int64_t length = static_cast<int64_t>(trace_.size());
    if (cursor_ + 1 < length && Same(trace_[static_cast<size_t>(cursor_ + 1)], r)) {
      cursor_++;
      return false;
    }
    // A step that runs past the end of the trace and starts over without BeginStep().
    if (cursor_ + 1 == length && Same(trace_[0], r)) {
      cursor_ = 0;
      current_step_.assign(1, r);
      return false;
    }
    // Divergence: re-record, starting with what this step did so far.
    following_ = false;
    recording_ = current_step_;
    if (!logged_) {
      logged_ = true;
      STRATA_LOG(kWarn, "tier") << "access order diverged from the recorded trace at position "
                                << cursor_ + 1 << " of " << length << " (chunk " << block.chunk
                                << ", plane " << block.plane << ", " << TierName(tier)
                                << "); re-recording the trace (logged once)";
    }
    return true;
  }

  uint64_t EvictionPriority(BlockId block, uint64_t last_use, bool duplicate) const override {
    if (!following_) return UINT64_MAX - last_use;
    uint64_t d = NextUse(block);
    // A duplicate of a copy held higher up is the cheapest to lose (dropped without a
    // write, and not needed while the upper copy stays): evict those first, and among
    // them the one needed last.
    if (duplicate) return kDuplicateBase + std::min<uint64_t>(d, kUnknownBase - 1);
    if (d != UINT64_MAX) return d;
    return kUnknownBase - std::min<uint64_t>(last_use, kUnknownBase / 2);
  }

  uint64_t PrefetchPriority(BlockId block, uint64_t now) const override {
    if (!following_) return UINT64_MAX - now;
    uint64_t d = NextUse(block);
    return d == UINT64_MAX ? kUnknownBase - std::min<uint64_t>(now, kUnknownBase / 2) : d;
  }

  std::vector<PrefetchRequest> Lookahead(size_t max) const override {
    std::vector<PrefetchRequest> out;
    if (!following_ || trace_.empty()) return out;
    const int64_t length = static_cast<int64_t>(trace_.size());
    for (int64_t i = 1; i < length + (cursor_ < 0 ? 1 : 0) && out.size() < max; ++i) {
      out.push_back(trace_[static_cast<size_t>(((cursor_ + i) % length + length) % length)]);
    }
    return out;
  }

  uint64_t trace_length() const override { return following_ ? trace_.size() : 0; }
  bool following() const override { return following_; }

 private:
  static bool Same(const PrefetchRequest& a, const PrefetchRequest& b) {
    return a.block == b.block && a.tier == b.tier;
  }

  void Adopt() {
    trace_ = std::move(recording_);
    recording_.clear();
    positions_.clear();
    for (size_t i = 0; i < trace_.size(); ++i) {
      positions_[trace_[i].block].push_back(static_cast<uint32_t>(i));
    }
    following_ = true;
    logged_ = false;
  }

  // Acquisitions from the current position to the block's next use (cyclic), or
  // UINT64_MAX when the trace never uses it.
  uint64_t NextUse(BlockId block) const {
    auto it = positions_.find(block);
    if (it == positions_.end()) return UINT64_MAX;
    const std::vector<uint32_t>& pos = it->second;
    const int64_t length = static_cast<int64_t>(trace_.size());
    auto next = std::upper_bound(pos.begin(), pos.end(), cursor_,
                                 [](int64_t c, uint32_t p) { return c < static_cast<int64_t>(p); });
    if (next != pos.end()) return static_cast<uint64_t>(static_cast<int64_t>(*next) - cursor_);
    return static_cast<uint64_t>(static_cast<int64_t>(pos.front()) + length - cursor_);
  }

  bool following_ = false;
  bool logged_ = false;
  int64_t cursor_ = -1;  // index of the last matched acquisition; -1 before the first
  std::vector<PrefetchRequest> trace_;
  std::vector<PrefetchRequest> recording_;
  std::vector<PrefetchRequest> current_step_;
  std::unordered_map<BlockId, std::vector<uint32_t>, BlockIdHash> positions_;
};

}  // namespace

std::unique_ptr<TierPolicyImpl> MakeTracePolicy() { return std::make_unique<TracePolicy>(); }

}  // namespace strata::tiering
