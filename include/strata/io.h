// IoEngine: asynchronous O_DIRECT reads and writes of (file, offset, length, buffer).
//
// Two backends behind one interface:
//   io_uring  one ring per I/O thread, batched submission, registered (fixed) buffers and
//             registered files, optional SQPOLL.
//   psync     pread/pwrite on a pool of threads; chosen automatically (with a warning)
//             where the kernel refuses io_uring (ENOSYS, EPERM under seccomp), or by
//             config (strata.io_backend = "psync") for tests.
//
// Contract:
//  - Alignment is checked up front, before anything is queued: offset, length and the
//    buffer address must be multiples of IoEngineOptions::alignment (4096 by default);
//    a violation is InvalidArgument naming the value and the required alignment.
//    Length 0 is InvalidArgument.
//  - A request larger than block_size is split into block_size pieces; each ring keeps
//    up to queue_depth pieces in flight. Requests are queued without limit; the engine
//    owns no data buffers (no bounce buffer, no allocation per piece).
//  - Every completion is checked: a short transfer is resubmitted for the remainder,
//    -EAGAIN and -EINTR are retried (a bounded number of times, then IoError), a read
//    that hits end of file is IoError ("unexpected end of file"), any other error is the
//    errno's Status (IoError, or ResourceExhausted for ENOSPC) naming errno text, file,
//    offset and length.
//  - A request completes exactly once: its handle's Wait() returns OK when every byte
//    was transferred, else the first failure of any of its pieces. A request whose piece
//    failed still waits for its other pieces before completing (no piece is left
//    writing into a buffer the caller believes free).
//  - Ownership: the caller owns buffers and must keep them valid and untouched until the
//    request completes. Registered files are owned by the engine (closed by it) when
//    registered by path, by the caller when registered by fd.
//  - Threads: every method may be called from any thread. Completion callbacks run on an
//    engine thread: they must be short and must not block on this engine's handles.
//  - Destruction waits for every queued request to complete.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/config.h"
#include "strata/status.h"

namespace strata {

class IoFaultHook;  // test-only fault injection, src/tiering/io_fault.h

struct IoEngineOptions {
  IoBackendKind backend = IoBackendKind::kAuto;
  uint64_t block_size = 1 << 20;  // largest piece submitted to the kernel
  int queue_depth = 32;           // pieces in flight per ring (psync: per thread pool)
  int threads = 1;                // I/O threads, one ring each (psync: pool of queue_depth x threads, capped)
  bool sqpoll = false;            // io_uring only: kernel submission-polling thread per ring
  uint64_t alignment = 4096;      // O_DIRECT alignment of offset, length and buffer address
  // Test only: rewrites results before the engine checks them (EIO, ENOSPC, short, EAGAIN).
  std::shared_ptr<IoFaultHook> fault_hook;

  // From a parsed config: aio.block_size, aio.queue_depth, aio.intra_op_parallelism,
  // strata.io_backend, strata.io_sqpoll.
  static IoEngineOptions FromConfig(const Config& config);
};

// What the kernel says about io_uring here (for `strata info` and the auto backend).
struct IoUringProbe {
  bool usable = false;                // a ring could be created and a no-op completed
  std::string reason;                 // why not, when !usable (errno text), else empty
  std::string kernel;                 // uname -r
  std::vector<std::string> features;  // e.g. "fixed-buffers", "registered-files", "sqpoll"
  bool sqpoll = false;                // a SQPOLL ring could be created
};
// Creates a throwaway ring; cheap (about a millisecond). Thread-safe.
IoUringProbe ProbeIoUring();

enum class IoOp { kRead, kWrite };

// Urgent pieces go to the device before the queued normal pieces of their ring (never
// ahead of pieces already in flight); within a class, pieces keep submission order. For
// reads someone is blocked on (a parameter shard the next module needs) while reads
// ahead and writes behind fill the queue. psync serves urgent pieces first too.
enum class IoPriority { kNormal, kUrgent };

struct IoRequest {
  IoOp op = IoOp::kRead;
  int file = -1;        // id from RegisterFile/RegisterFd
  uint64_t offset = 0;  // bytes into the file
  uint64_t length = 0;  // bytes
  void* buffer = nullptr;
  IoPriority priority = IoPriority::kNormal;
};

namespace detail {
struct IoState;  // shared completion state of one submission
}

// Completion handle of one submission (one request, or one batch). Copyable; copies
// refer to the same completion. Wait()/Poll() may be called from any thread, any number
// of times.
class IoHandle {
 public:
  IoHandle() = default;
  explicit IoHandle(std::shared_ptr<detail::IoState> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  // True once every request of the submission has completed (success or failure).
  bool Poll() const;
  // Blocks until completion; returns OK or the first failure. An empty handle is
  // FailedPrecondition.
  Status Wait() const;
  // Bytes transferred by completed pieces so far.
  uint64_t bytes_done() const;

 private:
  std::shared_ptr<detail::IoState> state_;
};

// Called once per request of a submission when that request completes, on an engine
// thread, before the handle completes. `index` is the request's position in the batch,
// `status` the request's outcome. Returning a failure (e.g. Corruption from a checksum
// check on the completion path) when `status` was OK fails the request and the handle
// with it; the return value is ignored when `status` already failed.
using IoRequestCallback = std::function<Status(size_t index, const Status& status)>;

struct IoBufferRegion {
  void* base = nullptr;
  uint64_t size = 0;
};

struct IoEngineStats {
  uint64_t requests = 0;       // requests completed
  uint64_t pieces = 0;         // pieces submitted to the kernel (or to pread/pwrite)
  uint64_t submits = 0;        // io_uring_submit calls (psync: 0)
  uint64_t short_retries = 0;  // remainders resubmitted after short transfers (not the
                               // second half of a piece across two fixed buffers)
  uint64_t again_retries = 0;  // -EAGAIN/-EINTR retries
  uint64_t fixed_pieces = 0;   // pieces that used a registered buffer
};

class IoEngine {
 public:
  // Builds the backend named by options.backend; kAuto tries io_uring and falls back to
  // psync with a warning when the kernel refuses it. io_uring requested explicitly and
  // refused is Unavailable. Bad options are InvalidArgument naming the option.
  static Result<std::unique_ptr<IoEngine>> Create(const IoEngineOptions& options);

