// NvmeStore: slot allocation, RAID-0 striping of slots over swap files, and per-segment
// XXH3 checksums computed and verified on the engine's completion path.
#include "strata/nvme_store.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "strata/log.h"
#include "strata/units.h"
#include "tiering/nvme_store_files.h"

namespace strata {

struct NvmeStore::Impl {
  struct SlotMeta {
    bool allocated = false;
    std::atomic<bool> valid{false};  // last write completed with every byte and checksum
    uint64_t written = 0;
    uint64_t prefix = 0;  // the last Write's `prefix`: a Read may stop there
    std::atomic<uint32_t> segs_left{0};
    std::atomic<bool> write_failed{false};
  };
  struct Segment {
    int file;         // index into files / file_ids
    uint64_t offset;  // in that file
    uint64_t length;
    uint64_t in_slot;  // offset inside the slot
  };

  IoEngine* engine = nullptr;
  NvmeStoreOptions opt;
  uint64_t slot_size = 0, stripe = 0, file_size = 0;
  uint32_t max_segs = 0;
  detail::SwapDirs dirs;
  std::vector<int> fds, file_ids;
  std::mutex mu;
  std::vector<SlotId> free_list;  // guarded by mu
  std::unique_ptr<SlotMeta[]> meta;
  std::unique_ptr<uint64_t[]> sums;  // [slot * max_segs + segment]
  std::atomic<int64_t> inflight{0};
  bool closed = false;

  // Splits [slot start, + length) at stripe boundaries and at `cut` bytes into the slot
  // (0: none), which is where a prefix read ends (Write's `prefix`).
  void Segments(SlotId slot, uint64_t length, uint64_t cut, std::vector<Segment>& out) const {
    const uint64_t n = file_ids.size();
    uint64_t a = uint64_t(slot) * slot_size;
    const uint64_t end = a + length;
    const uint64_t cut_at = cut > 0 && cut < length ? a + cut : end;
    while (a < end) {
      uint64_t s = a / stripe;
      uint64_t b = std::min(end, (s + 1) * stripe);
      if (a < cut_at) b = std::min(b, cut_at);
      out.push_back(
          Segment{int(s % n), (s / n) * stripe + a % stripe, b - a, a - uint64_t(slot) * slot_size});
      a = b;
    }
  }

  // CheckSlot, and the slot holds a complete write.
  Status CheckReadable(SlotId slot, const char* op) {
    {
      std::lock_guard<std::mutex> lock(mu);
      STRATA_RETURN_IF_ERROR(CheckSlot(slot, op));
    }
    if (!meta[slot].valid) {
      return FailedPreconditionError(std::string("NvmeStore::") + op + ": slot " + std::to_string(slot) +
                                     " holds no complete data (never written, or its last write failed)");
    }
    return OkStatus();
  }

  // Reads `segs` (segment `first_index` of the write onward) into `buffer`, which holds
  // the slot's bytes at their offsets in it; each segment's checksum is verified as it
  // lands.
  Result<IoHandle> SubmitRead(SlotId slot, char* buffer, std::vector<Segment> segs, size_t first_index,
                              IoPriority priority);

