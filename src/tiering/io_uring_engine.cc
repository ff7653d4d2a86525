// The io_uring backend (with io_uring_probe.cc, the only files that include liburing.h). One ring per I/O
// thread; the thread owns its ring: it moves queued pieces into SQEs (at most
// queue_depth in flight), submits them (large pieces one per io_uring_enter, so the
// block layer does not merge them; see PrepPending), and checks every CQE. Submitters
// wake it through an eventfd that the ring itself reads. Completion callbacks run after
// the reaped batch's refills are submitted, so a slow callback (checksumming) does not
// leave the device without work.
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "strata/log.h"
#include "tiering/io_fault.h"
#include "tiering/io_files.h"
#include "tiering/io_state.h"

namespace strata::detail {
namespace {

constexpr uint64_t kWakeTag = ~0ull;
// Pieces this large are submitted without a block plug (see PrepPending). At 256 KiB an
// enter per piece is under 15k syscalls/s at 3.5 GB/s, a few percent of a core.
constexpr uint32_t kAlonePieceBytes = 256u << 10;

struct Ring {
  io_uring ring{};
  bool ring_ok = false;
  int efd = -1;
  uint64_t efd_value = 0;  // target of the eventfd read
  std::mutex mu;
  std::deque<IoPiece> incoming;  // guarded by mu
  bool stop = false;             // guarded by mu
  std::thread thread;
  // Owned by the ring's thread. Queued pieces by IoPriority: urgent ones go first.
  std::deque<IoPiece> pending[2];
  std::vector<IoPiece> slots;
  std::vector<uint32_t> free_slots;
  bool wake_armed = false;
};

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const IoEngineOptions& o) : IoEngine(o) {}

  ~UringEngine() override {
    for (auto& r : rings_) {
      if (!r->thread.joinable()) continue;
      {
        std::lock_guard<std::mutex> lock(r->mu);
        r->stop = true;
      }
      Wake(*r);
      r->thread.join();
    }
    for (auto& r : rings_) {
      if (r->ring_ok) io_uring_queue_exit(&r->ring);
      if (r->efd >= 0) ::close(r->efd);
    }
  }

  Status Init() {
    const unsigned entries = static_cast<unsigned>(options_.queue_depth) + 8;
    for (int i = 0; i < options_.threads; ++i) {
      auto r = std::make_unique<Ring>();
      io_uring_params p{};
      if (options_.sqpoll) {
        p.flags |= IORING_SETUP_SQPOLL;
        p.sq_thread_idle = 2000;
      }
      int ret = io_uring_queue_init_params(entries, &r->ring, &p);
      if (ret < 0) {
        rings_.push_back(std::move(r));
        return ErrnoError(-ret, std::string("io_uring_queue_init") + (options_.sqpoll ? " (SQPOLL)" : ""));
      }
      r->ring_ok = true;
      r->efd = ::eventfd(0, EFD_CLOEXEC);
      if (r->efd < 0) {
        int err = errno;
        rings_.push_back(std::move(r));
        return ErrnoError(err, "eventfd");
      }
      if (i == 0) {
        fixed_files_ = io_uring_register_files_sparse(&r->ring, FileTable::kMaxFiles) == 0;
      } else if (fixed_files_ && io_uring_register_files_sparse(&r->ring, FileTable::kMaxFiles) != 0) {
        rings_.push_back(std::move(r));
        return InternalError("io_uring: registering the file table failed on ring " + std::to_string(i));
      }
      r->slots.resize(options_.queue_depth);
      for (int s = options_.queue_depth - 1; s >= 0; --s) r->free_slots.push_back(static_cast<uint32_t>(s));
      rings_.push_back(std::move(r));
    }
    if (!fixed_files_) {
      STRATA_LOG(kWarn, "io") << "io_uring: registered files unavailable; using plain fds";
    }
    for (auto& r : rings_) {
      Ring* rp = r.get();
      rp->thread = std::thread([this, rp] { Run(*rp); });
    }
    return OkStatus();
  }

  std::string_view backend_name() const override { return "io_uring"; }

  Result<int> RegisterFile(const std::string& path, bool create) override {
    int fd = -1;
    STRATA_ASSIGN_OR_RETURN(int id, files_.Open(path, create, &fd));
    Status s = RegisterInRings(id, fd);
    if (!s.ok()) {
      files_.Release(id).IgnoreError();  // just opened: nothing in flight
      return s.WithContext("registering " + path);
    }
    return id;
  }

