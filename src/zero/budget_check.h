// The engine's fixed memory needs per tier, checked against the tier budgets before
// anything is allocated or created on disk (internal).
//
// A refusal says what binds: the tier, its budget and where that came from, what the
// fixed need there is made of, the largest model or module that would fit, and only the
// changes that would help (no "offload" for a plane already on NVMe).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

// Where a plane's shards live.
enum class ZeroTier { kDevice, kHost, kNvme };

namespace zero {

// "device", "pinned host", "NVMe".
std::string_view TierName(ZeroTier t);

inline uint64_t Align4K(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

// How a part of a tier's need grows.
enum class NeedScale {
  kModel,  // with the model's size: a share of every chunk
  kChunk,  // with the chunk (the largest module, or strata.chunk_size), whatever the model's size
  kFixed,  // with neither
};

struct NeedPart {
  std::string what;  // "the optimizer state (fp32 master, m and v) and gradient shards"
  uint64_t bytes = 0;
  NeedScale scale = NeedScale::kFixed;
  // A setting that moves this part to a lower tier or shrinks it; "" when only the
  // budget, the chunk or the model can change it.
  std::string lever;
  // Divided over the ranks (each holds 1/ranks of it), so more ranks hold less each.
  bool sharded = false;
  // NVMe: the swap directories its store stripes over (equal shares).
  std::vector<std::string> paths;
};

struct TierNeed {
  ZeroTier tier = ZeroTier::kDevice;
  std::vector<NeedPart> parts;
  void Add(NeedPart part) {
    if (part.bytes > 0) parts.push_back(std::move(part));
  }
  uint64_t Total() const;
  uint64_t Total(NeedScale scale) const;
};

struct TierBudget {
  uint64_t bytes = 0;
  std::string source;  // "strata.device_budget", "free space on /tmp (file system of /tmp/x)"
  // How to get more; "{need}" stands for what the tier needs: "raise
  // strata.device_budget to at least {need}".
  std::string raise;
};

// What the wording and the largest fitting sizes depend on besides the needs.
struct PlanShape {
  int stage = 0;
  int world_size = 1;
  ZeroTier opt_tier = ZeroTier::kDevice;
  bool opt_on_device_too = false;  // offload_optimizer.ratio keeps part of it on the device
  ZeroTier param_tier = ZeroTier::kDevice;
  int64_t num_params = 0;      // real parameters
  int64_t chunk_elems = 0;     // as laid out
  int64_t largest_module = 0;  // parameters of the largest module
  uint64_t chunk_size = 0;     // strata.chunk_size (bytes of fp32 parameters)
};

// A tier's verdict: fits, or the refusal's text and a one-line summary for when
// another tier is the one reported.
struct TierVerdict {
  bool fits = true;
  std::string message;  // "the device tier cannot hold this configuration: ..."
  std::string summary;  // "the device tier is short too: it needs 3.00 GiB and has 1.00 GiB"
};

// Whether the tier holds its need; when not, names the tier, the budget and its source,
// the parts of the need, the largest model or module that fits and what would help.
TierVerdict CheckTier(const TierNeed& need, const TierBudget& budget, const PlanShape& shape);

// The NVMe tier: strata.nvme_budget when set (0: none of its own), and the free space of
// every file system the swap directories lie on (each store stripes its part evenly over
// its paths, in files rounded up to `stripe` bytes). Reads the file systems; creates
// nothing.
TierVerdict CheckNvme(const TierNeed& need, uint64_t nvme_budget, uint64_t stripe, const PlanShape& shape);

// OK when every tier fits; else OutOfBudget with the first refusal in the order given
// (the engine passes NVMe first: a model too large for the disk is refused for that,
// however the memory tiers are set) and the summary of each other tier short too.
Status Refuse(const std::vector<const TierVerdict*>& in_order);

// "1.00T", "333G", "52.4M", "900" (decimal, as --params takes them).
std::string FormatParams(double params);

}  // namespace zero
}  // namespace strata
