// The host (MPI) Communicator. Each communicator owns a dup'd MPI communicator, a
// queue of issued collectives and one worker thread. Collectives run one at a time, in
// issue order, on whichever thread holds the "runner" role: the worker (so the caller's
// thread is free to compute while a collective progresses), or a thread that Waits on
// a handle while the communicator is idle: that thread runs the queued collectives up
// to its own inline, which saves the two thread hand-offs (wake the worker, wake the
// waiter) that cost a third of the time of a 1 MiB collective on a 2-core machine.
// A caller that Waits right after issuing gains nothing from the worker, so after such
// a collective the next Submit leaves the worker asleep (waking it cost ~15 us per
// 1 MiB collective on a 2-core machine); a later Wait or Test shows asynchronous use,
// and the worker then starts each collective 50 us after its issue unless the caller
// has begun to Wait on it by then.
// The runner drives point-to-point requests itself (MPI_Testall polling), which is
// what lets it enforce the watchdog deadline. World size 1 runs inline, without a worker.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/failure_notice.h"
#include "comm/op_text.h"
#include "comm/watch_board.h"
#include "strata/comm.h"

namespace strata::comm {

// Per-operation state the algorithms use (on the runner thread).
class MpiContext {
 public:
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int tag = 0;
  // Waits for `reqs` (the first `n_recv` of them are receives), polling MPI; past the
  // deadline it cancels the receives, abandons the rest and returns DeadlineExceeded.
  Status WaitAll(std::vector<MPI_Request>& reqs, size_t n_recv);
  // Gives up on requests after a failure elsewhere: cancels and frees the receives,
  // leaves the rest (MPI cannot take back a send that may have matched).
  void Abandon(std::vector<MPI_Request>& reqs, size_t n_recv);
  // Reused receive staging, grown (never shrunk) on demand; 64-byte aligned.
  std::byte* Staging(size_t bytes);

  std::function<Status()> on_deadline;  // builds the watchdog Status (set by the worker)
  // Checked between polls (about once a millisecond): a failure a rank posted
  // (Communicator::PostFailure: the watch board, or a notice from another node) as a
  // non-OK Status, which ends the wait.
  std::function<Status()> on_peer_failure;
  double deadline_s = 0;                // steady-clock seconds
  // The collective being run. Its functions read counts and dtype from here, so that
  // they capture no more than two pointers and std::function stores them without
  // allocating.
  const OpDesc* desc = nullptr;
  // Reused by the all-gather and broadcast algorithms instead of allocating per call.
  std::vector<MPI_Request> reqs;
  std::vector<size_t> offset, length;

 private:
  std::unique_ptr<std::byte[], void (*)(std::byte*)> staging_{nullptr, nullptr};
  size_t staging_bytes_ = 0;
};

// Algorithms (mpi_algorithms.cc). Counts are elements of `dtype`.
Status DirectAllGather(MpiContext& ctx, const void* send, void* recv, size_t count_per_rank, DType dtype);
// Ranks' blocks may differ in length: block r is [offset[r], offset[r] + length[r]).
// `own_src`: where this rank's block is (nullptr: already in place in `buf`); it is
// sent from there and copied into `buf` while the transfers run.
Status DirectAllGatherV(MpiContext& ctx, void* buf, const std::vector<size_t>& offset,
                        const std::vector<size_t>& length, DType dtype, const void* own_src = nullptr);
// Binomial tree from `root` over point-to-point messages (MPI_Ibcast's nonblocking
// algorithm was 0.79-0.86x of MPI_Bcast at 1 MiB over 2 ranks).
Status DirectBroadcast(MpiContext& ctx, void* buf, size_t bytes, int root);
Status DirectReduceScatterV(MpiContext& ctx, const void* send, void* recv_block,
                            const std::vector<size_t>& offset, const std::vector<size_t>& length, DType dtype,
                            ReduceOp op);

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (sets MPI_ERRORS_RETURN on it). Collective over `comm`.
  static Result<std::unique_ptr<MpiCommunicator>> Create(MPI_Comm comm, const CommOptions& options);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  const std::string& name() const override { return options_.name; }

  CommHandle AllGather(const void* send, void* recv, size_t count_per_rank, DType dtype) override;
  CommHandle ReduceScatter(const void* send, void* recv, size_t count_per_rank, DType dtype,
                           ReduceOp op) override;
  CommHandle AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override;
  CommHandle Broadcast(void* buf, size_t count, DType dtype, int root) override;
  CommHandle Barrier() override;
  Result<std::unique_ptr<Communicator>> Split(int colour, int key) override;

  // Runs `fn` in collective order (usually on the calling thread) and waits for it:
  // the way other backends (NCCL bootstrap) make MPI calls on this communicator.
  Status RunInOrder(std::string what, std::function<Status(MpiContext&)> fn) {
    return Submit({}, std::move(what), std::move(fn)).Wait();
  }

  Result<void*> AllocateBuffer(size_t bytes) override;
  void FreeBuffer(void* p) override;
  Status CopyBuffer(void* dst, const void* src, size_t bytes) override;
  void PostFailure(std::string_view what) override;

 private:
  class Op;
  MpiCommunicator(MPI_Comm comm, int rank, int size, const CommOptions& options);
  // Queues `fn` (or runs it inline for size 1) and wakes the worker. Reports name the
  // op by `label`, or by `desc` where the label is empty.
  CommHandle Submit(OpDesc desc, std::string label, std::function<Status(MpiContext&)> fn);
  // Called by Op::Wait (`waiting`): when no thread holds the runner role, takes it and
  // runs the queued collectives up to and including `target` on this thread. false:
  // another thread is the runner (the caller then sleeps until `target` completes).
  // Called by Op::Test (not `waiting`): wakes the worker if Submit left it asleep.
  bool RunInline(const Op* target, bool waiting);
  // Runner only: runs queued collectives in order until `target` has run (nullptr:
  // until the queue is empty), then gives up the runner role.
  void RunQueued(const Op* target);
  void Execute(Op& op, const Status& failed);
  void WorkerLoop();
  Status Watchdog(uint64_t seq, const std::string& what);

  MPI_Comm comm_;
  int rank_;
  int size_;
  CommOptions options_;
  WatchBoard board_;
  FailureNotice notice_;  // PostFailure: on board_ and to the ranks it does not reach
  MpiContext ctx_;  // runner only
  // Runner only: the collective being run (for the watchdog's report), and the
  // description whose text the board holds (board_text_valid_: it holds one).
  const Op* running_op_ = nullptr;
  OpDesc board_desc_;
  bool board_text_valid_ = false;

  std::mutex mu_;
  std::condition_variable cv_;  // wakes the worker
  std::deque<std::shared_ptr<Op>> queue_;
  std::shared_ptr<Op> spare_;  // the latest op, reused by Submit once it is free
  bool running_ = false;       // a thread holds the runner role
  bool stop_ = false;
  // The latest collective first looked at was Waited on right after its Submit: the
  // next Submit leaves the worker asleep (kSyncWaitS in mpi_communicator.cc).
  bool sync_use_ = false;
  bool worker_deferred_ = false;  // queued collectives a Submit did not wake the worker for
  Status failed_;                 // guarded by mu_; set once, by the watchdog or an MPI error
  uint64_t issued_ = 0;
  std::thread worker_;
};

}  // namespace strata::comm
