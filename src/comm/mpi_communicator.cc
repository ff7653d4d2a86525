#include "comm/mpi_communicator.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "comm/mpi_op.h"
#include "comm/mpi_util.h"
#include "strata/log.h"
#include "strata/units.h"

namespace strata::comm {
namespace {

// A collective Waited on within this long of its Submit counts as synchronous use.
// After one, the next Submit does not wake the worker: a 1 MiB all-gather over 2 ranks
// on a 2-core machine took 86 us instead of 71 us when every Submit woke it (the
// woken worker preempts a spinning rank, and when it wins the race to run the
// collective the waiter sleeps and needs a second wake-up; timed wake-ups of the
// worker every 100 us instead cost even more). A collective issued ahead and Waited
// on later is seen as such at its Wait (or Test), and from then on Submit wakes the
// worker again so that collectives progress while the caller computes. A woken worker
// still leaves a collective this young to its caller (WorkerLoop).
constexpr double kSyncWaitS = 50e-6;

void PrefetchLines(const void* p, size_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(c + i, 1);
}

bool SameOp(const OpDesc& a, const OpDesc& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.count == b.count && a.root == b.root;
}

Status CheckBuffers(const void* a, const void* b, size_t count, std::string_view op) {
  if (count > 0 && (a == nullptr || b == nullptr)) {
    return InvalidArgumentError(std::string(op) + ": null buffer with count " + std::to_string(count));
  }
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<MpiCommunicator>> MpiCommunicator::Create(MPI_Comm comm, const CommOptions& options) {
  if (!(options.collective_timeout_s > 0)) {
    return InvalidArgumentError("communicator '" + options.name + "': collective_timeout_s must be > 0");
  }
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int rank = 0, size = 0;
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  std::unique_ptr<MpiCommunicator> c(new MpiCommunicator(comm, rank, size, options));
  if (size > 1) {
    STRATA_RETURN_IF_ERROR(
        c->board_.Init(comm, options.one_node_per_rank).WithContext("communicator '" + options.name + "'"));
    STRATA_RETURN_IF_ERROR(c->notice_.Init(comm, &c->board_).WithContext("communicator '" + options.name + "'"));
    c->worker_ = std::thread([p = c.get()] { p->WorkerLoop(); });
  }
  return c;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int rank, int size, const CommOptions& options)
    : comm_(comm), rank_(rank), size_(size), options_(options) {
  ctx_.comm = comm;
  ctx_.rank = rank;
  ctx_.size = size;
  // Set once rather than per collective (two std::function writes per call).
  ctx_.on_deadline = [this] {
    return running_op_ != nullptr ? Watchdog(running_op_->seq, running_op_->What())
                                  : DeadlineExceededError("collective on '" + options_.name + "' timed out");
  };
  ctx_.on_peer_failure = [this]() -> Status {
    std::string failed = notice_.First();
    if (failed.empty()) return OkStatus();
    return AbortedError("collective " +
                        (running_op_ != nullptr ? "#" + std::to_string(running_op_->seq) + " " + running_op_->What()
                                                : std::string()) +
                        " on communicator '" + options_.name + "' (rank " + std::to_string(rank_) +
                        ") abandoned: " + failed + "; it joins no more collectives, end the job");
  };
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (!WorldInitialized()) return;  // destroyed after FinalizeWorld: MPI objects died with it
  board_.Free();
  notice_.Free();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

CommHandle MpiCommunicator::Submit(OpDesc desc, std::string label, std::function<Status(MpiContext&)> fn) {
  if (size_ == 1) {  // nothing to wait for: run inline, in issue order by construction
    ctx_.deadline_s = NowS() + options_.collective_timeout_s;
    ctx_.desc = &desc;
    return CommHandle::Done(fn(ctx_));
  }
  std::shared_ptr<Op> op;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The previous op is reused once nothing else refers to it (no handle, not queued,
    // not running): after a 1 MiB broadcast, its destruction and free() and the return
    // to the caller took ~1.1 us on caches the transfer had evicted, and allocating the
    // next op with its mutex and condition variable was part of Submit's ~1 us.
    if (spare_ != nullptr && spare_.use_count() == 1) {
      std::atomic_thread_fence(std::memory_order_acquire);  // after the last holder's release
      op = spare_;
      op->Reuse(desc, std::move(label), std::move(fn));
    } else {
      op = std::make_shared<Op>(this, desc, std::move(label), std::move(fn));
      spare_ = op;
    }
    op->seq = ++issued_;
    op->submitted_s = NowS();
    queue_.push_back(op);
    // The worker starts the collective if nobody Waits for it first, so that it
    // progresses while the caller computes; a runner drains what it finds. Under
    // synchronous use the caller's Wait runs it inline (see kSyncWaitS).
    wake = !running_ && !sync_use_;
    worker_deferred_ = !running_ && sync_use_;
  }
  if (wake) cv_.notify_one();
  return CommHandle(op);
}

bool MpiCommunicator::RunInline(const Op* target, bool waiting) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (target->done()) return false;
    // Only the first look at an op says how the caller uses the communicator.
    if (!target->looked_at) {
      target->looked_at = true;
      sync_use_ = waiting && NowS() - target->submitted_s < kSyncWaitS;
    }
    if (!waiting) {
      wake = worker_deferred_ && !running_;
      worker_deferred_ = false;
    } else if (!running_) {
      // Not done and no runner: `target` is still queued (a runner gives up the role
      // only after completing what it popped).
      running_ = true;
      worker_deferred_ = false;
    } else {
      return false;
    }
  }
  if (!waiting) {
    if (wake) cv_.notify_one();
    return false;
  }
  RunQueued(target);
  return true;
}

void MpiCommunicator::RunQueued(const Op* target) {
  bool wake_worker = false;
  bool reached = false;
  for (;;) {
    std::shared_ptr<Op> op;
    Status failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (queue_.empty() || reached) {
        // Collectives issued meanwhile (after `target`) are the worker's to run; a
        // stopping worker waits for the runner role to be free.
        running_ = false;
        wake_worker = !queue_.empty() || stop_;
        break;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      failed = failed_;
    }
    Execute(*op, failed);
    reached = op.get() == target;
  }
  if (wake_worker) cv_.notify_one();
}

void MpiCommunicator::Execute(Op& op, const Status& failed) {
  if (!failed.ok()) {
    op.fn = nullptr;
    op.Complete(AbortedError("collective #" + std::to_string(op.seq) + " " + op.What() +
                             " on communicator '" + options_.name +
                             "' not run: the communicator failed earlier: " + failed.ToString()));
    return;
  }
  // The board's text is written only when it differs from the previous collective's:
  // formatting it and storing 64 bytes cost ~0.4 us per 1 MiB collective on cold caches.
  if (op.label.empty() && board_text_valid_ && SameOp(op.desc, board_desc_)) {
    board_.Enter(op.seq);
  } else {
    OpTextBuffer text;
    board_.Enter(op.seq, op.Text(text));
    board_text_valid_ = op.label.empty();
    board_desc_ = op.desc;
  }
  ctx_.tag = static_cast<int>(op.seq & 0x7fff);
  ctx_.deadline_s = NowS() + options_.collective_timeout_s;
  ctx_.desc = &op.desc;
  running_op_ = &op;
  Status s = op.fn(ctx_);
  // A transfer of a MiB or so has evicted the lines that the rest of this path and the
  // caller's next Submit touch (this communicator, the op and its allocation, which the
  // next op is likely to reuse); fetched together they cost about one miss, not one each.
  PrefetchLines(this, sizeof(*this));
  PrefetchLines(reinterpret_cast<const char*>(&op) - 64, sizeof(op) + 64);
  running_op_ = nullptr;
  if (s.ok()) {
    board_.Finish(op.seq);
  } else if (s.code() != StatusCode::kInvalidArgument) {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = s;
  }
  op.fn = nullptr;
  op.Complete(std::move(s));
}

void MpiCommunicator::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return !running_ && (stop_ || !queue_.empty()); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    // A collective issued just now is likely to be Waited on at once, and its caller
    // then runs it inline. Started here instead, it would preempt that caller on a busy
    // 2-core machine and finish before the caller looks, so the caller would not be seen
    // to wait synchronously (kSyncWaitS) and the next Submit would wake the worker again
    // (in a probe, 1,762 of 15,000 back-to-back collectives went that way). So the
    // worker leaves it to the caller for kSyncWaitS after its issue; collectives nobody
    // waits for start that much later.
    const double grace_end = queue_.front()->submitted_s + kSyncWaitS;
    if (!stop_ && NowS() < grace_end) {
      auto until = std::chrono::steady_clock::time_point(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(grace_end)));
      cv_.wait_until(lock, until, [&] { return running_ || stop_ || queue_.empty(); });
      continue;
    }
    running_ = true;
    lock.unlock();
    RunQueued(nullptr);
    lock.lock();
  }
}

