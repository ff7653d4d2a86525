// Device ops on a CUDA device: each lane (training loop, comm worker, optimizer worker)
// has a stream of its own on the engine's Device; every call enqueues its work there and
// synchronizes that stream before returning (device_ops.h: complete on return). The
// model runs on the engine's compute stream, which WaitForModel synchronizes.
//
// Why synchronous: the engine hands buffers between its threads, the collectives (NCCL
// runs on the communicator's own stream) and the host by host-side order; making each
// call complete keeps that order valid without events between streams. The cost is a
// host round trip per call (a few microseconds), small beside chunk-sized work.
//
// Gradient statistics use scratch the ops object keeps per lane (device partial sums,
// a pinned 16-byte result), grown when a call has more shards, so a call allocates
// nothing; their reduction is deterministic (device_ops_kernels.h).
#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "strata/log.h"
#include "zero/cuda/device_ops_kernels.h"
#include "zero/device_ops.h"

namespace strata::zero {
namespace {

Status CudaStatus(cudaError_t err, const std::string& what) {
  if (err == cudaSuccess) return OkStatus();
  std::string msg =
      "engine CUDA: " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorMemoryAllocation) return ResourceExhaustedError(msg);
  return InternalError(msg);
}

// The statistics' result as the kernels write it (device_ops_kernels.cu's Partial).
struct StatsResult {
  double sum_sq;
  int flag;
};

// One lane's gradient-statistics scratch. The mutex spans enqueue to read-back: two
// threads on one lane share the stream and these buffers.
struct StatsScratch {
  std::mutex mu;
  void* partials = nullptr;  // device, `bytes` long
  size_t bytes = 0;
  void* result = nullptr;       // device, one StatsResult
  StatsResult* host = nullptr;  // pinned
};

class CudaDeviceOps final : public DeviceOps {
 public:
  CudaDeviceOps(Device& device, StreamId compute_stream) : device_(device), compute_stream_(compute_stream) {}
  ~CudaDeviceOps() override {
    // The device outlives this object; the scratch goes back once the lanes are idle (a
    // failure is only worth a line in the log: there is no caller to tell).
    for (StreamId lane : lanes_) {
      if (!lane.valid()) continue;
      if (Status st = device_.Synchronize(lane); !st.ok()) {
        STRATA_LOG(kWarn, "engine") << "device ops teardown: " << st.ToString();
      }
    }
    for (StatsScratch& s : stats_) {
      if (s.partials != nullptr) device_.Free(s.partials);
      if (s.result != nullptr) device_.Free(s.result);
      if (s.host != nullptr) {
        const cudaError_t err = cudaFreeHost(s.host);
        if (err != cudaSuccess) STRATA_LOG(kWarn, "engine") << "cudaFreeHost: " << cudaGetErrorString(err);
      }
    }
  }