  Status CheckSlot(SlotId slot, const char* op) const {
    if (closed) return FailedPreconditionError(std::string("NvmeStore::") + op + " after Close");
    if (slot >= opt.slot_count || !meta[slot].allocated) {
      return FailedPreconditionError(std::string("NvmeStore::") + op + ": slot " + std::to_string(slot) +
                                     " is not allocated");
    }
    return OkStatus();
  }
};

NvmeStore::NvmeStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

NvmeStore::~NvmeStore() {
  Status s = Close();
  if (!s.ok()) {
    STRATA_LOG(kWarn, "nvme") << s.ToString();
  }
}

namespace {

Status ZeroFill(IoEngine& engine, const std::vector<int>& ids, uint64_t file_size) {
  const uint64_t chunk = std::min<uint64_t>(engine.options().block_size * 8, file_size);
  void* zeros = std::aligned_alloc(engine.options().alignment, chunk);
  if (zeros == nullptr) return ResourceExhaustedError("NvmeStore: no memory for the zero-fill buffer");
  std::memset(zeros, 0, chunk);
  std::vector<IoRequest> reqs;
  for (int id : ids) {
    for (uint64_t off = 0; off < file_size; off += chunk) {
      reqs.push_back({IoOp::kWrite, id, off, std::min(chunk, file_size - off), zeros});
    }
  }
  Status s;
  auto h = engine.Submit(reqs);
  s = h.ok() ? h->Wait() : h.status();
  std::free(zeros);
  return s.WithContext("zero-filling the swap files");
}

}  // namespace

Result<std::unique_ptr<NvmeStore>> NvmeStore::Open(IoEngine& engine, const NvmeStoreOptions& o) {
  const uint64_t align = engine.options().alignment;
  if (o.paths.empty())
    return InvalidArgumentError("NvmeStore: no swap path given (zero_optimization.*.nvme_path)");
  if (o.slot_size == 0 || o.slot_count == 0) {
    return InvalidArgumentError("NvmeStore: slot_size and slot_count must be positive (got " +
                                std::to_string(o.slot_size) + ", " + std::to_string(o.slot_count) + ")");
  }
  if (o.slot_count > (1ull << 31))
    return InvalidArgumentError("NvmeStore: slot_count " + std::to_string(o.slot_count) + " too large");
  auto impl = std::make_unique<Impl>();
  impl->engine = &engine;
  impl->opt = o;
  impl->slot_size = (o.slot_size + align - 1) / align * align;
  impl->stripe = o.stripe_size ? o.stripe_size : engine.options().block_size;
  if (impl->stripe % align != 0) {
    return InvalidArgumentError("NvmeStore: stripe_size " + std::to_string(impl->stripe) +
                                " is not a multiple of the O_DIRECT alignment " + std::to_string(align));
  }
  const uint64_t n = o.paths.size();
  const uint64_t total = impl->slot_size * o.slot_count;
  const uint64_t stripes = (total + impl->stripe - 1) / impl->stripe;
  impl->file_size = (stripes + n - 1) / n * impl->stripe;
  impl->max_segs =
      static_cast<uint32_t>(impl->slot_size / impl->stripe + 3);  // + an unaligned start, a prefix cut

  STRATA_RETURN_IF_ERROR(impl->dirs.Acquire(o.paths, o.name));
  // On failure below, impl's destructor releases the directories and removes the files.
  std::unique_ptr<NvmeStore> store(new NvmeStore(std::move(impl)));
  Impl& m = *store->impl_;
  for (const std::string& path : m.dirs.swap_files()) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoError(errno, "creating swap file " + path + " (O_DIRECT)");
    m.fds.push_back(fd);
    STRATA_RETURN_IF_ERROR(detail::PreallocateSwap(fd, path, m.file_size));
    STRATA_ASSIGN_OR_RETURN(int id, engine.RegisterFd(fd, path));
    m.file_ids.push_back(id);
  }
  // Metadata after the disk check, so an impossible size fails on space, not memory.
  m.meta = std::make_unique<Impl::SlotMeta[]>(o.slot_count);
  if (o.checksum) m.sums = std::make_unique<uint64_t[]>(o.slot_count * m.max_segs);
  for (uint64_t i = o.slot_count; i > 0; --i) m.free_list.push_back(static_cast<SlotId>(i - 1));
  if (o.prepare == SwapPrepare::kZeroFill) STRATA_RETURN_IF_ERROR(ZeroFill(engine, m.file_ids, m.file_size));
  STRATA_LOG(kInfo, "nvme") << "swap: " << o.slot_count << " slots of " << FormatBytes(m.slot_size)
                            << " over " << n << " file(s) of " << FormatBytes(m.file_size) << ", stripe "
                            << FormatBytes(m.stripe) << ", checksums " << (o.checksum ? "on" : "off");
  return store;
}

Result<SlotId> NvmeStore::Allocate() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.closed) return FailedPreconditionError("NvmeStore::Allocate after Close");
  if (m.free_list.empty()) {
    return OutOfBudgetError("NvmeStore: all " + std::to_string(m.opt.slot_count) + " slots of " +
                            FormatBytes(m.slot_size) + " are in use; raise the NVMe budget");
  }
  SlotId s = m.free_list.back();
  m.free_list.pop_back();
  m.meta[s].allocated = true;
  m.meta[s].valid = false;
  m.meta[s].written = 0;
  return s;
}

