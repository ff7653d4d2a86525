#include "pinned_pool.h"

#include <algorithm>

namespace strata::py {

PinnedPool& PinnedPool::Get() {
  static PinnedPool* pool = new PinnedPool();  // deliberately leaked, see the header
  return *pool;
}

Result<void*> PinnedPool::Allocate(uint64_t bytes) {
  const uint64_t want = std::max<uint64_t>(bytes, 1);
  std::lock_guard<std::mutex> lock(mu_);
  HostArena* arena = nullptr;
  Result<HostBlock> block = OutOfBudgetError("no arena");
  for (const auto& a : arenas_) {
    if (a->largest_free() < want) continue;
    block = a->Allocate(want);
    if (block.ok()) {
      arena = a.get();
      break;
    }
  }
  if (arena == nullptr) {
    HostArenaOptions options;
    options.bytes = std::max(want, kMinArenaBytes);
    Result<std::unique_ptr<HostArena>> made = HostArena::Create(options);
    if (!made.ok() && options.bytes > want) {
      // Under a small memlock limit an arena of just this block may still fit.
      options.bytes = want;
      made = HostArena::Create(options);
    }
    if (!made.ok()) return made.status();
    std::unique_ptr<HostArena> fresh = std::move(made).value();
    block = fresh->Allocate(want);
    if (!block.ok()) return block.status();
    arena = fresh.get();
    arenas_.push_back(std::move(fresh));
    ++generation_;
  }
  live_.emplace(reinterpret_cast<uintptr_t>(block->data), Live{arena, *block, bytes});
  return block->data;
}

void PinnedPool::Free(void* data) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<uintptr_t>(data));
  STRATA_CHECK_MSG(it != live_.end(), "PinnedPool::Free of a pointer it did not hand out");
  it->second.arena->Free(it->second.block);
  live_.erase(it);
}

std::optional<uint64_t> PinnedPool::TransferLength(const void* data, uint64_t length,
                                                   uint64_t alignment) const {
  const auto p = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.upper_bound(p);
  if (it == live_.begin()) return std::nullopt;
  --it;
  const Live& b = it->second;
  const uintptr_t start = it->first;
  if (p + length > start + b.block.size) return std::nullopt;
  const uint64_t rounded = (length + alignment - 1) / alignment * alignment;
  const bool ends_at_padding = p + length == start + b.requested;
  if (ends_at_padding && p + rounded <= start + b.block.size) return rounded;
  return length;
}

std::vector<IoBufferRegion> PinnedPool::Regions(uint64_t* generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<IoBufferRegion> regions;
  for (const auto& a : arenas_) {
    regions.push_back(IoBufferRegion{a->base(), a->size()});
  }
  *generation = generation_;
  return regions;
}

PinnedPool::Stats PinnedPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.arenas = arenas_.size();
  for (const auto& a : arenas_) {
    s.arena_bytes += a->size();
    s.allocated_bytes += a->allocated();
  }
  s.live_blocks = live_.size();
  return s;
}

}  // namespace strata::py