  Result<int> RegisterFd(int fd, const std::string& name) override {
    STRATA_ASSIGN_OR_RETURN(int id, files_.Adopt(fd, name));
    Status s = RegisterInRings(id, fd);
    if (!s.ok()) {
      files_.Release(id).IgnoreError();  // just adopted: nothing in flight
      return s.WithContext("registering " + name);
    }
    return id;
  }

  Status UnregisterFile(int file) override {
    std::atomic<int>* inflight = files_.inflight(file);
    if (inflight == nullptr) return InvalidArgumentError("IoEngine: unknown file id " + std::to_string(file));
    if (inflight->load() != 0) return files_.Release(file);  // reports the in-flight count
    STRATA_RETURN_IF_ERROR(RegisterInRings(file, -1));
    return files_.Release(file);
  }

  std::string FileName(int file) const override { return files_.name(file); }

  Status RegisterBuffers(std::span<const IoBufferRegion> regions) override {
    std::lock_guard<std::mutex> lock(reg_mu_);
    if (outstanding_.load() != 0) {
      return FailedPreconditionError("IoEngine::RegisterBuffers with " + std::to_string(outstanding_.load()) +
                                     " pieces in flight; wait for them first");
    }
    for (auto& r : rings_) {
      if (!iovecs_.empty()) io_uring_unregister_buffers(&r->ring);
    }
    iovecs_.clear();
    std::vector<iovec> v;
    for (const IoBufferRegion& reg : regions) {
      // The kernel limits one registered buffer to 1 GiB.
      for (uint64_t off = 0; off < reg.size; off += (1ull << 30)) {
        v.push_back(
            iovec{static_cast<char*>(reg.base) + off, std::min<uint64_t>(1ull << 30, reg.size - off)});
      }
    }
    std::sort(v.begin(), v.end(), [](const iovec& a, const iovec& b) { return a.iov_base < b.iov_base; });
    if (v.empty()) return OkStatus();
    for (size_t i = 0; i < rings_.size(); ++i) {
      int ret = io_uring_register_buffers(&rings_[i]->ring, v.data(), static_cast<unsigned>(v.size()));
      if (ret < 0) {
        for (size_t j = 0; j < i; ++j) io_uring_unregister_buffers(&rings_[j]->ring);
        return ErrnoError(-ret, "io_uring_register_buffers (" + std::to_string(v.size()) +
                                    " regions; a memlock limit (ulimit -l) may be too low)")
            .WithContext("I/O continues without fixed buffers");
      }
    }
    iovecs_ = std::move(v);
    return OkStatus();
  }

 protected:
  void SubmitValidated(std::span<const IoRequest> requests, std::shared_ptr<IoState> state) override {
    const uint64_t bs = options_.block_size;
    const size_t nrings = rings_.size();
    // Pieces go round-robin over the rings so one large request uses all of them.
    std::vector<std::deque<IoPiece>> per_ring(nrings);
    size_t next = rr_.fetch_add(1) % nrings;
    uint64_t npieces = 0;
    ForEachPiece(requests, state.get(), bs, [&](const IoPiece& p) {
      per_ring[next].push_back(p);
      next = (next + 1) % nrings;
      ++npieces;
    });
    outstanding_.fetch_add(npieces);
    for (size_t k = 0; k < nrings; ++k) {
      if (per_ring[k].empty()) continue;
      Ring& r = *rings_[k];
      {
        std::lock_guard<std::mutex> lock(r.mu);
        for (IoPiece& p : per_ring[k]) r.incoming.push_back(p);
      }
      Wake(r);
    }
  }

  std::atomic<int>* FileInflight(int file) override { return files_.inflight(file); }

 private:
  static void Wake(Ring& r) {
    uint64_t one = 1;
    // A full eventfd counter (EAGAIN) already means "wake up"; nothing else can fail here.
    ssize_t n = ::write(r.efd, &one, sizeof(one));
    (void)n;
  }

  Status RegisterInRings(int id, int fd) {
    if (!fixed_files_) return OkStatus();
    for (auto& r : rings_) {
      int ret = io_uring_register_files_update(&r->ring, static_cast<unsigned>(id), &fd, 1);
      if (ret < 0) return ErrnoError(-ret, "io_uring_register_files_update");
    }
    return OkStatus();
  }

