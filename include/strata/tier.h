// TierManager: where every (chunk, plane, shard) block lives -- GPU memory, pinned host
// memory or NVMe -- and the asynchronous moves between them, under hard budgets.
//
// Vocabulary
//  - ChunkLayout: the flat parameter space (elements, in order of first use) cut into
//    fixed-size chunks. chunk_elements is a multiple of world_size x align_elements, so
//    every rank's shard of a chunk is shard_elements = chunk_elements / world_size
//    elements, a multiple of align_elements. The last chunk is padded.
//  - Plane: one array per parameter with its own element size, sharing the layout: the
//    16-bit compute copy, fp32 master, Adam m and v, the gradient.
//  - BlockId {chunk, plane, shard}: the unit of residency. shard is a rank index
//    (this rank's shard of the chunk: ChunkLayout::rank()) or kWholeChunk (all of the
//    chunk: ZeRO-1/2 16-bit params, or a ZeRO-3 gather buffer).
//  - Tier: kDevice (HBM; sim device in tests), kHost (the pinned HostArena), kNvme (swap
//    files through the IoEngine/NvmeStore). Tiers are ordered: device is the top, NVMe
//    the bottom; "lower" means toward NVMe.
//
// Residency model
//  - A block may have valid copies on several tiers at once; all valid copies hold the
//    same bytes (the block's current version). A write (Acquire with a writing access,
//    or MarkDirty) makes the written copy the only valid one: the other copies become
//    stale and their memory is freed (NVMe slots stay reserved).
//  - Every block has a home: the lowest tier it may live on, given at Register. A block
//    homed on NVMe reserves its NVMe slots at Register; the NVMe tier is never "full" at
//    move time. A copy on its home tier is never evicted.
//  - Budgets per tier are never exceeded (device and host are accounted here, in
//    block bytes rounded up to 4 KiB; NVMe in reserved slots). A move into a full tier
//    first evicts: a copy that has another valid copy elsewhere is dropped without any
//    write; otherwise it is written one tier down (device -> host, host -> NVMe), which
//    may evict there in turn. The victim is chosen by the policy: least recently used
//    (kLru) or the block whose next use in the recorded trace is furthest away (kTrace).
//    Pinned copies, copies that a move is reading, and copies on their home tier are
//    never evicted.
//  - If the bytes that cannot be evicted (pinned, in use, at home) plus the request
//    exceed the budget, Acquire fails with OutOfBudget naming the tier, its budget, the
//    bytes in use and every pinned block with the labels of those who pinned it.
//  - Moves run asynchronously on lanes, one worker each: h2d and d2h on two device copy
//    streams, nvme-read and nvme-write through the NvmeStore, and cpu (a oneTBB arena,
//    for fills). A move between device and NVMe goes through host (it takes host budget
//    while it passes; the host copy then stays valid until evicted).
//
// Policies
//  - kLru: the victim is the least recently acquired or released copy. No prefetch
//    except what the caller asks for with Prefetch().
//  - kTrace: BeginStep() marks step boundaries. The first step records the sequence of
//    Acquire(block, tier) calls; from the next step on, every Acquire advances a cursor
//    in the recorded sequence and prefetches the blocks that follow, as far ahead as the
//    budgets allow without evicting anything needed sooner than what is fetched; the
//    victim is the copy whose next use is furthest away (Belady). An Acquire that does
//    not match the recorded order is a divergence: it is logged once (per recording),
//    counted, and the step being run is recorded as the new trace from its start.
//
// Speculative versions (two NVMe slots per block, options.nvme_slots_per_block == 2)
//  - Every write-back to NVMe goes to the slot that does not hold the committed
//    version; outside a speculation it is committed (flipped) when the write completes,
//    so a crash during a write leaves the previous version intact.
//  - BeginVersion(blocks): writes made from now on are tentative. It first makes the
//    block's current version durable in the committed slot (a write-back, waited for)
//    when it is not already there.
//  - Commit(blocks): tentative versions become current (slot flip; no I/O).
//  - Rollback(blocks): every copy holding a tentative version is dropped; the committed
//    slot is the block's only valid copy again (no I/O). A pinned block cannot be rolled
//    back (FailedPrecondition).
//
// Threads: every method may be called from any thread, concurrently. A BlockHandle may
// be used from any thread, but not by two threads at once.
// Ownership: the TierManager borrows the Device, HostArena and IoEngine (they must
// outlive it) and owns its NvmeStore (swap files are removed on destruction).
// Destruction waits for every in-flight move; handles must be released before it.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

