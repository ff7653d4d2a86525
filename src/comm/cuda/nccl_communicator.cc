// The device (NCCL) Communicator: one NCCL communicator and one stream per Communicator,
// bootstrapped over MPI, with a watchdog thread that polls completion events and
// ncclCommGetAsyncError and aborts the communicator (ncclCommAbort) when a collective
// runs past strata.collective_timeout_s, or when a peer posts its failure
// (PostFailure: the watch board on the node, a FailureNotice message across nodes).
//
// bf16/fp16 reductions: NCCL rounds to the element type at every step of its ring, so
// they run in fp32 here instead (upcast into staging, reduce in fp32, one rounding on
// the way back), as the contract in strata/comm.h requires; this moves twice the bytes.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <thread>

#include "comm/cuda/convert.h"
#include "comm/failure_notice.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_util.h"
#include "comm/watch_board.h"
#include "strata/log.h"
#include "strata/units.h"

namespace strata {
namespace comm {
namespace {

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status CudaStatus(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return OkStatus();
  std::string msg = std::string(what) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) return UnavailableError(msg);
  return InternalError(msg);
}

Status NcclStatus(ncclResult_t r, ncclComm_t comm, std::string_view what) {
  if (r == ncclSuccess) return OkStatus();
  std::string msg = std::string(what) + ": NCCL error " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  if (r == ncclInvalidArgument || r == ncclInvalidUsage) return InvalidArgumentError(msg);
  if (r == ncclSystemError || r == ncclRemoteError) return UnavailableError(msg);
  return InternalError(msg);
}

#define STRATA_CUDA_RETURN_IF_ERROR(call, what) STRATA_RETURN_IF_ERROR(CudaStatus((call), (what)))
#define STRATA_NCCL_RETURN_IF_ERROR(call, comm, what) STRATA_RETURN_IF_ERROR(NcclStatus((call), (comm), (what)))

ncclDataType_t NcclType(DType d) {
  switch (d) {
    case DType::kF32: return ncclFloat32;
    case DType::kBf16: return ncclBfloat16;
    case DType::kFp16: return ncclFloat16;
  }
  return ncclFloat32;
}

std::string Describe(std::string_view op, DType dtype, size_t count) {
  std::ostringstream s;
  s << op << " " << DTypeName(dtype) << " x" << count << " (" << FormatBytes(count * DTypeSize(dtype)) << ")";
  return s.str();
}

// One enqueued collective: done when its event has completed, or failed by the watchdog.
class NcclOp final : public comm_internal::PendingOp {
 public:
  NcclOp(uint64_t seq, std::string what, cudaEvent_t ev) : seq(seq), what(std::move(what)), ev_(ev) {}
  ~NcclOp() override {
    if (ev_ != nullptr) cudaEventDestroy(ev_);
  }
  Status Wait() override {
    for (;;) {
      Result<bool> t = Test();
      if (!t.ok()) return t.status();
      if (*t) return OkStatus();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  Result<bool> Test() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      cudaError_t e = cudaEventQuery(ev_);
      if (e == cudaErrorNotReady) return false;
      done_ = true;
      status_ = CudaStatus(e, "collective #" + std::to_string(seq) + " " + what);
    }
    if (!status_.ok()) return status_;
    return true;
  }
  // The watchdog's verdict; ignored when the op already finished.
  void Fail(const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_) {
      done_ = true;
      status_ = s;
    }
  }
  bool Finished() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_ && cudaEventQuery(ev_) == cudaSuccess) done_ = true;
    return done_;
  }
  const uint64_t seq;
  const std::string what;

 private:
  std::mutex mu_;
  cudaEvent_t ev_;
  bool done_ = false;
  Status status_;
};