  Status Init() {
    static constexpr const char* kNames[] = {"engine-ops-training", "engine-ops-reduce",
                                             "engine-ops-optimizer"};
    for (size_t i = 0; i < lanes_.size(); ++i) {
      STRATA_ASSIGN_OR_RETURN(lanes_[i], device_.CreateStream(kNames[i]));
    }
    model_stream_ = device_.NativeStream(compute_stream_);
    if (model_stream_ == nullptr) {
      return InvalidArgumentError("engine: device " + device_.name() +
                                  " has no native stream for its compute stream");
    }
    // The CUDA device index, for the threads that launch kernels here (a launch on a
    // stream of another device than the thread's current one fails).
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaStreamGetDevice(static_cast<cudaStream_t>(model_stream_), &index_),
                                      "cudaStreamGetDevice"));
    return OkStatus();
  }

  Backend model_backend() const override { return Backend::kCuda; }
  void* model_stream() const override { return model_stream_; }
  Status WaitForModel() override {
    return device_.Synchronize(compute_stream_).WithContext("the model's kernels");
  }

  Status Zero(OpsLane lane, void* dst, uint64_t bytes) override {
    if (bytes == 0) return OkStatus();
    STRATA_RETURN_IF_ERROR(SetDevice());
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaMemsetAsync(dst, 0, bytes, Native(lane)), "cudaMemsetAsync"));
    return Sync(lane);
  }
  Status Copy(OpsLane lane, void* dst, const void* src, uint64_t bytes) override {
    STRATA_RETURN_IF_ERROR(device_.CopyAsync(Stream(lane), dst, src, bytes, CopyDir::kDeviceToDevice));
    return Sync(lane);
  }
  Status ReadToHost(OpsLane lane, void* host, const void* dev, uint64_t bytes) override {
    STRATA_RETURN_IF_ERROR(device_.CopyAsync(Stream(lane), host, dev, bytes, CopyDir::kDeviceToHost));
    return Sync(lane);
  }
  Status WriteFromHost(OpsLane lane, void* dev, const void* host, uint64_t bytes) override {
    STRATA_RETURN_IF_ERROR(device_.CopyAsync(Stream(lane), dev, host, bytes, CopyDir::kHostToDevice));
    return Sync(lane);
  }
  Status Accumulate(OpsLane lane, float* dst, const float* src, int64_t n) override {
    STRATA_RETURN_IF_ERROR(SetDevice());
    const int err = cuda::LaunchAccumulate(dst, src, static_cast<size_t>(n), Native(lane));
    STRATA_RETURN_IF_ERROR(CudaStatus(static_cast<cudaError_t>(err), "gradient accumulation kernel"));
    return Sync(lane);
  }
  Status AddGradient(OpsLane lane, float* dst, const void* src, DType dtype, int64_t n,
                     bool overwrite) override {
    if (dtype != DType::kF32 && dtype != DType::kBf16 && dtype != DType::kFp16) {
      return InvalidArgumentError("gradient of dtype " + std::string(DTypeName(dtype)) +
                                  ": use fp32, bf16 or fp16");
    }
    STRATA_RETURN_IF_ERROR(SetDevice());
    const int bits = dtype == DType::kF32 ? 32 : (dtype == DType::kBf16 ? 16 : -16);
    const int err = cuda::LaunchAddGradient(dst, src, bits, static_cast<size_t>(n), overwrite, Native(lane));
    STRATA_RETURN_IF_ERROR(CudaStatus(static_cast<cudaError_t>(err), "gradient hand-in kernel"));
    return Sync(lane);
  }
  Status RoundThroughFp16(OpsLane lane, float* x, int64_t n) override {
    STRATA_RETURN_IF_ERROR(SetDevice());
    const int err = cuda::LaunchRoundThroughFp16(x, static_cast<size_t>(n), Native(lane));
    STRATA_RETURN_IF_ERROR(CudaStatus(static_cast<cudaError_t>(err), "fp16 rounding kernel"));
    return Sync(lane);
  }
  Result<GradStats> ComputeStats(OpsLane lane, std::span<const GradShard> shards, tbb::task_arena*) override {
    std::vector<cuda::StatsShard> list;
    for (size_t i = 0; i < shards.size(); ++i) {
      const GradShard& s = shards[i];
      if (s.n == 0) continue;
      if (s.grad.data == nullptr) {
        return InvalidArgumentError("engine CUDA: grad stats shard " + std::to_string(i) +
                                    " has a null pointer");
      }
      list.push_back({s.grad.data, s.n, static_cast<int>(s.grad.type)});
    }
    GradStats out;
    if (list.empty()) return out;
    STRATA_RETURN_IF_ERROR(SetDevice());
    StatsScratch& sc = stats_[static_cast<size_t>(lane)];
    std::lock_guard<std::mutex> lock(sc.mu);
    STRATA_RETURN_IF_ERROR(GrowStatsScratch(sc, list.size()));
    const int err = cuda::LaunchGradStats(list.data(), list.size(), sc.partials, sc.result, Native(lane));
    STRATA_RETURN_IF_ERROR(CudaStatus(static_cast<cudaError_t>(err), "grad stats kernels"));
    STRATA_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(sc.host, sc.result, sizeof(StatsResult), cudaMemcpyDeviceToHost, Native(lane)),
        "cudaMemcpyAsync (grad stats result)"));
    STRATA_RETURN_IF_ERROR(Sync(lane));
    out.sum_sq = sc.host->sum_sq;
    out.has_inf_nan = sc.host->flag != 0;
    return out;
  }
  Status Adam(OpsLane lane, const AdamParams& params, float* state, int64_t n, const float* grad,
              DType compute, void* out) override {
    STRATA_RETURN_IF_ERROR(SetDevice());
    AdamTensor t;
    t.params = &params;
    t.master = state;
    t.m = state + n;
    t.v = state + 2 * n;
    t.grad = GradView{grad, DType::kF32};
    if (compute != DType::kF32) t.out = Copy16{out, compute};
    t.n = static_cast<size_t>(n);
    STRATA_RETURN_IF_ERROR(AdamStepCuda({&t, 1}, Native(lane)));
    if (compute == DType::kF32 && n > 0) {
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(out, state, n * sizeof(float), cudaMemcpyDeviceToDevice, Native(lane)),
                     "cudaMemcpyAsync (fp32 compute copy)"));
    }
    return Sync(lane);
  }

 private:
  StreamId Stream(OpsLane lane) const { return lanes_[static_cast<size_t>(lane)]; }
  cudaStream_t Native(OpsLane lane) const {
    return static_cast<cudaStream_t>(device_.NativeStream(Stream(lane)));
  }
  // Makes the engine's GPU current for this thread: launches go to the current device.
  // Asking first is cheaper than setting it on every call.
  Status SetDevice() const {
    int current = -1;
    STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&current), "cudaGetDevice"));
    if (current == index_) return OkStatus();
    return CudaStatus(cudaSetDevice(index_), "cudaSetDevice");
  }
  // Room for `count` shards' partial sums (the lane's stream is idle: each call syncs).
  Status GrowStatsScratch(StatsScratch& sc, size_t count) {
    if (sc.host == nullptr) {
      void* host = nullptr;
      STRATA_RETURN_IF_ERROR(
          CudaStatus(cudaMallocHost(&host, sizeof(StatsResult)), "cudaMallocHost (grad stats)"));
      sc.host = static_cast<StatsResult*>(host);
    }
    if (sc.result == nullptr) {
      STRATA_ASSIGN_OR_RETURN(sc.result, device_.Allocate(sizeof(StatsResult)));
    }
    const size_t need = cuda::GradStatsScratchBytes(count);
    if (need <= sc.bytes) return OkStatus();
    if (sc.partials != nullptr) device_.Free(sc.partials);
    sc.partials = nullptr;
    sc.bytes = 0;
    STRATA_ASSIGN_OR_RETURN(sc.partials, device_.Allocate(need));
    sc.bytes = need;
    return OkStatus();
  }
  // Waits for the lane's work; returns the first failure (CUDA's or a host function's).
  Status Sync(OpsLane lane) { return device_.Synchronize(Stream(lane)); }

  Device& device_;
  StreamId compute_stream_;
  std::array<StreamId, 3> lanes_;
  std::array<StatsScratch, 3> stats_;
  void* model_stream_ = nullptr;
  int index_ = 0;
};

}  // namespace

Result<std::unique_ptr<DeviceOps>> CreateCudaDeviceOps(Device& device, StreamId compute_stream) {
  auto ops = std::make_unique<CudaDeviceOps>(device, compute_stream);
  STRATA_RETURN_IF_ERROR(ops->Init());
  return std::unique_ptr<DeviceOps>(std::move(ops));
}

}  // namespace strata::zero