class Device;
class HostArena;
class IoEngine;
class Timeline;
struct Config;

// ---------------------------------------------------------------------------------------
// Layout

// Splits `total_elements` into chunks and shards. All values in elements.
class ChunkLayout {
 public:
  // chunk_elements must be > 0 and a multiple of world_size * align_elements;
  // 0 <= rank < world_size. InvalidArgument naming the value otherwise.
  static Result<ChunkLayout> Create(uint64_t total_elements, uint64_t chunk_elements,
                                    int world_size = 1, int rank = 0,
                                    uint64_t align_elements = 2048);
  // chunk_bytes (strata.chunk_size) counts bytes of a 16-bit plane; rounded up to a
  // multiple of world_size * align_elements elements.
  static Result<ChunkLayout> FromChunkBytes(uint64_t total_elements, uint64_t chunk_bytes,
                                            int world_size = 1, int rank = 0,
                                            uint64_t align_elements = 2048);
  ChunkLayout() = default;

  uint64_t total_elements() const { return total_elements_; }
  uint64_t chunk_elements() const { return chunk_elements_; }
  uint64_t shard_elements() const { return chunk_elements_ / static_cast<uint64_t>(world_size_); }
  uint32_t num_chunks() const { return num_chunks_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  uint64_t align_elements() const { return align_elements_; }

  // First global element of a chunk, and how many of its elements are real parameters
  // (the rest of the last chunk is padding).
  uint64_t ChunkBegin(uint32_t chunk) const { return uint64_t{chunk} * chunk_elements_; }
  uint64_t ChunkValidElements(uint32_t chunk) const;
  // Shard `shard` of a chunk: its first global element and its real (non-padding) count.
  uint64_t ShardBegin(uint32_t chunk, int shard) const {
    return ChunkBegin(chunk) + static_cast<uint64_t>(shard) * shard_elements();
  }
  uint64_t ShardValidElements(uint32_t chunk, int shard) const;
  // The chunk holding a global element, and the element's offset in it.
  uint32_t ChunkOf(uint64_t element) const { return static_cast<uint32_t>(element / chunk_elements_); }

 private:
  uint64_t total_elements_ = 0;
  uint64_t chunk_elements_ = 0;
  uint32_t num_chunks_ = 0;
  int world_size_ = 1;
  int rank_ = 0;
  uint64_t align_elements_ = 1;
};

// A plane: a name for messages and traces ("param16", "master", "adam_m", "adam_v",
// "grad") and the size of one element in bytes.
struct PlaneSpec {
  std::string name;
  uint32_t element_bytes = 4;
};

inline constexpr uint32_t kWholeChunk = UINT32_MAX;

struct BlockId {
  uint32_t chunk = 0;
  uint32_t plane = 0;             // index into TierManagerOptions::planes
  uint32_t shard = kWholeChunk;   // a rank index, or kWholeChunk
  friend bool operator==(const BlockId&, const BlockId&) = default;
  friend auto operator<=>(const BlockId&, const BlockId&) = default;
};
struct BlockIdHash {
  size_t operator()(const BlockId& b) const {
    return (size_t{b.chunk} * 0x9E3779B97F4A7C15ull) ^ (size_t{b.plane} << 48) ^ size_t{b.shard};
  }
};

enum class Tier : uint8_t { kDevice = 0, kHost = 1, kNvme = 2 };
inline constexpr int kNumTiers = 3;
// "device", "host", "nvme".
std::string_view TierName(Tier tier);

struct TierBudgets {
  uint64_t device = 0;  // bytes of device memory the manager may hold (0: none)
  uint64_t host = 0;    // bytes of pinned host memory (0: none)
  uint64_t nvme = 0;    // bytes of NVMe swap (0: no NVMe tier)
  uint64_t& operator[](Tier t) { return t == Tier::kDevice ? device : t == Tier::kHost ? host : nvme; }
  uint64_t operator[](Tier t) const { return t == Tier::kDevice ? device : t == Tier::kHost ? host : nvme; }
};

enum class TierPolicy { kLru, kTrace };
// "lru", "trace".
std::string_view TierPolicyName(TierPolicy policy);

// How an acquirer uses the block.
enum class Access {
  kRead,       // contents loaded; not dirtied (MarkDirty may still be called)
  kReadWrite,  // contents loaded; the block is dirty from the acquire on
  kOverwrite,  // the caller overwrites every byte: nothing is loaded; dirty at once
};

// The lanes moves run on (one timeline track each).
enum class Lane : uint8_t { kH2D = 0, kD2H, kNvmeRead, kNvmeWrite, kCpu };
inline constexpr int kNumLanes = 5;
// "h2d", "d2h", "nvme-read", "nvme-write", "cpu".
std::string_view LaneName(Lane lane);

// ---------------------------------------------------------------------------------------
// The NVMe seam. The manager writes a block as ceil(bytes / slot_size) slots. The default
// backend is NvmeStore over options.nvme_paths; tests may provide their own (in-memory,
// fault-injecting). Calls come from the nvme lanes and block until done; a slot is never
// read and written concurrently.
class SlotBackend {
 public:
  virtual ~SlotBackend() = default;
  virtual uint64_t slot_size() const = 0;
  virtual uint64_t free_slots() const = 0;
  virtual Result<uint32_t> AllocateSlot() = 0;
  virtual Status FreeSlot(uint32_t slot) = 0;
  // Writes/reads `length` bytes spread over `slots` (slot i holds bytes
  // [i * slot_size, ...)); `buffer` is 4 KiB aligned host memory, `length` a multiple
  // of 4 KiB. Blocks until every piece has completed; returns the first failure.
  virtual Status WriteSlots(std::span<const uint32_t> slots, const void* buffer, uint64_t length) = 0;
  virtual Status ReadSlots(std::span<const uint32_t> slots, void* buffer, uint64_t length) = 0;
  virtual std::string name() const = 0;  // for messages: the swap file paths
};

// ---------------------------------------------------------------------------------------
// Options and telemetry

struct TierManagerOptions {
  ChunkLayout layout;
  std::vector<PlaneSpec> planes;  // BlockId::plane indexes this
  TierBudgets budgets;            // hard limits
  TierPolicy policy = TierPolicy::kTrace;

