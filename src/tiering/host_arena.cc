// The pinned host arena: creation (pin, bind, touch) and the best-fit sub-allocator;
// HostPages, the mapping it (and `strata bench io`) takes its memory from.
#include "strata/host_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "strata/device.h"
#include "strata/log.h"
#include "strata/units.h"
#include "tiering/device_backends.h"

namespace strata {
namespace {

constexpr uint64_t kHugePage = 2ull << 20;

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Linux 5.14's advice; older C library headers lack the name, older kernels EINVAL it.
#ifdef MADV_POPULATE_WRITE
constexpr int kMadvPopulateWrite = MADV_POPULATE_WRITE;
#else
constexpr int kMadvPopulateWrite = 23;
#endif
// Linux 6.1's synchronous collapse; it works whatever the transparent_hugepage mode.
#ifdef MADV_COLLAPSE
constexpr int kMadvCollapse = MADV_COLLAPSE;
#else
constexpr int kMadvCollapse = 25;
#endif

std::atomic<bool> force_touch_populate{false};
std::atomic<bool> force_collapse{false};

// AnonHugePages of the mappings in /proc/self/smaps that overlap [lo, hi).
uint64_t SmapsAnonHugeBytes(uintptr_t lo, uintptr_t hi) {
  std::ifstream in("/proc/self/smaps");
  bool overlaps = false;
  uint64_t total = 0;
  for (std::string line; std::getline(in, line);) {
    unsigned long long start = 0, end = 0, kib = 0;
    // A mapping's header is "start-end perms ..."; its fields are "Name: value kB".
    if (std::sscanf(line.c_str(), "%llx-%llx ", &start, &end) == 2) {
      overlaps = start < hi && end > lo;
    } else if (overlaps && std::sscanf(line.c_str(), "AnonHugePages: %llu kB", &kib) == 1) {
      total += kib << 10;
    }
  }
  return total;
}

}  // namespace

Result<std::unique_ptr<HostPages>> HostPages::Map(uint64_t bytes, bool huge_pages) {
  if (bytes == 0) return InvalidArgumentError("host pages: size must be > 0");
  const uint64_t size = RoundUp(bytes, kHugePage);
  // Over-map by one huge page so the mapping can start on a 2 MiB boundary.
  const uint64_t mapped = size + kHugePage;
  void* raw = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    return ResourceExhaustedError(ErrnoError(errno, "mmap of " + FormatBytes(mapped)).message());
  }
  const uintptr_t start = RoundUp(reinterpret_cast<uintptr_t>(raw), kHugePage);
  const uint64_t head = start - reinterpret_cast<uintptr_t>(raw);
  if (head > 0) munmap(raw, head);
  if (mapped - head - size > 0) munmap(reinterpret_cast<char*>(start) + size, mapped - head - size);
  std::unique_ptr<HostPages> pages(new HostPages(reinterpret_cast<char*>(start), size));
  if (!huge_pages) return pages;
  // Under "never" the kernel accepts the advice and ignores it; Populate collapses instead.
  if (!force_collapse.load(std::memory_order_relaxed) && QueryHugePages().thp_enabled != "never") {
    pages->huge_advised_ = madvise(pages->data_, size, MADV_HUGEPAGE) == 0;
    if (!pages->huge_advised_) {
      STRATA_LOG(kDebug, "host") << "madvise(MADV_HUGEPAGE) refused: errno " << errno;
    }
  }
  pages->collapses_ = !pages->huge_advised_;
  return pages;
}

void HostPages::Collapse() {
  // One touched page per 2 MiB gives each range a page table to collapse; the kernel
  // then takes a huge page for it and zero-fills the rest, so no 4 KiB page is copied.
  volatile char* p = data_;
  for (uint64_t off = 0; off < size_; off += kHugePage) p[off] = p[off];
  if (madvise(data_, size_, kMadvCollapse) != 0) {
    // EINVAL before Linux 6.1; EAGAIN or ENOMEM when no huge page could be had. What is
    // not collapsed is faulted in on 4 KiB pages by the caller.
    STRATA_LOG(kDebug, "host") << "madvise(MADV_COLLAPSE) of " << FormatBytes(size_) << " refused: errno "
                               << errno;
  }
}

HostPages::~HostPages() { munmap(data_, size_); }

Status HostPages::Populate() {
  if (collapses_) Collapse();
  // One pass in the kernel: each fault takes its page (a huge one where advised) straight
  // from the allocator, and the pass costs a fraction of touching the pages from here.
  if (!force_touch_populate.load(std::memory_order_relaxed)) {
    if (madvise(data_, size_, kMadvPopulateWrite) == 0) return OkStatus();
    const int err = errno;
    if (err != EINVAL)
      return ResourceExhaustedError(ErrnoError(err, "faulting in " + FormatBytes(size_)).message());
  }
  // Kernels before 5.14: a write to every page, of the byte already there (so populating
  // twice keeps the data).
  volatile char* p = data_;
  for (uint64_t off = 0; off < size_; off += kHostBlockAlignment) p[off] = p[off];
  return OkStatus();
}

