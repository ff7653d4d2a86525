// TierManager internals: residency state, lanes and the scheduler (one lock for all).
//
// Locking: Impl::mu_ guards every field below except the lanes' own queues. Moves run on
// lane threads without the lock; their completions take it. Device, store and arena calls
// that may block are made outside the lock.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include "strata/device.h"
#include "strata/host_arena.h"
#include "strata/tier.h"
#include "strata/timeline.h"
#include "tiering/tier_lanes.h"
#include "tiering/tier_policy.h"

namespace strata {
struct NvmeStoreOptions;
namespace detail {

struct AcquireTicket {
  enum class State { kPending, kReady, kFailed, kReleased };
  TierManager::Impl* impl = nullptr;
  BlockId block;
  Tier tier = Tier::kHost;
  Access access = Access::kRead;
  std::string label;
  uint64_t bytes = 0;
  State state = State::kPending;
  Status status;
  void* data = nullptr;
};

}  // namespace detail

namespace tiering {

// One block's copy on the device or the host.
struct Copy {
  enum class State { kAbsent, kLoading, kValid, kLeaving };
  State state = State::kAbsent;
  uint64_t version = 0;  // the block version its bytes hold (or will, once loaded)
  void* ptr = nullptr;
  HostBlock host;        // host storage (host tier only)
  int readers = 0;       // moves in flight that read this copy
  uint64_t last_use = 0;
};

// The NVMe copy: two sets of slots; `committed` holds the committed version.
struct NvmeCopy {
  std::array<std::vector<uint32_t>, 2> slots;
  int nslots = 0;                // 1 or 2 versions
  int committed = 0;             // index into slots
  uint64_t committed_version = 0;
  bool zero = false;             // the committed version is all zeros (never written)
  int tentative = -1;            // slot index holding a tentative version, or -1
  uint64_t tentative_version = 0;
  std::array<int, 2> readers{};  // reads in flight per slot
  std::array<bool, 2> writing{}; // a write in flight per slot
};

struct Block {
  BlockId id;
  uint64_t bytes = 0;
  uint64_t alloc = 0;  // bytes rounded up to 4 KiB: what budgets count
  Tier home = Tier::kHost;
  uint64_t version = 1;
  std::array<Copy, 2> copies;   // kDevice, kHost
  NvmeCopy nvme;                // when home == kNvme
  std::array<int, 2> pins{};          // acquisitions (pending or ready) per tier
  std::array<int, 2> write_pins{};    // ... of which with a writing access
  std::array<int, 2> holds{};         // host copies held for an onward move to device
  std::array<int, 2> want{};          // 0 none, 1 prefetch, 2 demand (per tier)
  std::array<bool, 2> want_hold{};    // the device want holds the host copy
  int moves = 0;                      // moves in flight touching this block
  bool speculating = false;
  Status pending_error;               // failure of a prefetch, reported by the next Acquire
  // Outcome of the last write-back from each tier (kDevice, kHost: for Evict/flush): its
  // error, or why the tier below could not take it.
  std::array<Status, 2> evict_error;
  std::vector<std::shared_ptr<detail::AcquireTicket>> tickets;  // pending and ready
};

// A queued piece of scheduling work: load `tier` of `block`, or write its copy on
// `tier` one tier down.
struct Pending {
  enum class Kind { kLoad, kWriteback } kind = Kind::kLoad;
  BlockId block;
  Tier tier = Tier::kHost;
};

// One move handed to a lane.
struct Move {
  enum class Kind { kH2D, kD2H, kNvmeRead, kNvmeWrite, kZeroFill } kind = Kind::kH2D;
  BlockId block;
  Tier src = Tier::kHost;
  Tier dst = Tier::kHost;
  uint64_t version = 0;
  bool writeback = false;  // an eviction (the source copy is leaving)
  bool prefetch = false;
  int slot = 0;            // NVMe slot index read or written
  void* src_ptr = nullptr;
  void* dst_ptr = nullptr;
  std::vector<uint32_t> slots;
  uint64_t bytes = 0;
};

int TierIndex(Tier t);
Tier TierAt(int i);
Lane LaneOf(Move::Kind kind);
std::string BlockName(const TierManagerOptions& options, BlockId b);
// The default NVMe backend (tier_nvme_backend.cc).
Result<std::shared_ptr<SlotBackend>> OpenNvmeSlotBackend(IoEngine& engine,
                                                         const NvmeStoreOptions& options);

}  // namespace tiering

struct TierManager::Impl {
  TierManagerOptions options;
  std::unique_ptr<tiering::TierPolicyImpl> policy;
  std::shared_ptr<SlotBackend> nvme;
  std::unique_ptr<Timeline> own_timeline;
  Timeline* timeline = nullptr;
  std::array<int, kNumLanes> tracks{};
  StreamId h2d_stream, d2h_stream;
  std::unique_ptr<tiering::LaneSet> lanes;
  tbb::task_arena cpu_arena;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<BlockId, tiering::Block, BlockIdHash> blocks;
  std::deque<tiering::Pending> pending;
  std::array<uint64_t, kNumTiers> used{};
  std::array<uint64_t, kNumTiers> high_water{};
  std::array<uint64_t, 2> leaving{};  // bytes of copies being written down, per tier
  std::array<std::map<uint64_t, std::vector<void*>>, 1> device_cache;  // free device buffers by size
  std::map<uint64_t, std::vector<HostBlock>> host_cache;               // free host blocks by size
  uint64_t clock = 0;       // logical time for LRU
  uint64_t in_flight = 0;   // moves on lanes
  int prefetch_outstanding = 0;
  Status async_error;
  TierTelemetry tele;
  std::array<LaneTelemetry, kNumLanes> lane_tele;
  bool shutting_down = false;
  std::deque<tiering::Move> sync_queue;  // options.synchronous: moves run by Pump()
  bool draining = false;