class NcclCommunicator final : public Communicator {
 public:
  static Result<std::unique_ptr<Communicator>> Create(MPI_Comm mpi, ncclComm_t nccl, const NcclOptions& n,
                                                      const CommOptions& o) {
    std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(mpi, nccl, n, o));
    STRATA_RETURN_IF_ERROR(c->Init());
    return std::unique_ptr<Communicator>(std::move(c));
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    // Teardown goes on past an error (nothing else can free these), which is logged.
    Status st;
    if (failed_.ok()) {
      st = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
      Status d = NcclStatus(ncclCommDestroy(nccl_), nullptr, "ncclCommDestroy");
      if (st.ok()) st = d;
    } else if (!aborted_) {  // the watchdog's abort already freed it
      st = NcclStatus(ncclCommAbort(nccl_), nullptr, "ncclCommAbort");
    }
    if (!st.ok()) STRATA_LOG(kWarn, "comm") << "closing NCCL communicator '" << options_.name << "': " << st.ToString();
    inflight_.clear();
    if (staging_ != nullptr) cudaFree(staging_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (!WorldInitialized()) return;  // MPI objects died with FinalizeWorld
    board_.Free();
    notice_.Free();
    if (mpi_ != MPI_COMM_NULL) MPI_Comm_free(&mpi_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend() const override { return "nccl"; }
  MemorySpace memory_space() const override { return MemorySpace::kDevice; }
  const std::string& name() const override { return options_.name; }

  CommHandle AllGather(const void* send, void* recv, size_t cpr, DType dtype) override {
    return Issue(Describe("AllGather", dtype, cpr * static_cast<size_t>(size_)), [&]() -> Status {
      return NcclStatus(ncclAllGather(send, recv, cpr, NcclType(dtype), nccl_, stream_), nccl_, "ncclAllGather");
    });
  }

  CommHandle ReduceScatter(const void* send, void* recv, size_t cpr, DType dtype, ReduceOp op) override {
    return Issue(Describe("ReduceScatter", dtype, cpr * static_cast<size_t>(size_)), [&]() -> Status {
      return Reduce(send, recv, cpr * static_cast<size_t>(size_), cpr, dtype, op, /*scatter=*/true);
    });
  }

  CommHandle AllReduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    return Issue(Describe("AllReduce", dtype, count),
                 [&]() -> Status { return Reduce(send, recv, count, count, dtype, op, /*scatter=*/false); });
  }

  CommHandle Broadcast(void* buf, size_t count, DType dtype, int root) override {
    if (root < 0 || root >= size_) {
      return CommHandle::Done(InvalidArgumentError("Broadcast: root " + std::to_string(root) + " out of range"));
    }
    return Issue(Describe("Broadcast", dtype, count), [&]() -> Status {
      return NcclStatus(ncclBroadcast(buf, buf, count, NcclType(dtype), root, nccl_, stream_), nccl_, "ncclBroadcast");
    });
  }

  CommHandle Barrier() override {
    // NCCL has no barrier: an all-reduce of one float on the stream serves.
    return Issue("Barrier", [&]() -> Status {
      STRATA_RETURN_IF_ERROR(EnsureStaging(sizeof(float)));
      return NcclStatus(ncclAllReduce(staging_, staging_, 1, ncclFloat32, ncclSum, nccl_, stream_), nccl_,
                        "ncclAllReduce (barrier)");
    });
  }

  Result<std::unique_ptr<Communicator>> Split(int colour, int key) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failed_.ok()) return AbortedError("Split on failed communicator '" + options_.name + "'");
    }
    MPI_Comm sub_mpi = MPI_COMM_NULL;
    STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_split(mpi_, colour < 0 ? MPI_UNDEFINED : colour, key, &sub_mpi),
                               "MPI_Comm_split");
    ncclComm_t sub = nullptr;
    STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(nccl_options_.device), "cudaSetDevice");
    STRATA_NCCL_RETURN_IF_ERROR(ncclCommSplit(nccl_, colour < 0 ? NCCL_SPLIT_NOCOLOR : colour, key, &sub, nullptr),
                                nccl_, "ncclCommSplit");
    if (sub == nullptr) return std::unique_ptr<Communicator>();
    CommOptions o = options_;
    o.name = options_.name + "/" + std::to_string(colour);
    return Create(sub_mpi, sub, nccl_options_, o);
  }

  Result<void*> AllocateBuffer(size_t bytes) override {
    STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(nccl_options_.device), "cudaSetDevice");
    void* p = nullptr;
    STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, std::max<size_t>(bytes, 256)),
                                "cudaMalloc(" + FormatBytes(bytes) + ") for communicator '" + options_.name + "'");
    return p;
  }
  void FreeBuffer(void* p) override {
    if (p != nullptr) cudaFree(p);
  }
  Status CopyBuffer(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return OkStatus();
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync");
  }

  void PostFailure(std::string_view what) override {
    if (size_ == 1) return;
    const bool posted = notice_.Post(what);
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) return;
    Status own = FailureNotice::OwnFailure(posted, what);
    // Collectives in flight will not complete once the peers abort theirs: waiting for
    // them (the engine does, abandoning its step) must not hang.
    if (inflight_.empty()) {
      failed_ = own;
    } else {
      AbortLocked(own);
    }
  }

 private:
  NcclCommunicator(MPI_Comm mpi, ncclComm_t nccl, const NcclOptions& n, const CommOptions& o)
      : mpi_(mpi), nccl_(nccl), nccl_options_(n), options_(o) {}

  Status Init() {
    STRATA_NCCL_RETURN_IF_ERROR(ncclCommUserRank(nccl_, &rank_), nccl_, "ncclCommUserRank");
    STRATA_NCCL_RETURN_IF_ERROR(ncclCommCount(nccl_, &size_), nccl_, "ncclCommCount");
    STRATA_CUDA_RETURN_IF_ERROR(cudaSetDevice(nccl_options_.device), "cudaSetDevice");
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(mpi_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    Status b = board_.Init(mpi_, options_.one_node_per_rank);
    if (!b.ok()) {
      STRATA_LOG(kWarn, "comm") << "no progress board for '" << options_.name << "': " << b.ToString();
    }
    Status n = notice_.Init(mpi_, &board_);
    if (!n.ok()) {
      STRATA_LOG(kWarn, "comm") << "no failure notices across nodes for '" << options_.name << "': " << n.ToString();
    }
    watchdog_ = std::thread([this] { WatchdogLoop(); });
    return OkStatus();
  }

  Status EnsureStaging(size_t bytes) {
    if (bytes <= staging_bytes_) return OkStatus();
    // Grown rarely; wait for collectives that may still use the old one.
    STRATA_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (staging_ != nullptr) cudaFree(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(&staging_, bytes), "cudaMalloc(" + FormatBytes(bytes) + ") staging");
    staging_bytes_ = bytes;
    return OkStatus();
  }

  // in_count elements in, out_count out (scatter: out_count = in_count / size).
  Status Reduce(const void* send, void* recv, size_t in_count, size_t out_count, DType dtype, ReduceOp op,
                bool scatter) {
    if (dtype == DType::kF32) {
      ncclRedOp_t nop = op == ReduceOp::kAvg ? ncclAvg : ncclSum;
      if (scatter) {
        return NcclStatus(ncclReduceScatter(send, recv, out_count, ncclFloat32, nop, nccl_, stream_), nccl_,
                          "ncclReduceScatter");
      }
      return NcclStatus(ncclAllReduce(send, recv, out_count, ncclFloat32, nop, nccl_, stream_), nccl_,
                        "ncclAllReduce");
    }
    const size_t out_offset = scatter ? in_count : 0;  // all-reduce runs in place in staging
    STRATA_RETURN_IF_ERROR(EnsureStaging((in_count + (scatter ? out_count : 0)) * sizeof(float)));
    float* in = static_cast<float*>(staging_);
    float* out = in + out_offset;
    STRATA_CUDA_RETURN_IF_ERROR(LaunchUpcast(dtype == DType::kBf16, send, in, in_count, stream_), "upcast kernel");
    if (scatter) {
      STRATA_NCCL_RETURN_IF_ERROR(ncclReduceScatter(in, out, out_count, ncclFloat32, ncclSum, nccl_, stream_), nccl_,
                                  "ncclReduceScatter (fp32)");
    } else {
      STRATA_NCCL_RETURN_IF_ERROR(ncclAllReduce(in, out, out_count, ncclFloat32, ncclSum, nccl_, stream_), nccl_,
                                  "ncclAllReduce (fp32)");
    }
    return CudaStatus(LaunchDowncast(dtype == DType::kBf16, out, recv, out_count, op == ReduceOp::kAvg ? size_ : 1, stream_),
                      "downcast kernel");
  }

  template <typename Enqueue>
  CommHandle Issue(std::string what, Enqueue&& enqueue) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) {
      return CommHandle::Done(AbortedError(what + " on communicator '" + options_.name +
                                           "' not run: it failed earlier: " + failed_.ToString()));
    }
    uint64_t seq = ++issued_;
    Status s = CudaStatus(cudaSetDevice(nccl_options_.device), "cudaSetDevice");
    if (s.ok() && nccl_options_.producer_stream != nullptr) {
      if (ready_ == nullptr) s = CudaStatus(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
      if (s.ok()) s = CudaStatus(cudaEventRecord(ready_, static_cast<cudaStream_t>(nccl_options_.producer_stream)),
                                 "cudaEventRecord(producer stream)");
      if (s.ok()) s = CudaStatus(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    }
    board_.Enter(seq, what);
    if (s.ok()) s = enqueue();
    cudaEvent_t ev = nullptr;
    if (s.ok()) s = CudaStatus(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    if (s.ok()) s = CudaStatus(cudaEventRecord(ev, stream_), "cudaEventRecord");
    if (!s.ok()) {
      if (ev != nullptr) cudaEventDestroy(ev);
      if (s.code() != StatusCode::kInvalidArgument) failed_ = s;
      return CommHandle::Done(s.WithContext("collective #" + std::to_string(seq) + " " + what));
    }
    auto op = std::make_shared<NcclOp>(seq, std::move(what), ev);
    if (inflight_.empty()) front_since_ = NowS();
    inflight_.push_back(op);
    cv_.notify_all();
    return CommHandle(op);
  }

  void WatchdogLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      while (!inflight_.empty() && inflight_.front()->Finished()) {
        board_.Finish(inflight_.front()->seq);
        inflight_.pop_front();
        front_since_ = NowS();
      }
      if (!failed_.ok() || inflight_.empty()) continue;
      ncclResult_t async = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(nccl_, &async);
      Status bad;
      if (r != ncclSuccess) {
        bad = NcclStatus(r, nccl_, "ncclCommGetAsyncError");
      } else if (async != ncclSuccess && async != ncclInProgress) {
        bad = NcclStatus(async, nccl_, "communicator '" + options_.name + "' asynchronous error");
      } else if (std::string peer = notice_.First(); !peer.empty()) {
        const auto& op = inflight_.front();
        bad = AbortedError("collective #" + std::to_string(op->seq) + " " + op->what + " on NCCL communicator '" +
                           options_.name + "' (rank " + std::to_string(rank_) + ") abandoned: " + peer +
                           "; it joins no more collectives, end the job");
      } else if (NowS() - front_since_ > options_.collective_timeout_s) {
        const auto& op = inflight_.front();
        std::ostringstream m;
        m << "watchdog: collective #" << op->seq << " " << op->what << " on NCCL communicator '" << options_.name
          << "' (rank " << rank_ << " of " << size_ << ", device " << nccl_options_.device
          << ") has not finished after " << options_.collective_timeout_s
          << " s (strata.collective_timeout_s). What each rank last entered:" << board_.Report()
          << "\nThe communicator was aborted (ncclCommAbort); end the job.";
        bad = DeadlineExceededError(m.str());
      }
      if (bad.ok()) continue;
      STRATA_LOG(kError, "comm") << bad.ToString();
      AbortLocked(bad);
    }
  }

  // With mu_ held: fails the communicator for good and every collective in flight.
  void AbortLocked(const Status& why) {
    failed_ = why;
    if (!aborted_) {
      Status a = NcclStatus(ncclCommAbort(nccl_), nullptr, "ncclCommAbort");
      if (!a.ok()) STRATA_LOG(kWarn, "comm") << a.ToString();
    }
    aborted_ = true;
    for (auto& op : inflight_) op->Fail(why);
    inflight_.clear();
  }

  MPI_Comm mpi_;
  ncclComm_t nccl_;
  NcclOptions nccl_options_;
  CommOptions options_;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  void* staging_ = nullptr;  // fp32 staging for bf16/fp16 reductions; stream-ordered use
  size_t staging_bytes_ = 0;
  WatchBoard board_;
  FailureNotice notice_;  // PostFailure: on board_ and to the ranks it does not reach

  std::mutex mu_;  // guards everything below, and serialises issuing
  std::condition_variable cv_;
  std::deque<std::shared_ptr<NcclOp>> inflight_;
  double front_since_ = 0;
  uint64_t issued_ = 0;
  Status failed_;
  bool aborted_ = false;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace
}  // namespace comm