Status NvmeStore::Free(SlotId slot) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  STRATA_RETURN_IF_ERROR(m.CheckSlot(slot, "Free"));
  m.meta[slot].allocated = false;
  m.meta[slot].valid = false;
  m.free_list.push_back(slot);
  return OkStatus();
}

Result<IoHandle> NvmeStore::Write(SlotId slot, const void* buffer, uint64_t length, uint64_t prefix) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    STRATA_RETURN_IF_ERROR(m.CheckSlot(slot, "Write"));
  }
  if (length == 0 || length > m.slot_size) {
    return InvalidArgumentError("NvmeStore::Write: length " + std::to_string(length) + " must be in 1.." +
                                std::to_string(m.slot_size) + " (the slot size)");
  }
  const uint64_t align = m.engine->options().alignment;
  if (prefix >= length || prefix % align != 0) {
    return InvalidArgumentError("NvmeStore::Write: prefix " + std::to_string(prefix) +
                                " must be 0 or a multiple of " + std::to_string(align) +
                                " below the length " + std::to_string(length));
  }
  std::vector<Impl::Segment> segs;
  m.Segments(slot, length, prefix, segs);
  std::vector<IoRequest> reqs;
  reqs.reserve(segs.size());
  for (const auto& s : segs) {
    reqs.push_back({IoOp::kWrite, m.file_ids[s.file], s.offset, s.length,
                    const_cast<char*>(static_cast<const char*>(buffer)) + s.in_slot});
  }
  Impl::SlotMeta& meta = m.meta[slot];
  meta.valid = false;
  meta.written = length;
  meta.prefix = prefix;
  meta.write_failed = false;
  meta.segs_left = static_cast<uint32_t>(segs.size());
  uint64_t* sums = m.sums ? &m.sums[uint64_t(slot) * m.max_segs] : nullptr;
  auto* impl = &m;
  // Hashing after each segment's write overlaps it with the other segments' I/O; the
  // caller does not touch the buffer before the handle completes.
  auto cb = [impl, &meta, sums, reqs_copy = reqs](size_t i, const Status& st) -> Status {
    if (!st.ok())
      meta.write_failed = true;
    else if (sums)
      sums[i] = XXH3_64bits(reqs_copy[i].buffer, reqs_copy[i].length);
    if (meta.segs_left.fetch_sub(1) == 1) {
      meta.valid = !meta.write_failed.load();
      impl->inflight.fetch_sub(1);
    }
    return OkStatus();
  };
  m.inflight.fetch_add(1);
  Result<IoHandle> h = m.engine->Submit(reqs, std::move(cb));
  if (!h.ok()) m.inflight.fetch_sub(1);
  return h;
}

Result<IoHandle> NvmeStore::Impl::SubmitRead(SlotId slot, char* buffer, std::vector<Segment> segs,
                                             size_t first_index, IoPriority priority) {
  std::vector<IoRequest> reqs;
  reqs.reserve(segs.size());
  for (const auto& s : segs) {
    reqs.push_back({IoOp::kRead, file_ids[s.file], s.offset, s.length, buffer + s.in_slot, priority});
  }
  const uint64_t* slot_sums = sums ? &sums[uint64_t(slot) * max_segs + first_index] : nullptr;
  auto left = std::make_shared<std::atomic<uint32_t>>(static_cast<uint32_t>(segs.size()));
  auto cb = [this, slot_sums, slot, first_index, left, segs = std::move(segs), reqs_copy = reqs](
                size_t i, const Status& st) -> Status {
    Status verdict;
    if (st.ok() && slot_sums) {
      uint64_t h = XXH3_64bits(reqs_copy[i].buffer, reqs_copy[i].length);
      if (h != slot_sums[i]) {
        const auto& s = segs[i];
        verdict =
            CorruptionError("NvmeStore: checksum mismatch in slot " + std::to_string(slot) + ", segment " +
                            std::to_string(first_index + i) + " (" + dirs.swap_files()[s.file] + ", offset " +
                            std::to_string(s.offset) + ", " + std::to_string(s.length) +
                            " bytes): the swap file was modified or the device returned bad data");
      }
    }
    if (left->fetch_sub(1) == 1) inflight.fetch_sub(1);
    return verdict;
  };
  inflight.fetch_add(1);
  Result<IoHandle> h = engine->Submit(reqs, std::move(cb));
  if (!h.ok()) inflight.fetch_sub(1);
  return h;
}