uint64_t HostPages::HugePageBytes() const {
  const auto lo = reinterpret_cast<uintptr_t>(data_);
  // A neighbouring mapping merged into ours would count too.
  return std::min(size_, SmapsAnonHugeBytes(lo, lo + size_));
}

uint64_t HostPages::ResidentBytes() const {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((size_ + page - 1) / page);
  if (mincore(data_, size_, in_core.data()) != 0) return 0;
  uint64_t resident = 0;
  for (unsigned char c : in_core) resident += (c & 1) ? page : 0;
  return resident;
}

void HostPages::ForceTouchPopulateForTesting(bool on) { force_touch_populate.store(on); }
void HostPages::ForceCollapseForTesting(bool on) { force_collapse.store(on); }

std::string_view HostPinningName(HostPinning p) {
  switch (p) {
    case HostPinning::kAuto: return "auto";
    case HostPinning::kCuda: return "cudaHostAlloc";
    case HostPinning::kMlock: return "mlock";
  }
  return "?";
}

namespace {
std::string MemlockAdvice(const MemlockLimit& limit) {
  std::ostringstream msg;
  msg << "the memlock limit (ulimit -l) is "
      << (limit.unlimited ? std::string("unlimited") : FormatBytes(limit.soft_bytes));
  if (limit.hard_bytes != UINT64_MAX) msg << " (hard limit " << FormatBytes(limit.hard_bytes) << ")";
  msg << "; raise it with `ulimit -l unlimited` (hard limit permitting), a memlock line in "
         "/etc/security/limits.conf (e.g. `* - memlock unlimited`), LimitMEMLOCK=infinity for a systemd unit "
         "or "
         "`docker run --ulimit memlock=-1`, or lower strata.host_budget to at most "
      << FormatBytes(limit.soft_bytes);
  return msg.str();
}
}  // namespace

Status CheckMemlock(uint64_t bytes, const MemlockLimit& limit) {
  if (bytes <= limit.lockable_bytes()) return OkStatus();
  return ResourceExhaustedError("the pinned host arena needs " + FormatBytes(bytes) +
                                " of locked memory but " + MemlockAdvice(limit));
}

uint64_t DefaultHostArenaBytes(uint64_t host_budget, const Topology& topology) {
  if (host_budget != 0) return host_budget;
  uint64_t memory = topology.total_memory_bytes;
  if (memory == 0)
    memory = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t bytes = std::min(topology.memlock.lockable_bytes(), memory / 2);
  return bytes / kHugePage * kHugePage;
}

Result<std::unique_ptr<HostArena>> HostArena::Create(const HostArenaOptions& options) {
  if (options.bytes == 0) return InvalidArgumentError("host arena: size must be > 0 (strata.host_budget)");
  uint64_t size = RoundUp(options.bytes, kHugePage);
  HostPinning pinning = options.pinning;
  if (pinning == HostPinning::kAuto)
    pinning = ProbeCuda().available ? HostPinning::kCuda : HostPinning::kMlock;
  MemlockLimit limit = options.memlock ? *options.memlock : QueryMemlockLimit();
  Status memlock = CheckMemlock(size, limit);
  if (!memlock.ok()) {
    // mlock needs the limit; cudaHostAlloc pins through the driver and does not, but
    // registering the arena with io_uring will.
    if (pinning == HostPinning::kMlock) return memlock;
    STRATA_LOG(kWarn, "host")
        << memlock.message()
        << " (cudaHostAlloc pins regardless, but io_uring cannot register the arena as fixed "
           "buffers under this limit)";
  }

  std::unique_ptr<HostArena> arena(new HostArena());
  arena->size_ = size;
  arena->pinning_ = pinning;
  arena->numa_node_ = options.numa_node;

  if (pinning == HostPinning::kCuda) {
    // The driver touches the pages while pinning them: the thread's policy places them.
    bool bound = false;
    if (options.numa_node >= 0) {
      Status s = BindThreadMemoryToNumaNode(options.numa_node);
      if (s.code() == StatusCode::kInvalidArgument) return s;
      if (!s.ok()) {
        STRATA_LOG(kWarn, "host") << "host arena not bound to its NUMA node: " << s.message();
      }
      bound = s.ok();
    }
    Result<void*> p = tiering::CudaHostAlloc(size);
    if (bound) {
      Status reset = BindThreadMemoryToNumaNode(-1);
      if (!reset.ok()) {
        STRATA_LOG(kWarn, "host") << reset.message();
      }
    }
    if (!p.ok()) return p.status();
    arena->base_ = *p;
    arena->numa_bound_ = bound;
    if (reinterpret_cast<uintptr_t>(arena->base_) % kHostBlockAlignment != 0) {
      return InternalError("cudaHostAlloc returned memory that is not 4 KiB aligned");
    }
  } else {
    STRATA_RETURN_IF_ERROR(arena->MapLocked(options));
  }
  arena->free_.emplace(0, size);
  STRATA_LOG(kDebug, "host") << "host arena: " << FormatBytes(size) << " pinned by "
                             << HostPinningName(pinning)
                             << (arena->numa_bound_ ? ", NUMA node " + std::to_string(options.numa_node)
                                                    : "");
  return arena;
}