  Device* device = nullptr;       // required when budgets.device > 0
  HostArena* host_arena = nullptr;  // required when budgets.host > 0 (budget <= arena size)

  // NVMe: either a backend, or an engine plus swap directories (an NvmeStore is opened
  // with slot_size = nvme_slot_bytes and budgets.nvme / slot_size slots).
  std::shared_ptr<SlotBackend> nvme_backend;
  IoEngine* io_engine = nullptr;
  std::vector<std::string> nvme_paths;  // strata.swap_paths
  std::string nvme_name = "strata-swap";  // file stem (use one per rank)
  bool checksum = true;                 // strata.checksum
  uint64_t nvme_slot_bytes = 0;         // 0: the smallest shard block of any plane
  int nvme_slots_per_block = 2;         // 2: crash-safe writes and speculative versions; or 1

  // Trace policy: how many moves prefetch may have queued or in flight at once.
  int max_prefetch_moves = 8;
  // Record every move on this timeline (borrowed; nullptr: an internal one, spans off).
  Timeline* timeline = nullptr;
  // Written with the timeline as a Chrome trace on destruction ("" = none):
  // strata.trace_file.
  std::string trace_file;
  // Test only: run every move inline on the calling thread, in order, so that decisions
  // and byte counts are deterministic (no lanes overlap).
  bool synchronous = false;
};

struct LaneTelemetry {
  std::string name;
  uint64_t moves = 0;
  uint64_t bytes = 0;
  double busy_s = 0;
};

struct TierTelemetry {
  std::array<uint64_t, kNumTiers> budget{};      // per Tier
  std::array<uint64_t, kNumTiers> used{};        // bytes held now (NVMe: reserved slots)
  std::array<uint64_t, kNumTiers> high_water{};  // peak of used since creation / ResetTelemetry
  std::array<LaneTelemetry, kNumLanes> lanes;    // per Lane; bytes per link = lanes[].bytes
  uint64_t acquires = 0;
  uint64_t acquire_hits = 0;      // already resident (or in flight) when acquired
  uint64_t stalls = 0;            // Wait() calls that had to block
  double stall_s = 0;             // total time callers blocked in BlockHandle::Wait()
  uint64_t evictions = 0;         // copies removed to make room
  uint64_t clean_drops = 0;       // ... of which dropped without a write
  uint64_t writebacks = 0;        // ... of which written one tier down
  uint64_t prefetches_issued = 0; // prefetch moves started (Prefetch() and the trace)
  uint64_t prefetches_skipped = 0;// asked but not started (no room without evicting sooner uses)
  uint64_t trace_divergences = 0;
  uint64_t trace_length = 0;      // acquisitions in the recorded trace (0: recording)
  uint64_t io_errors = 0;         // failed moves
};

// ---------------------------------------------------------------------------------------

class TierManager;
namespace detail {
struct AcquireTicket;
}

// A pinned acquisition. Move-only; released by Release() or destruction. While held,
// the block's copy on tier() is not evicted, and data() points at it once Wait()
// returned OK (device memory for kDevice, pinned host memory for kHost; NVMe blocks
// cannot be acquired -- acquire them on host).
class BlockHandle {
 public:
  BlockHandle() = default;
  // Internal: made by TierManager::Acquire.
  explicit BlockHandle(std::shared_ptr<detail::AcquireTicket> ticket) : ticket_(std::move(ticket)) {}
  ~BlockHandle();
  BlockHandle(BlockHandle&& other) noexcept;
  BlockHandle& operator=(BlockHandle&& other) noexcept;
  BlockHandle(const BlockHandle&) = delete;
  BlockHandle& operator=(const BlockHandle&) = delete;

