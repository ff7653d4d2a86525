// Collectives: a Communicator over MPI (host buffers; also starts and bootstraps the
// ranks) and NCCL (device buffers).
//
// Contract:
//  - Every rank of a communicator must issue the same collectives, with the same
//    counts, dtypes and ops, in the same order (as in MPI and NCCL). A rank that does
//    not join makes the others' collective run into the watchdog (below).
//  - Collectives are asynchronous: each returns a CommHandle at once; the buffers belong
//    to the collective until Wait() (or a Test() that says done) returns. Collectives of
//    one communicator run in the order they were issued, one after the other; different
//    communicators run concurrently.
//    Progress (MPI): a rank must Wait() or Test() each handle eventually, as with MPI's
//    own nonblocking collectives. A caller that waits right after issuing runs the
//    collective on its own thread (on a 2-core machine waking a worker thread for it
//    cost ~15 us of a 1 MiB collective); after a handle is Tested, or Waited on late,
//    the communicator's worker starts later collectives 50 us after issue (unless the
//    caller Waits first), so they overlap the caller's compute. A collective never
//    waited on nor tested may then never start on this rank, and the others report it
//    through the watchdog.
//  - Buffers: an MPI communicator (memory_space() == kHost) takes host pointers; an NCCL
//    communicator (kDevice) takes device pointers of its GPU. Never mix.
//  - send == recv (in place) is allowed for AllReduce; for AllGather `send` may be
//    recv + rank * count_per_rank; for ReduceScatter `recv` may be
//    send + rank * count_per_rank. count == 0 is a valid no-op (still ordered).
//  - bf16 and fp16 sums accumulate in fp32 and are rounded (to nearest even) once, at
//    the end. kAvg divides the fp32 sum by size() before rounding.
//  - Errors are Statuses from Wait()/Test(): InvalidArgument (bad root, null buffer
//    with count > 0, wrong memory space), DeadlineExceeded (watchdog), Aborted (the
//    communicator was aborted or failed earlier), Internal/Unavailable (MPI or NCCL
//    errors, converted with their error string). MPI errors never abort inside MPI:
//    communicators use MPI_ERRORS_RETURN.
//  - Watchdog: a collective not finished within CommOptions::collective_timeout_s
//    (strata.collective_timeout_s, default 300 s) fails with DeadlineExceeded. The
//    message (also logged at error level, subsystem "comm") names the operation, its
//    dtype and size, the communicator, this rank, and, for every rank on this node,
//    the sequence number and name of the last collective it entered and whether that
//    one finished ("rank 1: last entered #3 Barrier (finished)"). The communicator is
//    then failed for good: later collectives return Aborted.
//      MPI: a single MPI collective cannot be aborted cleanly. Receives of the stuck
//      collective are cancelled (MPI_Cancel); its sends and any MPI nonblocking
//      collective request are abandoned (never freed, never waited on). The process
//      should end the job (AbortWorld) rather than call FinalizeWorld, which could
//      wait for the abandoned traffic.
//      NCCL: the communicator is aborted with ncclCommAbort (its stream is drained).
//  - Thread-safety: the collective calls of one communicator must be issued from one
//    thread at a time (the order defines matching across ranks); Wait/Test may be
//    called from any thread. rank()/size()/name() are thread-safe.
//
// Binding: launch with `mpirun --bind-to none` (or `--bind-to numa`): mpirun's default
// binds each rank to one core, which starves the oneTBB threads inside a rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

#include "strata/dtype.h"
#include "strata/status.h"

namespace strata {

// DType (kF32, kBf16, kFp16) comes from strata/dtype.h, shared with the optimizer.

enum class ReduceOp { kSum, kAvg };
std::string_view ReduceOpName(ReduceOp op);  // "sum", "avg"

enum class MemorySpace { kHost, kDevice };

namespace comm_internal {
// One issued collective; implemented by the backends.
class PendingOp {
 public:
  virtual ~PendingOp() = default;
  virtual Status Wait() = 0;
  virtual Result<bool> Test() = 0;
};
}  // namespace comm_internal

// The completion of one collective. Copyable (copies refer to the same collective);
// a default-constructed handle is a finished, OK one.
class [[nodiscard]] CommHandle {
 public:
  CommHandle() = default;
  explicit CommHandle(std::shared_ptr<comm_internal::PendingOp> op) : op_(std::move(op)) {}
  // A handle that is already finished with `status` (argument errors, failed comms).
  static CommHandle Done(Status status);