void MpiCommunicator::PostFailure(std::string_view what) {
  if (size_ == 1) return;
  const bool posted = notice_.Post(what);
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.ok()) failed_ = FailureNotice::OwnFailure(posted, what);
}

Status MpiCommunicator::Watchdog(uint64_t seq, const std::string& what) {
  std::ostringstream m;
  m << "watchdog: collective #" << seq << " " << what << " on communicator '" << options_.name << "' (rank "
    << rank_ << " of " << size_ << ") has not finished after " << options_.collective_timeout_s
    << " s (strata.collective_timeout_s). What each rank last entered:" << board_.Report()
    << "\nThis communicator is now failed: the collective's MPI receives were cancelled and its sends "
       "abandoned; "
       "end the job (a rank that never entered #"
    << seq << " is the one to look at).";
  STRATA_LOG(kError, "comm") << m.str();
  return DeadlineExceededError(m.str());
}

CommHandle MpiCommunicator::AllGather(const void* send, void* recv, size_t count_per_rank, DType dtype) {
  Status s = CheckBuffers(send, recv, count_per_rank, "AllGather");
  if (!s.ok()) return CommHandle::Done(s);
  return Submit({"AllGather", dtype, count_per_rank * static_cast<size_t>(size_)}, {},
                [send, recv](MpiContext& ctx) {
                  return DirectAllGather(ctx, send, recv, ctx.desc->count / static_cast<size_t>(ctx.size),
                                         ctx.desc->dtype);
                });
}