Result<IoHandle> NvmeStore::Read(SlotId slot, void* buffer, uint64_t length, IoPriority priority) {
  Impl& m = *impl_;
  STRATA_RETURN_IF_ERROR(m.CheckReadable(slot, "Read"));
  const Impl::SlotMeta& meta = m.meta[slot];
  if (length != meta.written && (meta.prefix == 0 || length != meta.prefix)) {
    return InvalidArgumentError("NvmeStore::Read: slot " + std::to_string(slot) + " holds " +
                                std::to_string(meta.written) + " bytes" +
                                (meta.prefix ? " (or a prefix of " + std::to_string(meta.prefix) + ")" : "") +
                                "; asked for " + std::to_string(length));
  }
  std::vector<Impl::Segment> segs;
  // The write's cuts: the first segments of a prefix read are then the write's own.
  m.Segments(slot, length, meta.prefix, segs);
  return m.SubmitRead(slot, static_cast<char*>(buffer), std::move(segs), 0, priority);
}

Result<std::vector<NvmeStore::Range>> NvmeStore::ReadInRanges(SlotId slot, void* buffer, int ranges,
                                                              IoPriority priority) {
  Impl& m = *impl_;
  if (ranges < 1) {
    return InvalidArgumentError("NvmeStore::ReadInRanges: " + std::to_string(ranges) +
                                " ranges; give at least 1");
  }
  STRATA_RETURN_IF_ERROR(m.CheckReadable(slot, "ReadInRanges"));
  const Impl::SlotMeta& meta = m.meta[slot];
  std::vector<Impl::Segment> all;
  m.Segments(slot, meta.written, meta.prefix, all);
  const uint64_t target = (meta.written + ranges - 1) / ranges;
  std::vector<Range> out;
  size_t first = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const uint64_t end = all[i].in_slot + all[i].length;
    if (end < all[first].in_slot + target && i + 1 < all.size()) continue;
    Result<IoHandle> h =
        m.SubmitRead(slot, static_cast<char*>(buffer),
                     std::vector<Impl::Segment>(all.begin() + first, all.begin() + i + 1), first, priority);
    if (!h.ok()) {
      for (Range& r : out) r.read.Wait().IgnoreError();  // nothing in flight on `buffer` on return
      return h.status();
    }
    out.push_back({*h, all[first].in_slot, end - all[first].in_slot});
    first = i + 1;
  }
  return out;
}

Status NvmeStore::Close() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.closed) return OkStatus();
  if (m.inflight.load() != 0) {
    return FailedPreconditionError("NvmeStore::Close with " + std::to_string(m.inflight.load()) +
                                   " slot operations in flight; wait for them first");
  }
  m.closed = true;
  Status first;
  for (int id : m.file_ids) {
    Status s = m.engine->UnregisterFile(id);
    if (first.ok()) first = s;
  }
  for (int fd : m.fds) ::close(fd);
  m.fds.clear();
  m.file_ids.clear();
  Status s = m.dirs.Release();
  return first.ok() ? s : first;
}

uint64_t NvmeStore::slot_size() const { return impl_->slot_size; }
uint64_t NvmeStore::slot_count() const { return impl_->opt.slot_count; }
uint64_t NvmeStore::free_slots() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->free_list.size();
}
uint64_t NvmeStore::stripe_size() const { return impl_->stripe; }
bool NvmeStore::checksum() const { return impl_->opt.checksum; }
std::vector<std::string> NvmeStore::files() const { return impl_->dirs.swap_files(); }
uint64_t NvmeStore::file_size() const { return impl_->file_size; }

}  // namespace strata
