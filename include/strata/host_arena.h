// The pinned host arena: one block of page-locked host memory per process, allocated
// and touched once at start, from which the tier manager and the I/O engine take their
// buffers. No allocation per transfer, no bounce buffer per call.
//
// How it is pinned (HostArenaOptions::pinning):
//  - cuda: cudaHostAlloc (portable), where this binary has CUDA and a GPU is present;
//    the GPU's copy engines then DMA from it directly.
//  - mlock: HostPages (below: transparent huge pages where the kernel allows them,
//    faulted in at once) + mlock elsewhere.
// Either way the memory is bound to a NUMA node (hwloc; normally the node of the GPU it
// serves) and every page is touched at creation, so nothing faults later.
//
// The memlock limit (`ulimit -l`, RLIMIT_MEMLOCK) is checked before anything is
// allocated, unless the process holds CAP_IPC_LOCK. With mlock pinning too low a limit
// is ResourceExhausted saying how to raise it or to lower strata.host_budget. With cuda
// pinning (the driver pins without the limit) it is a logged warning, since
// registering the arena with io_uring as fixed buffers (which the I/O engine does with
// base()/size()) counts against the limit and will then be refused.
//
// Sub-allocation: blocks are 4 KiB aligned (O_DIRECT) and sized in multiples of 4 KiB,
// placed best fit anywhere in the arena. The I/O engine registers the whole arena as
// fixed buffers (the kernel's 1 GiB per buffer is the engine's concern: it cuts a
// transfer at a buffer's end), so no block has to avoid a boundary and none is stranded.
//
// Threads: Allocate, Free and the accessors may be called from any thread.
// Ownership: the arena owns the memory; blocks are views into it, valid until Free()
// or the arena's destruction. Destroying an arena with blocks still allocated is
// allowed (the memory goes away with it).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "strata/status.h"
#include "strata/topology.h"

namespace strata {

inline constexpr uint64_t kHostBlockAlignment = 4096;

enum class HostPinning { kAuto, kCuda, kMlock };
// "auto", "cudaHostAlloc", "mlock".
std::string_view HostPinningName(HostPinning p);

struct HostArenaOptions {
  uint64_t bytes = 0;                        // > 0; rounded up to 2 MiB (one huge page)
  int numa_node = -1;                        // OS index of the node to bind to; -1: no binding
  HostPinning pinning = HostPinning::kAuto;  // auto: cuda where a GPU is present, else mlock
  bool huge_pages = true;                    // madvise(MADV_HUGEPAGE) on the mlock path
  // The limit to check against instead of QueryMemlockLimit() (tests).
  std::optional<MemlockLimit> memlock;
};

// A piece of the arena. `offset` is from base(); `size` is what was asked, rounded up
// to 4 KiB.
struct HostBlock {
  void* data = nullptr;
  uint64_t size = 0;
  uint64_t offset = 0;
  explicit operator bool() const { return data != nullptr; }
};

class HostPages;

class HostArena {
 public:
  // Allocates, binds, touches and pins the arena. Errors: InvalidArgument (bytes == 0,
  // a NUMA node that does not exist), ResourceExhausted (the
  // memlock limit, mmap or mlock refused, cudaHostAlloc out of memory), Unavailable
  // (pinning kCuda asked where CUDA or a GPU is missing).
  static Result<std::unique_ptr<HostArena>> Create(const HostArenaOptions& options);
  ~HostArena();
  HostArena(const HostArena&) = delete;
  HostArena& operator=(const HostArena&) = delete;

  void* base() const { return base_; }
  uint64_t size() const { return size_; }
  HostPinning pinning() const { return pinning_; }  // kCuda or kMlock, never kAuto
  int numa_node() const { return numa_node_; }      // -1 when unbound
  // Whether the memory was bound to numa_node() (false when binding was refused,
  // which is logged, or not asked for).
  bool numa_bound() const { return numa_bound_; }
  // mlock path: huge pages were asked for, by MADV_HUGEPAGE or MADV_COLLAPSE (see HostPages).
  bool huge_pages() const { return huge_pages_; }
  // mlock path: bytes of the arena the kernel put on 2 MiB pages at creation (0 for cuda).
  uint64_t huge_page_bytes() const { return huge_page_bytes_; }

  // Takes `bytes` (> 0) from the arena (best fit). Over what is free (or too
  // fragmented) it is OutOfBudget naming the request, the arena size, what is
  // allocated and the largest free block.
  Result<HostBlock> Allocate(uint64_t bytes);
  // Returns a block. A block not from this arena, or freed twice, aborts.
  void Free(const HostBlock& block);

