// ChunkLayout, names, and TierManagerOptions from a config.
#include <algorithm>
#include <string>

#include "strata/config.h"
#include "tiering/tier_internal.h"

namespace strata {

Result<ChunkLayout> ChunkLayout::Create(uint64_t total_elements, uint64_t chunk_elements,
                                        int world_size, int rank, uint64_t align_elements) {
  if (world_size < 1) return InvalidArgumentError("chunk layout: world size must be >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size)
    return InvalidArgumentError("chunk layout: rank " + std::to_string(rank) + " outside world size " +
                                std::to_string(world_size));
  if (align_elements == 0) return InvalidArgumentError("chunk layout: alignment must be > 0 elements");
  uint64_t unit = static_cast<uint64_t>(world_size) * align_elements;
  if (chunk_elements == 0 || chunk_elements % unit != 0)
    return InvalidArgumentError("chunk layout: chunk of " + std::to_string(chunk_elements) +
                                " elements is not a positive multiple of world size x alignment = " +
                                std::to_string(unit) + " (strata.chunk_size)");
  if (total_elements == 0) return InvalidArgumentError("chunk layout: the model has no parameters");
  ChunkLayout l;
  l.total_elements_ = total_elements;
  l.chunk_elements_ = chunk_elements;
  uint64_t chunks = (total_elements + chunk_elements - 1) / chunk_elements;
  if (chunks > UINT32_MAX - 1) return InvalidArgumentError("chunk layout: too many chunks; raise strata.chunk_size");
  l.num_chunks_ = static_cast<uint32_t>(chunks);
  l.world_size_ = world_size;
  l.rank_ = rank;
  l.align_elements_ = align_elements;
  return l;
}

Result<ChunkLayout> ChunkLayout::FromChunkBytes(uint64_t total_elements, uint64_t chunk_bytes,
                                                int world_size, int rank, uint64_t align_elements) {
  uint64_t unit = static_cast<uint64_t>(std::max(world_size, 1)) * std::max<uint64_t>(align_elements, 1);
  uint64_t elements = std::max<uint64_t>(chunk_bytes / 2, 1);
  elements = (elements + unit - 1) / unit * unit;
  return Create(total_elements, elements, world_size, rank, align_elements);
}

uint64_t ChunkLayout::ChunkValidElements(uint32_t chunk) const {
  uint64_t begin = ChunkBegin(chunk);
  if (begin >= total_elements_) return 0;
  return std::min(chunk_elements_, total_elements_ - begin);
}

uint64_t ChunkLayout::ShardValidElements(uint32_t chunk, int shard) const {
  uint64_t begin = ShardBegin(chunk, shard);
  if (begin >= total_elements_) return 0;
  return std::min(shard_elements(), total_elements_ - begin);
}

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice: return "device";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

std::string_view TierPolicyName(TierPolicy policy) {
  return policy == TierPolicy::kLru ? "lru" : "trace";
}

std::string_view LaneName(Lane lane) {
  switch (lane) {
    case Lane::kH2D: return "h2d";
    case Lane::kD2H: return "d2h";
    case Lane::kNvmeRead: return "nvme-read";
    case Lane::kNvmeWrite: return "nvme-write";
    case Lane::kCpu: return "cpu";
  }
  return "?";
}

TierManagerOptions TierManagerOptionsFromConfig(const Config& config) {
  TierManagerOptions o;
  o.budgets.device = config.strata.device_budget;
  o.budgets.host = config.strata.host_budget;
  o.budgets.nvme = config.strata.nvme_budget;
  o.nvme_paths = config.strata.swap_paths;
  if (o.nvme_paths.empty()) o.nvme_paths = config.zero.offload_optimizer.nvme_path;
  if (o.nvme_paths.empty()) o.nvme_paths = config.zero.offload_param.nvme_path;
  o.checksum = config.strata.checksum;
  o.trace_file = config.strata.trace_file;
  return o;
}

namespace tiering {

int TierIndex(Tier t) { return static_cast<int>(t); }
Tier TierAt(int i) { return static_cast<Tier>(i); }

std::string BlockName(const TierManagerOptions& options, BlockId b) {
  std::string s = "c" + std::to_string(b.chunk) + ".";
  s += b.plane < options.planes.size() ? options.planes[b.plane].name : "plane" + std::to_string(b.plane);
  if (b.shard != kWholeChunk) s += ".s" + std::to_string(b.shard);
  return s;
}

}  // namespace tiering
}  // namespace strata