  // --- tier_manager.cc / tier_acquire.cc (take the lock themselves)
  // `record`: tell the policy (false for the manager's own acquisitions).
  void ReleaseTicket(const std::shared_ptr<detail::AcquireTicket>& tk);
  Status MarkDirtyTicket(const std::shared_ptr<detail::AcquireTicket>& tk);
  Result<BlockHandle> AcquireImpl(BlockId id, Tier tier, Access access, std::string_view label, bool record);
  tiering::Block* Find(BlockId id);
  const tiering::Block* Find(BlockId id) const;

  // --- tier_schedule.cc (all with `mu` held)
  void Pump();
  // Advances one pending item; true when it is finished (launched, satisfied or dropped).
  bool Advance(const tiering::Pending& p);
  bool AdvanceLoad(tiering::Block& b, Tier t);
  bool AdvanceWriteback(tiering::Block& b, Tier from);
  // Makes room for `bytes` on `t` and allocates it. Returns true with `*ptr`/`*host`
  // set, false when it must wait (evictions may have been started). `priority` bounds
  // victims for prefetches (only strictly larger ones go); demand passes UINT64_MAX.
  // Sets *no_victim when nothing could be evicted at all.
  bool Reserve(Tier t, uint64_t bytes, bool prefetch, uint64_t priority, void** ptr,
               HostBlock* host, bool* no_victim);
  // Dry run of Reserve for a prefetch: could room be made without waiting on victims
  // needed sooner than `priority`?
  bool CanMakeRoom(Tier t, uint64_t bytes, uint64_t priority) const;
  bool AllocateStorage(Tier t, uint64_t bytes, void** ptr, HostBlock* host);
  void FreeStorage(Tier t, tiering::Copy& c, uint64_t bytes);
  void FreeCopy(tiering::Block& b, Tier t);
  bool CanEvict(const tiering::Block& b, Tier t) const;
  bool HasOtherValid(const tiering::Block& b, Tier t) const;
  bool NvmeValid(const tiering::Block& b) const;
  int NvmeValidSlot(const tiering::Block& b) const;
  // Bytes on `t` that no eviction can free: pinned (or promised to a pin) or at home.
  uint64_t Unevictable(Tier t) const;
  // Whether moves in flight touch `t` (copies loading, being read, held, leaving).
  bool TierBusy(Tier t) const;
  void StartWriteback(tiering::Block& b, Tier from);
  void Launch(tiering::Move m);
  void OnMoveDone(const tiering::Move& m, const Status& status);
  void NotifyTickets(tiering::Block& b);
  void FailTickets(tiering::Block& b, Tier t, const Status& status);
  void MarkDirtyLocked(tiering::Block& b, Tier t);
  void Want(tiering::Block& b, Tier t, bool prefetch);
  void DropWant(tiering::Block& b, Tier t);
  void TracePrefetch();
  std::string DescribePinnedLocked(Tier t) const;
  Status OutOfBudget(Tier t, uint64_t bytes, const tiering::Block& b) const;
  void UpdateHighWater(Tier t);
  // Debug builds: aborts when a pending acquisition has nothing left that will make it
  // ready (no want queued, no load or move in flight), which would hang its Wait().
  void CheckNoStrandedTickets() const;
  // Waits (releasing `lock`) until the block has no move in flight or queued.
  void WaitBlockIdle(std::unique_lock<std::mutex>& lock, BlockId id);

  // --- tier_lanes.cc / run on lane threads (no lock)
  Status Execute(const tiering::Move& m);
  // Runs a move and applies its completion; `locked`: mu is held by the caller.
  void RunMove(const tiering::Move& m, bool locked);
};

}  // namespace strata