  bool valid() const { return ticket_ != nullptr; }
  BlockId block() const;
  Tier tier() const;
  Access access() const;
  uint64_t bytes() const;  // the block's size (its buffer may be rounded up to 4 KiB)

  // True once the block is on tier() (or the move failed). Never blocks.
  bool Ready() const;
  // Blocks until the block is on tier() and pinned; returns the move's failure (I/O
  // error, OutOfBudget found while making room) otherwise. After a failure the handle
  // holds no pin (Release is then a no-op). Time blocked counts as stall.
  Status Wait();
  // The block's memory on tier(); nullptr until Wait() returned OK.
  void* data() const;
  // Marks the block written (see TierManager::MarkDirty).
  Status MarkDirty();
  // Unpins. Idempotent.
  void Release();

 private:
  friend class TierManager;
  std::shared_ptr<detail::AcquireTicket> ticket_;
};

struct PrefetchRequest {
  BlockId block;
  Tier tier = Tier::kHost;
};

class TierManager {
 public:
  // Validates options (planes, budgets vs device capacity and arena size, the layout),
  // opens the NVMe store when budgets.nvme > 0, starts the lanes. InvalidArgument /
  // Unavailable / ResourceExhausted naming the option or path.
  static Result<std::unique_ptr<TierManager>> Create(TierManagerOptions options);
  ~TierManager();
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  const ChunkLayout& layout() const;
  const TierManagerOptions& options() const;
  // Bytes of a block: shard_elements (or chunk_elements for kWholeChunk) x element size.
  uint64_t BlockBytes(BlockId block) const;