  // Blocks until the collective has finished; returns its Status. Repeatable: later
  // calls return the same Status at once. Never blocks longer than the watchdog allows.
  Status Wait();
  // true: finished OK; false: still running; a failed Status: finished with an error.
  Result<bool> Test();

 private:
  std::shared_ptr<comm_internal::PendingOp> op_;
};

struct CommOptions {
  std::string name = "world";         // shown in logs and watchdog reports
  double collective_timeout_s = 300;  // watchdog limit per collective (> 0)
  // Tests: treat every rank as if it were on a node of its own, so that what must cross
  // nodes (the failure notice, PostFailure) is exercised on one machine. The watch board
  // then shows each rank only itself. Inherited by Split.
  bool one_node_per_rank = false;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "mpi" or "nccl"
  virtual MemorySpace memory_space() const = 0;
  virtual const std::string& name() const = 0;

  // recv[r * count_per_rank + i] = send_of_rank_r[i]; recv holds size() * count_per_rank.
  virtual CommHandle AllGather(const void* send, void* recv, size_t count_per_rank, DType dtype) = 0;
  // recv[i] = op over ranks r of send_of_rank_r[rank() * count_per_rank + i];
  // send holds size() * count_per_rank elements, recv count_per_rank.
  virtual CommHandle ReduceScatter(const void* send, void* recv, size_t count_per_rank, DType dtype,
                                   ReduceOp op) = 0;
  // recv[i] = op over ranks of send_of_rank_r[i] (count elements each).
  virtual CommHandle AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // buf on every rank = buf of `root`.
  virtual CommHandle Broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  virtual CommHandle Barrier() = 0;

  // Collective over this communicator (all ranks must call it, in collective order):
  // ranks with the same colour (>= 0) form a new communicator, ordered by (key, rank).
  // Same backend as this one; options are inherited, name becomes "<name>/<colour>".
  virtual Result<std::unique_ptr<Communicator>> Split(int colour, int key) = 0;

  // Buffers in this communicator's memory space (host: 64-byte aligned; device:
  // cudaMalloc), and an ordered copy within it; used by the bucketing helper.
  virtual Result<void*> AllocateBuffer(size_t bytes) = 0;
  virtual void FreeBuffer(void* p) = 0;
  // Copies in stream order with this communicator's collectives (host: at once).
  virtual Status CopyBuffer(void* dst, const void* src, size_t bytes) = 0;

  // Tells the peers that this rank has failed and will issue no more collectives here,
  // with `what` (the first 255 bytes are shown): a collective a peer is waiting in, or
  // starts later, ends with Aborted ("... abandoned: rank 1 failed: <what>") instead of
  // at the watchdog's limit, and the communicator is failed for good on every rank, this
  // one included (its own queued collectives end with Aborted, so waiting for them
  // cannot hang). As after the watchdog, the job should then end (AbortWorld). Any
  // thread; only the first call counts, and none after this rank has seen a peer's
  // posted failure (its own follows from that one, which already reached every rank; a
  // relay could reach a rank on another node first and name the wrong rank).
  // MPI: through the watch board on this node (within about a millisecond) and a
  // message to each rank on another node (picked up while that rank polls a collective
  // it waits in). NCCL: the same notices, which its watchdog thread polls every 50 ms
  // and answers by aborting the NCCL communicator (ncclCommAbort); the posting rank's
  // own collectives in flight are aborted too. A communicator of one rank: nothing.
  virtual void PostFailure(std::string_view what) { (void)what; }