  // The registered buffer that holds `buf` (-1: none), and how many of the `len` bytes
  // from `buf` lie in it.
  std::pair<int, uint32_t> FindBuffer(const char* buf, uint32_t len) const {
    auto it = std::upper_bound(iovecs_.begin(), iovecs_.end(), buf, [](const char* b, const iovec& v) {
      return b < static_cast<const char*>(v.iov_base);
    });
    if (it == iovecs_.begin()) return {-1, len};
    --it;
    const char* end = static_cast<const char*>(it->iov_base) + it->iov_len;
    if (buf >= end) return {-1, len};
    return {static_cast<int>(it - iovecs_.begin()),
            static_cast<uint32_t>(std::min<uint64_t>(len, end - buf))};
  }

  void Prep(io_uring_sqe* sqe, IoPiece& p, uint32_t slot) {
    char* buf = p.buffer + p.done;
    uint32_t len = p.length - p.done;
    const uint64_t off = p.offset + p.done;
    const int fd = fixed_files_ ? p.file : files_.fd(p.file);
    // A piece over the end of a registered buffer (a host block across one of the
    // arena's 1 GiB registrations) goes in two fixed transfers: up to the end now, the
    // rest as the remainder of a short one.
    const auto [bidx, in_buffer] = FindBuffer(buf, len);
    p.cut_at_buffer_end = in_buffer < len;
    len = in_buffer;
    if (p.op == IoOp::kRead) {
      if (bidx >= 0)
        io_uring_prep_read_fixed(sqe, fd, buf, len, off, bidx);
      else
        io_uring_prep_read(sqe, fd, buf, len, off);
    } else {
      if (bidx >= 0)
        io_uring_prep_write_fixed(sqe, fd, buf, len, off, bidx);
      else
        io_uring_prep_write(sqe, fd, buf, len, off);
    }
    if (fixed_files_) sqe->flags |= IOSQE_FIXED_FILE;
    if (bidx >= 0) counters_.fixed_pieces.fetch_add(1, std::memory_order_relaxed);
    io_uring_sqe_set_data64(sqe, slot);
  }

  static bool HasPending(const Ring& r) { return !r.pending[0].empty() || !r.pending[1].empty(); }

  // Moves submitted pieces into the ring's pending queue; returns whether stop was asked.
  static bool TakeIncoming(Ring& r) {
    std::lock_guard<std::mutex> lock(r.mu);
    while (!r.incoming.empty()) {
      const IoPiece& p = r.incoming.front();
      r.pending[static_cast<int>(p.priority)].push_back(p);
      r.incoming.pop_front();
    }
    return r.stop;
  }

  // Fills free slots with pending pieces; returns how many SQEs were prepared. A piece
  // of kAlonePieceBytes or more joins an SQ holding at most one other entry and ends the
  // batch, so every io_uring_enter that carries one submits at most two SQEs: io_uring
  // plugs the block queue only for batches of three or more, and a plug merges adjacent
  // pieces into requests of up to max_sectors_kb. On the virtio disk that cut 32 reads
  // of 1 MiB to about eight of 4 MiB in flight and cost 15-20% of read bandwidth (fio,
  // one SQE per enter by default, is never merged). Small pieces stay batched: for them
  // the syscall per piece would cost more, and merging helps.
  unsigned PrepPending(Ring& r) {
    unsigned prepared = 0;
    while (!r.free_slots.empty() && HasPending(r)) {
      std::deque<IoPiece>& queue = r.pending[1].empty() ? r.pending[0] : r.pending[1];
      const IoPiece& next = queue.front();
      const bool alone = next.length - next.done >= kAlonePieceBytes;
      if (alone && io_uring_sq_ready(&r.ring) > 1) break;
      io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
      if (sqe == nullptr) break;
      uint32_t slot = r.free_slots.back();
      r.free_slots.pop_back();
      r.slots[slot] = next;
      queue.pop_front();
      Prep(sqe, r.slots[slot], slot);
      ++prepared;
      if (alone) break;
    }
    if (prepared) {
      counters_.submits.fetch_add(1, std::memory_order_relaxed);
      counters_.pieces.fetch_add(prepared, std::memory_order_relaxed);
    }
    return prepared;
  }