  // Adds a block whose home (lowest tier) is `home`, placed on `home` with `initial`
  // bytes (must be BlockBytes() long) or zeros when `initial` is empty. Blocks until it
  // is there. Errors: InvalidArgument (unknown plane/chunk/shard, already registered,
  // wrong size), OutOfBudget (the home tier is full of blocks that cannot leave it).
  Status Register(BlockId block, Tier home, std::span<const std::byte> initial = {});
  // Registers the block of every chunk of `plane` for `shard` (a rank index, normally
  // layout().rank(), or kWholeChunk), zero-filled.
  Status RegisterPlane(uint32_t plane, Tier home, uint32_t shard);
  // Removes a block and frees its copies. FailedPrecondition while pinned.
  Status Unregister(BlockId block);
  bool IsRegistered(BlockId block) const;

  // Pins the block on `tier` (kDevice or kHost), loading it there asynchronously if
  // needed (evicting first if the tier is full). Returns at once; the handle's Wait()
  // blocks until the block is there. `label` names the acquirer in OutOfBudget messages
  // ("fwd layer 3"). Errors returned at once: InvalidArgument (unknown block, kNvme, a
  // tier above the block's home that has no budget), OutOfBudget (see the header
  // comment), FailedPrecondition (writing access while another tier's copy is pinned),
  // or the failure of an earlier prefetch of this block (reported once).
  Result<BlockHandle> Acquire(BlockId block, Tier tier, Access access, std::string_view label = {});
  // Same as handle.Release(). Releasing never fails.
  void Release(BlockHandle& handle);
  // Marks the acquired block written: its copy on handle.tier() becomes the only valid
  // one (see the header comment). Waits while a move is still reading that copy.
  // FailedPrecondition when the handle is not ready, or another tier's copy is pinned.
  Status MarkDirty(BlockHandle& handle);

  // Starts moving blocks toward tiers, in order, while that fits without evicting a
  // pinned block (LRU: any unpinned block; trace: nothing needed sooner). A hint: what
  // does not fit is skipped (counted); I/O failures are reported by the next Acquire of
  // the block and by WaitAll(). Never blocks on I/O.
  Status Prefetch(std::span<const PrefetchRequest> requests);

  // Moves the block's copy out of `from` now (dropped, or written one tier down) and
  // waits. FailedPrecondition when pinned or `from` is its home; no-op when absent.
  // OutOfBudget when the tier below cannot take it, the write-back's error when that
  // failed (the copy then stays). OK when it left, even if an acquisition on another
  // thread has brought a copy back by the time this returns, and when such an
  // acquisition took the leaving copy back before it left.
  Status Evict(BlockId block, Tier from);

  // Waits until no move is queued or in flight; returns (and clears) the first failure
  // of an asynchronous move since the last WaitAll().
  Status WaitAll();

  // Trace policy step boundary (harmless under LRU): call before the first Acquire of
  // each step.
  void BeginStep();

  // Speculative versions (see the header comment). Blocks must be homed on NVMe with
  // two slots per block (FailedPrecondition otherwise).
  Status BeginVersion(std::span<const BlockId> blocks);
  Status Commit(std::span<const BlockId> blocks);
  Status Rollback(std::span<const BlockId> blocks);

  TierTelemetry Telemetry() const;
  // Resets high-water marks (to current use), lane busy time, bytes, stall and counts.
  void ResetTelemetry();
  // The timeline moves are recorded on (options.timeline or the internal one).
  Timeline& timeline();
  // Writes the timeline as a Chrome trace.
  Status WriteTrace(const std::string& path) const;

  // For tests and messages: the tiers that hold a valid copy, and the pinned blocks.
  std::vector<Tier> ValidTiers(BlockId block) const;
  std::string DescribePinned(Tier tier) const;

  struct Impl;

 private:
  friend class BlockHandle;
  explicit TierManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Options from a parsed config: budgets (strata.device_budget, host_budget,
// nvme_budget), swap paths, checksum and trace_file. The caller fills layout, planes,
// device, arena and engine.
TierManagerOptions TierManagerOptionsFromConfig(const Config& config);

}  // namespace strata