  uint64_t allocated() const;
  uint64_t high_water() const;
  uint64_t largest_free() const;
  // True when [p, p + bytes) lies inside the arena.
  bool Contains(const void* p, uint64_t bytes) const;

 private:
  HostArena() = default;
  // The mlock path of Create: map, bind, fault in, lock.
  Status MapLocked(const HostArenaOptions& options);
  void* base_ = nullptr;
  uint64_t size_ = 0;
  std::unique_ptr<HostPages> pages_;  // mlock path: the mapping
  HostPinning pinning_ = HostPinning::kMlock;
  int numa_node_ = -1;
  bool numa_bound_ = false;
  bool huge_pages_ = false;
  uint64_t huge_page_bytes_ = 0;

  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> length
  uint64_t allocated_ = 0;
  uint64_t high_water_ = 0;
};

// Anonymous memory for I/O buffers, shared by the host arena (mlock path) and
// `strata bench io`: 2 MiB aligned, on transparent huge pages where the kernel allows
// them, every page faulted in by one pass before anyone registers it for I/O.
//
// Why huge pages: a disk request is cut into one segment per physically contiguous run
// of its buffer, and the segments are what a queue runs out of (a virtio disk without
// indirect descriptors spends one ring slot per segment: a 1 MiB read over scattered
// 4 KiB pages fills its whole 256-slot ring, over a 2 MiB page it takes one). Where 4 KiB
// pages land physically is up to the page allocator's free lists at fault time (the
// order in which the previous owner freed them), not to how the pages are touched, so
// only huge pages make the layout of a buffer predictable.
//
// Threads: one owner; the accessors are const. Ownership: unmapped by the destructor.
class HostPages {
 public:
  // Maps `bytes` (> 0; rounded up to 2 MiB) 2 MiB aligned. With `huge_pages` it asks
  // for transparent huge pages: madvise MADV_HUGEPAGE, or where the kernel's mode
  // (/sys/kernel/mm/transparent_hugepage/enabled) is "never" or the advice is refused,
  // a MADV_COLLAPSE in Populate() (Linux 6.1+; it ignores the mode). On 4 KiB pages a
  // direct read's buffer is as scattered as the page allocator left it, which on a disk
  // without indirect descriptors caps the requests in flight. Nothing is faulted in yet,
  // so a NUMA policy set on the range before Populate() places the pages.
  // Errors: InvalidArgument (bytes == 0), ResourceExhausted (mmap refused).
  static Result<std::unique_ptr<HostPages>> Map(uint64_t bytes, bool huge_pages);
  ~HostPages();
  HostPages(const HostPages&) = delete;
  HostPages& operator=(const HostPages&) = delete;

  // Faults every page in, writable, in one pass in the kernel (MADV_POPULATE_WRITE; a
  // write to each page where the kernel predates it, before Linux 5.14), after the
  // collapse Map() chose, if any; a refused collapse leaves 4 KiB pages. Idempotent.
  // Errors: ResourceExhausted (out of memory).
  Status Populate();

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // MADV_HUGEPAGE was asked for and accepted, and transparent huge pages are not "never".
  bool huge_advised() const { return huge_advised_; }
  // Populate() collapses the range onto huge pages (asked for, and not advised).
  bool collapses() const { return collapses_; }
  // Bytes of the mapping now on 2 MiB pages (AnonHugePages in /proc/self/smaps; 0 when
  // that cannot be read).
  uint64_t HugePageBytes() const;
  // Bytes of the mapping now resident (mincore).
  uint64_t ResidentBytes() const;

  // Tests: behave as a kernel without MADV_POPULATE_WRITE.
  static void ForceTouchPopulateForTesting(bool on);
  // Tests: take the MADV_COLLAPSE path, as under transparent huge pages "never".
  static void ForceCollapseForTesting(bool on);

 private:
  HostPages(char* data, uint64_t size) : data_(data), size_(size) {}
  void Collapse();
  char* data_;
  uint64_t size_;
  bool huge_advised_ = false;
  bool collapses_ = false;
};

// OK when `bytes` may be locked under `limit`; otherwise ResourceExhausted naming the
// request and the limit and how to raise it (`ulimit -l unlimited`,
// /etc/security/limits.conf memlock, docker --ulimit memlock=-1) or to lower
// strata.host_budget.
Status CheckMemlock(uint64_t bytes, const MemlockLimit& limit);

// The arena size for a host budget: `host_budget` itself when non-zero; otherwise
// the smaller of what the memlock limit allows and half of the machine's memory.
uint64_t DefaultHostArenaBytes(uint64_t host_budget, const Topology& topology);

}  // namespace strata