  // Submits prepared SQEs, waiting for `wait` completions. EINTR, EAGAIN and EBUSY leave
  // the SQEs queued for the next call; anything else is a broken ring.
  static int Enter(Ring& r, unsigned wait) {
    int ret = io_uring_submit_and_wait(&r.ring, wait);
    STRATA_CHECK_MSG(ret >= 0 || ret == -EINTR || ret == -EAGAIN || ret == -EBUSY,
                     "io_uring_submit_and_wait failed: errno " + std::to_string(-ret));
    return ret;
  }

  // Prepares and submits pending pieces until the slots, the queue or the SQ run out;
  // several enters when large pieces go one at a time (PrepPending).
  void SubmitPending(Ring& r) {
    for (;;) {
      PrepPending(r);
      if (io_uring_sq_ready(&r.ring) == 0) return;
      if (Enter(r, 0) <= 0) return;
    }
  }

  void Run(Ring& r) {
    std::vector<std::pair<IoPiece, Status>> finished;
    for (;;) {
      const bool stopping = TakeIncoming(r);
      if (!r.wake_armed) {
        io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
        STRATA_CHECK(sqe != nullptr);  // the ring has 8 spare entries beyond queue_depth
        io_uring_prep_read(sqe, r.efd, &r.efd_value, sizeof(r.efd_value), 0);
        io_uring_sqe_set_data64(sqe, kWakeTag);
        r.wake_armed = true;
      }
      SubmitPending(r);
      const bool idle = r.free_slots.size() == r.slots.size() && !HasPending(r);
      if (stopping && idle) return;  // incoming was drained above, after stop was seen
      Enter(r, 1);
      unsigned head;
      unsigned seen = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(&r.ring, head, cqe) {
        ++seen;
        HandleCqe(r, io_uring_cqe_get_data64(cqe), cqe->res, finished);
      }
      io_uring_cq_advance(&r.ring, seen);
      // Retries and queued pieces go to the device before the callbacks run: a callback
      // may be slow (NvmeStore hashes the data), and the device should not idle meanwhile.
      if (!finished.empty()) SubmitPending(r);
      for (auto& [piece, status] : finished) {
        CompletePiece(piece, status);
        // Requests the callback's owner submitted in response (a refill) start now, not
        // after the rest of the batch's callbacks.
        TakeIncoming(r);
        SubmitPending(r);
      }
      finished.clear();
    }
  }

  void HandleCqe(Ring& r, uint64_t tag, int res, std::vector<std::pair<IoPiece, Status>>& finished) {
    if (tag == kWakeTag) {
      r.wake_armed = false;
      return;
    }
    IoPiece& p = r.slots[tag];
    int64_t result = res;
    if (options_.fault_hook) {
      result = options_.fault_hook->OnResult(
          IoFaultPoint{p.op, p.file, p.offset + p.done, static_cast<uint64_t>(p.length - p.done)}, result);
    }
    PieceOutcome out = CheckPieceResult(p, result, files_);
    IoPiece piece = p;
    r.free_slots.push_back(static_cast<uint32_t>(tag));
    if (out.step == PieceStep::kResubmit) {
      if (out.short_retry && !piece.cut_at_buffer_end)
        counters_.short_retries.fetch_add(1, std::memory_order_relaxed);
      if (out.again_retry) counters_.again_retries.fetch_add(1, std::memory_order_relaxed);
      r.pending[static_cast<int>(piece.priority)].push_front(piece);
      return;
    }
    outstanding_.fetch_sub(1, std::memory_order_relaxed);
    finished.emplace_back(piece, out.step == PieceStep::kDone ? OkStatus() : out.status);
  }

  std::vector<std::unique_ptr<Ring>> rings_;
  FileTable files_;
  bool fixed_files_ = false;
  std::mutex reg_mu_;
  std::vector<iovec> iovecs_;  // sorted by base; changed only with nothing in flight
  std::atomic<uint64_t> outstanding_{0};
  std::atomic<uint64_t> rr_{0};
};

}  // namespace

Result<std::unique_ptr<IoEngine>> CreateUringEngine(const IoEngineOptions& options) {
  auto engine = std::make_unique<UringEngine>(options);
  STRATA_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace strata::detail