bool NcclAvailable() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator& bootstrap, const NcclOptions& nccl,
                                                             const CommOptions& options) {
  auto* mpi = dynamic_cast<comm::MpiCommunicator*>(&bootstrap);
  if (mpi == nullptr) {
    return InvalidArgumentError("CreateNcclCommunicator: the bootstrap communicator must be an MPI one, got '" +
                                bootstrap.name() + "' (" + std::string(bootstrap.backend()) + ")");
  }
  // Every rank sets up locally first and the verdicts are combined, so that one rank's
  // missing GPU is an error on all ranks rather than a hang in ncclCommInitRank.
  Status local;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    local = UnavailableError("no CUDA device on rank " + std::to_string(bootstrap.rank()) +
                             (e != cudaSuccess ? std::string(" (") + cudaGetErrorString(e) + ")" : ""));
  } else if (nccl.device < 0 || nccl.device >= n) {
    local = InvalidArgumentError("CUDA device " + std::to_string(nccl.device) + " does not exist on rank " +
                                 std::to_string(bootstrap.rank()) + " (" + std::to_string(n) + " devices)");
  } else {
    local = comm::CudaStatus(cudaSetDevice(nccl.device), "cudaSetDevice");
  }
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (local.ok() && bootstrap.rank() == 0) local = comm::NcclStatus(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  float bad = local.ok() ? 0.0f : 1.0f;
  STRATA_RETURN_IF_ERROR(bootstrap.AllReduce(&bad, &bad, 1, DType::kF32, ReduceOp::kSum).Wait());
  if (!local.ok()) return local.WithContext("creating NCCL communicator '" + options.name + "'");
  if (bad != 0.0f) {
    return UnavailableError("creating NCCL communicator '" + options.name + "': " + std::to_string(int(bad)) +
                            " rank(s) could not set up their GPU (see their errors)");
  }
  static_assert(sizeof(ncclUniqueId) % 2 == 0);
  STRATA_RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof(id) / 2, DType::kFp16, 0).Wait());
  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_RETURN_IF_ERROR(mpi->RunInOrder("nccl bootstrap", [&](comm::MpiContext& ctx) -> Status {
    STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_dup(ctx.comm, &dup), "MPI_Comm_dup");
    return OkStatus();
  }));
  ncclComm_t c = nullptr;
  Status s = comm::NcclStatus(ncclCommInitRank(&c, bootstrap.size(), id, bootstrap.rank()), nullptr,
                              "ncclCommInitRank");
  if (!s.ok()) {
    MPI_Comm_free(&dup);
    return s.WithContext("creating NCCL communicator '" + options.name + "'");
  }
  return comm::NcclCommunicator::Create(dup, c, nccl, options);
}

}  // namespace strata