CommHandle MpiCommunicator::ReduceScatter(const void* send, void* recv, size_t count_per_rank, DType dtype,
                                          ReduceOp op) {
  Status s = CheckBuffers(send, recv, count_per_rank, "ReduceScatter");
  if (!s.ok()) return CommHandle::Done(s);
  return Submit({"ReduceScatter", dtype, count_per_rank * static_cast<size_t>(size_)}, {},
                [=](MpiContext& ctx) {
                  std::vector<size_t> offset(static_cast<size_t>(ctx.size)),
                      length(static_cast<size_t>(ctx.size), count_per_rank);
                  for (size_t r = 0; r < offset.size(); ++r) offset[r] = r * count_per_rank;
                  return DirectReduceScatterV(ctx, send, recv, offset, length, dtype, op);
                });
}

CommHandle MpiCommunicator::AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) {
  Status s = CheckBuffers(send, recv, count, "AllReduce");
  if (!s.ok()) return CommHandle::Done(s);
  return Submit({"AllReduce", dtype, count}, {}, [=](MpiContext& ctx) -> Status {
    const size_t p = static_cast<size_t>(ctx.size);
    std::vector<size_t> offset(p), length(p);
    for (size_t r = 0, off = 0; r < p; ++r) {
      length[r] = count / p + (r < count % p ? 1 : 0);
      offset[r] = off;
      off += length[r];
    }
    const size_t ds = DTypeSize(dtype);
    void* mine = static_cast<std::byte*>(recv) + offset[static_cast<size_t>(ctx.rank)] * ds;
    STRATA_RETURN_IF_ERROR(DirectReduceScatterV(ctx, send, mine, offset, length, dtype, op));
    return DirectAllGatherV(ctx, recv, offset, length, dtype);
  });
}

CommHandle MpiCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size_) {
    return CommHandle::Done(InvalidArgumentError("Broadcast: root " + std::to_string(root) +
                                                 " is not a rank of '" + options_.name + "' (size " +
                                                 std::to_string(size_) + ")"));
  }
  Status s = CheckBuffers(buf, buf, count, "Broadcast");
  if (!s.ok()) return CommHandle::Done(s);
  return Submit({"Broadcast", dtype, count, root}, {}, [buf](MpiContext& ctx) -> Status {
    return DirectBroadcast(ctx, buf, ctx.desc->count * DTypeSize(ctx.desc->dtype), ctx.desc->root);
  });
}

CommHandle MpiCommunicator::Barrier() {
  return Submit({}, "Barrier", [](MpiContext& ctx) -> Status {
    if (ctx.size == 1) return OkStatus();
    std::vector<MPI_Request> reqs(1, MPI_REQUEST_NULL);
    STRATA_MPI_RETURN_IF_ERROR(MPI_Ibarrier(ctx.comm, &reqs[0]), "MPI_Ibarrier");
    return ctx.WaitAll(reqs, 0);
  });
}

Result<std::unique_ptr<Communicator>> MpiCommunicator::Split(int colour, int key) {
  std::unique_ptr<Communicator> child;
  CommOptions child_options = options_;
  child_options.name = options_.name + "/" + std::to_string(colour);
  CommHandle h = Submit({}, "Split colour " + std::to_string(colour), [&](MpiContext& ctx) -> Status {
    MPI_Comm sub = MPI_COMM_NULL;
    STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_split(ctx.comm, colour < 0 ? MPI_UNDEFINED : colour, key, &sub),
                               "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return OkStatus();
    STRATA_ASSIGN_OR_RETURN(child, Create(sub, child_options));
    return OkStatus();
  });
  STRATA_RETURN_IF_ERROR(h.Wait());
  return child;
}

Result<void*> MpiCommunicator::AllocateBuffer(size_t bytes) {
  void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
  if (p == nullptr)
    return ResourceExhaustedError("communicator buffer of " + FormatBytes(bytes) + ": out of memory");
  return p;
}

void MpiCommunicator::FreeBuffer(void* p) { std::free(p); }

Status MpiCommunicator::CopyBuffer(void* dst, const void* src, size_t bytes) {
  if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
  return OkStatus();
}

}  // namespace strata::comm