  virtual ~IoEngine() = default;
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  // "io_uring" or "psync".
  virtual std::string_view backend_name() const = 0;
  const IoEngineOptions& options() const { return options_; }

  // Opens `path` with O_DIRECT (read-write; created when `create`) and registers it.
  // Returns the file id used in IoRequest. NotFound / Unavailable / IoError naming path.
  virtual Result<int> RegisterFile(const std::string& path, bool create) = 0;
  // Registers an fd the caller opened (with O_DIRECT) and keeps owning. `name` is used
  // in error messages.
  virtual Result<int> RegisterFd(int fd, const std::string& name) = 0;
  // Forgets a file (closing it when registered by path). No request on it may be in
  // flight (FailedPrecondition otherwise).
  virtual Status UnregisterFile(int file) = 0;
  // The name given at registration, "" for an unknown id.
  virtual std::string FileName(int file) const = 0;

  // Registers pinned regions (e.g. the host arena) so that pieces inside them use fixed
  // buffers (io_uring); replaces earlier registrations. A region of any size is taken
  // (io_uring registers it as buffers of at most 1 GiB, and a piece across two of them
  // goes as two fixed transfers). Must be called with no request
  // in flight (FailedPrecondition). Regions stay owned by the caller and must outlive
  // the registration (until the next RegisterBuffers or destruction). Failure (e.g.
  // memlock limit) leaves the engine working without fixed buffers. psync: no-op.
  virtual Status RegisterBuffers(std::span<const IoBufferRegion> regions) = 0;

  // Submits requests as one batch (one kernel submit per ring for the batch). All
  // requests are validated first: any invalid one rejects the whole batch with nothing
  // queued. The handle completes when every request has. `on_request_done`, if set, is
  // called once per request (see IoRequestCallback).
  Result<IoHandle> Submit(std::span<const IoRequest> requests, IoRequestCallback on_request_done = nullptr);
  Result<IoHandle> Read(int file, uint64_t offset, uint64_t length, void* buffer);
  Result<IoHandle> Write(int file, uint64_t offset, uint64_t length, const void* buffer);

  IoEngineStats stats() const;

 protected:
  explicit IoEngine(const IoEngineOptions& options) : options_(options) {}
  // Backend: queue validated requests; completion is reported through `state`.
  virtual void SubmitValidated(std::span<const IoRequest> requests,
                               std::shared_ptr<detail::IoState> state) = 0;
  // In-flight request counter of a registered file, nullptr when `file` is unknown.
  virtual std::atomic<int>* FileInflight(int file) = 0;

  IoEngineOptions options_;
  struct Counters {
    std::atomic<uint64_t> requests{0}, pieces{0}, submits{0}, short_retries{0}, again_retries{0},
        fixed_pieces{0};
  };
  mutable Counters counters_;
};

}  // namespace strata