Status HostArena::MapLocked(const HostArenaOptions& options) {
  Result<std::unique_ptr<HostPages>> pages = HostPages::Map(size_, options.huge_pages);
  if (!pages.ok()) {
    return ResourceExhaustedError(pages.status().message() +
                                  " for the pinned host arena; lower strata.host_budget");
  }
  pages_ = std::move(pages).value();
  huge_pages_ = pages_->huge_advised() || pages_->collapses();
  if (options.numa_node >= 0) {
    // Before the pages exist, so that the policy places them.
    Status s = BindMemoryToNumaNode(pages_->data(), size_, options.numa_node);
    if (s.code() == StatusCode::kInvalidArgument) return s;
    if (!s.ok()) {
      STRATA_LOG(kWarn, "host") << "host arena not bound to its NUMA node: " << s.message();
    }
    numa_bound_ = s.ok();
  }
  // The one touch the arena gets; mlock would fault the pages in too, but Populate does
  // it in the kernel's fastest pass on every kernel that has one.
  STRATA_RETURN_IF_ERROR(pages_->Populate().WithContext("the pinned host arena"));
  if (mlock(pages_->data(), size_) != 0) {
    int err = errno;
    Status s = ErrnoError(err, "mlock of " + FormatBytes(size_) + " for the pinned host arena");
    MemlockLimit now = QueryMemlockLimit();
    return ResourceExhaustedError(s.message() + "; " + MemlockAdvice(now));
  }
  base_ = pages_->data();
  huge_page_bytes_ = pages_->HugePageBytes();
  if (huge_pages_ && huge_page_bytes_ < size_) {
    STRATA_LOG(kDebug, "host") << "host arena: " << FormatBytes(huge_page_bytes_) << " of "
                               << FormatBytes(size_) << " on huge pages (the kernel had no more free)";
  }
  return OkStatus();
}

HostArena::~HostArena() {
  if (base_ == nullptr) return;
  if (pinning_ == HostPinning::kCuda) {
    tiering::CudaHostFree(base_);
  } else {
    munlock(base_, size_);  // pages_ unmaps
  }
}

Result<HostBlock> HostArena::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgumentError("host arena: Allocate(0): a block needs at least one byte");
  if (bytes > size_) {
    return OutOfBudgetError("host arena: cannot allocate " + FormatBytes(bytes) +
                            ": larger than the whole arena (" + FormatBytes(size_) +
                            "); raise strata.host_budget");
  }
  uint64_t need = RoundUp(bytes, kHostBlockAlignment);
  std::lock_guard<std::mutex> lock(mu_);
  // Best fit: the smallest free range that holds the block, at its start.
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    if (best == free_.end() || it->second < best->second) best = it;
  }
  if (best == free_.end()) {
    uint64_t largest = 0;
    for (const auto& [off, len] : free_) largest = std::max(largest, len);
    std::ostringstream msg;
    msg << "host arena: cannot allocate " << FormatBytes(bytes) << ": arena " << FormatBytes(size_) << ", "
        << FormatBytes(allocated_) << " allocated, largest free block " << FormatBytes(largest)
        << "; free or evict host blocks first, or raise strata.host_budget";
    return OutOfBudgetError(msg.str());
  }
  const uint64_t best_start = best->first, range_len = best->second;
  free_.erase(best);
  if (need < range_len) free_.emplace(best_start + need, range_len - need);
  used_.emplace(best_start, need);
  allocated_ += need;
  high_water_ = std::max(high_water_, allocated_);
  return HostBlock{static_cast<char*>(base_) + best_start, need, best_start};
}

void HostArena::Free(const HostBlock& block) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = used_.find(block.offset);
  STRATA_CHECK_MSG(
      it != used_.end() && it->second == block.size && block.data == static_cast<char*>(base_) + block.offset,
      "HostArena::Free of a block that is not allocated from this arena (double free?)");
  uint64_t off = it->first, len = it->second;
  used_.erase(it);
  allocated_ -= len;
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(off, len);
}

uint64_t HostArena::allocated() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_;
}

uint64_t HostArena::high_water() const {
  std::lock_guard<std::mutex> lock(mu_);
  return high_water_;
}

uint64_t HostArena::largest_free() const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t largest = 0;
  for (const auto& [off, len] : free_) largest = std::max(largest, len);
  return largest;
}

bool HostArena::Contains(const void* p, uint64_t bytes) const {
  auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base_);
  return a >= b && a - b <= size_ && bytes <= size_ - (a - b);
}

}  // namespace strata