 protected:
  Communicator() = default;
};

// Bucketing: coalesces many small tensors into few collectives (DeepSpeed's
// reduce_bucket_size / allgather_bucket_size). Tensors are copied (flattened) into a
// staging bucket; a full bucket is launched at once, asynchronously, and the next one
// fills meanwhile; Finish() launches the last one, waits for all and copies the results
// back into each tensor's recv buffer. A tensor larger than a bucket runs as its own
// collective on its own buffers (no copy). Staging buckets (max_in_flight of them) are
// allocated once in Create, in the communicator's memory space, and reused.
// Every rank must add the same sequence of tensor sizes. One thread at a time; the
// Bucketer must not outlive its Communicator; send/recv buffers belong to it until
// Finish() returns.
enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce };
std::string_view CollectiveKindName(CollectiveKind kind);

struct BucketOptions {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;  // kReduceScatter, kAllReduce
  // Elements per bucket, counted on the collective's full side: the all-gather output,
  // the reduce-scatter input, the all-reduce data. Rounded down to a multiple of size().
  size_t bucket_elements = 500'000'000;
  int max_in_flight = 2;  // buckets launched and not yet finished (>= 1)
};

class Bucketer {
 public:
  static Result<std::unique_ptr<Bucketer>> Create(Communicator& comm, const BucketOptions& options);
  virtual ~Bucketer() = default;
  // Arguments as the collective's: kAllGather (send: count, recv: count * size),
  // kReduceScatter (send: count * size, recv: count), kAllReduce (send, recv: count;
  // may be equal). May launch a bucket, and wait for the oldest one in flight.
  virtual Status Add(const void* send, void* recv, size_t count) = 0;
  // Launches what is pending, waits for everything, copies results back. After an
  // error the Bucketer is reset (pending tensors dropped) and may be reused.
  virtual Status Finish() = 0;
  // Collectives launched since Create (for tests and stats).
  virtual uint64_t collectives_launched() const = 0;
};

// Starts MPI if it is not running (MPI_Init_thread asking MPI_THREAD_MULTIPLE; a clear
// Unavailable error if the library provides less) and returns the world communicator
// (MPI backend, host buffers). Works without mpirun (world size 1).
// `expected_world_size` > 0: an error (FailedPrecondition, with the mpirun command to
// use) when the world has another size, e.g. 4 ranks wanted but started without mpirun.
// Environment launched by another launcher (WORLD_SIZE > 1 but an MPI world of 1) is
// also such an error. Collective over all ranks; call from one thread at a time. May
// be called again: each call returns a new communicator over all ranks (MPI stays
// initialised until FinalizeWorld).
Result<std::unique_ptr<Communicator>> InitWorld(const CommOptions& options, int expected_world_size = 0);
// True once MPI has been initialised (and not finalised).
bool WorldInitialized();
// Ends MPI (MPI_Finalize) after every communicator has been destroyed. Main thread.
Status FinalizeWorld();
// Ends the whole job at once (MPI_Abort on the world) with `exit_code`.
[[noreturn]] void AbortWorld(int exit_code);

// True when this binary was built with NCCL and a CUDA device is visible.
bool NcclAvailable();
struct NcclOptions {
  int device = 0;  // CUDA device index this rank uses
  // cudaStream_t (as void*) whose queued work each collective waits for before it
  // starts (so a gather can follow the kernel that produced its input); nullptr: none.
  // Collectives run on a stream the communicator owns (one per communicator).
  void* producer_stream = nullptr;
};
// Collective over `bootstrap` (an MPI communicator): rank 0 makes the NCCL unique id,
// broadcasts it, and every rank calls ncclCommInitRank. Unavailable when NCCL is not
// built or there is no GPU.
Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, const NcclOptions& nccl,
                                                             const CommOptions& options);

// Start-up check, collective over a host (MPI) communicator: hashes `doc` (canonical
// dump) and compares with rank 0's. On a mismatch every rank returns InvalidArgument
// naming `what`, the lowest differing rank, and the first differing key path with both
// values ("config mismatch: rank 1 has zero_optimization.stage = 3, rank 0 has 2").
Status CheckConsistency(Communicator& comm, std::string_view what, const nlohmann::json& doc);

}  // namespace strata
