// The pinned host memory behind strata.io.pinned_empty: strata HostArenas (page-locked,
// 4 KiB aligned blocks, so O_DIRECT works on them), grown on demand.
//
// Contract:
//  - Allocate returns a block of at least `bytes`, 4 KiB aligned, from the first arena
//    with room; when none has room a new arena of max(bytes, kMinArenaBytes) is made
//    (or, when that is refused, e.g. by the memlock limit, one of just `bytes`).
//    Arenas are kept for the life of the process (like torch's pinned-memory cache):
//    pinning and touching memory is the expensive part, so freed blocks are reused.
//  - Free takes the data pointer Allocate returned, exactly once.
//  - Threads: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "strata/host_arena.h"
#include "strata/io.h"
#include "strata/status.h"

namespace strata::py {

class PinnedPool {
 public:
  static constexpr uint64_t kMinArenaBytes = uint64_t{64} << 20;

  // The process's pool. Never destroyed: torch may free a tensor's memory during
  // interpreter shutdown, after static destructors would have run.
  static PinnedPool& Get();

  // ResourceExhausted/OutOfBudget/Unavailable from HostArena when no arena can be made
  // (e.g. the memlock limit; the message says how to raise it).
  Result<void*> Allocate(uint64_t bytes);
  void Free(void* data);

  // When [data, data + length) lies inside a live block: the length an O_DIRECT
  // transfer of that range may use. That is `length` rounded up to `alignment` when the
  // range ends where the block's requested bytes end (the rounding then only covers the
  // block's own padding, which no tensor views), else `length` itself. nullopt when
  // the range is not in a live block.
  std::optional<uint64_t> TransferLength(const void* data, uint64_t length, uint64_t alignment) const;

  // The arenas' memory as I/O buffer regions (one per arena segment), and a number
  // that changes whenever an arena is added.
  std::vector<IoBufferRegion> Regions(uint64_t* generation) const;

  struct Stats {
    uint64_t arenas = 0;
    uint64_t arena_bytes = 0;
    uint64_t allocated_bytes = 0;
    uint64_t live_blocks = 0;
  };
  Stats stats() const;

 private:
  PinnedPool() = default;
  struct Live {
    HostArena* arena;
    HostBlock block;
    uint64_t requested;
  };
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<HostArena>> arenas_;
  std::map<uintptr_t, Live> live_;  // by block address
  uint64_t generation_ = 0;
};

}  // namespace strata::py
