// The cuda device: cudaMalloc'd HBM, cudaStreamNonBlocking streams, cudaMemcpyAsync,
// cudaEvents. Every CUDA call is checked and turned into a Status.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>

#include "strata/log.h"
#include "strata/units.h"
#include "tiering/allocation_tracker.h"
#include "tiering/cuda/cuda_status.h"
#include "tiering/device_backends.h"

namespace strata::tiering {
namespace {

constexpr uint32_t kMaxStreams = 64;

cudaMemcpyKind MemcpyKind(CopyDir dir) {
  switch (dir) {
    case CopyDir::kHostToDevice: return cudaMemcpyHostToDevice;
    case CopyDir::kDeviceToHost: return cudaMemcpyDeviceToHost;
    case CopyDir::kDeviceToDevice: return cudaMemcpyDeviceToDevice;
  }
  return cudaMemcpyDefault;
}

// A stream's failure from host work (host functions cannot return errors to CUDA).
struct ErrorCell {
  std::mutex mu;
  Status status;
  void Set(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok()) status = s;
  }
  Status Get() {
    std::lock_guard<std::mutex> lock(mu);
    return status;
  }
  Status Take() {
    std::lock_guard<std::mutex> lock(mu);
    Status s = std::move(status);
    status = OkStatus();
    return s;
  }
};

struct CudaStream {
  std::string name;
  cudaStream_t stream = nullptr;
  std::shared_ptr<ErrorCell> error = std::make_shared<ErrorCell>();
  // Host work can fail asynchronously only when some was enqueued; until then events
  // need no host-side snapshot of the stream's failure.
  std::atomic<bool> has_host_work{false};
};

class CudaEvent final : public Event {
 public:
  CudaEvent(const void* owner, int device, cudaEvent_t event, std::shared_ptr<ErrorCell> snapshot)
      : owner_(owner), device_(device), event_(event), snapshot_(std::move(snapshot)) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }  // nothing to do if it fails at teardown

  bool Ready() const override { return cudaEventQuery(event_) != cudaErrorNotReady; }
  Status Wait() const override {
    cudaSetDevice(device_);
    STRATA_RETURN_IF_ERROR(CudaCheck(cudaEventSynchronize(event_), "cudaEventSynchronize"));
    return snapshot_ ? snapshot_->Get() : OkStatus();
  }
  const void* owner() const { return owner_; }
  cudaEvent_t event() const { return event_; }
  const std::shared_ptr<ErrorCell>& snapshot() const { return snapshot_; }

 private:
  const void* owner_;
  int device_;
  cudaEvent_t event_;
  std::shared_ptr<ErrorCell> snapshot_;  // the stream's failure when the event was reached
};

// A host function's closure: runs `fn` unless its stream already failed.
struct HostWork {
  std::function<Status()> fn;
  std::shared_ptr<ErrorCell> stream_error;
  std::shared_ptr<ErrorCell> source;  // kWait-style propagation: copy source's failure
};

void CUDART_CB RunHostWork(void* arg) {
  std::unique_ptr<HostWork> work(static_cast<HostWork*>(arg));
  if (work->source) {
    Status s = work->source->Get();
    if (!s.ok()) work->stream_error->Set(s);
    return;
  }
  if (!work->stream_error->Get().ok()) return;
  Status s = work->fn();
  if (!s.ok()) work->stream_error->Set(s);
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int index, uint64_t capacity, std::string device_name, std::string bus_id)
      : index_(index),
        name_(std::move(device_name)),
        bus_id_(std::move(bus_id)),
        tracker_("cuda:" + std::to_string(index), capacity) {}

  ~CudaDevice() override {
    cudaSetDevice(index_);
    uint32_t n = num_streams_.load();
    for (uint32_t i = 0; i < n; ++i) {
      Status s =
          CudaCheck(cudaStreamSynchronize(streams_[i]->stream), "cudaStreamSynchronize at device teardown");
      if (!s.ok()) {
        STRATA_LOG(kWarn, "device") << s.ToString();
      }
      cudaStreamDestroy(streams_[i]->stream);
    }
    for (const auto& [p, size] : tracker_.Snapshot()) cudaFree(reinterpret_cast<void*>(p));
  }

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_ + " (cuda:" + std::to_string(index_) + ")"; }
  std::string pci_bus_id() const override { return bus_id_; }
  bool host_accessible() const override { return false; }
  uint64_t capacity() const override { return tracker_.capacity(); }
  uint64_t allocated() const override { return tracker_.allocated(); }
  uint64_t high_water() const override { return tracker_.high_water(); }
  void ResetHighWater() override { tracker_.ResetHighWater(); }

  Result<void*> Allocate(uint64_t bytes) override {
    STRATA_ASSIGN_OR_RETURN(uint64_t rounded, tracker_.Reserve(bytes));
    STRATA_RETURN_IF_ERROR(SetDevice());
    void* p = nullptr;
    Status s = CudaCheck(cudaMalloc(&p, rounded),
                         "cudaMalloc of " + FormatBytes(bytes) + " on cuda:" + std::to_string(index_));
    if (!s.ok()) {
      tracker_.Unreserve(rounded);
      return Status(s.code(), s.message() + "; lower strata.device_budget");
    }
    tracker_.Insert(p, rounded);
    return p;
  }

  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    tracker_.Remove(ptr);
    cudaSetDevice(index_);
    Status s = CudaCheck(cudaFree(ptr), "cudaFree");
    STRATA_CHECK_MSG(s.ok(), s.ToString());
  }

  Result<StreamId> CreateStream(std::string name) override {
    std::lock_guard<std::mutex> lock(create_mu_);
    uint32_t n = num_streams_.load();
    if (n >= kMaxStreams) {
      return ResourceExhaustedError("cuda device: cannot create stream " + name + ": at most " +
                                    std::to_string(kMaxStreams) + " streams per device");
    }
    STRATA_RETURN_IF_ERROR(SetDevice());
    auto s = std::make_unique<CudaStream>();
    s->name = std::move(name);
    STRATA_RETURN_IF_ERROR(CudaCheck(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking),
                                     "cudaStreamCreateWithFlags for stream " + s->name));
    streams_[n] = std::move(s);
    num_streams_.store(n + 1, std::memory_order_release);
    return StreamId{n};
  }

  std::string_view StreamName(StreamId stream) const override {
    CudaStream* s = Find(stream);
    return s ? std::string_view(s->name) : std::string_view("?");
  }

  Status CopyAsync(StreamId stream, void* dst, const void* src, uint64_t bytes, CopyDir dir) override {
    STRATA_ASSIGN_OR_RETURN(CudaStream * s, Get(stream));
    if (bytes == 0) return OkStatus();
    bool dst_dev = dir != CopyDir::kDeviceToHost, src_dev = dir != CopyDir::kHostToDevice;
    std::string dir_name(CopyDirName(dir));
    STRATA_RETURN_IF_ERROR(ValidateCopy(tracker_, dst, src, bytes, dir_name.c_str(), dst_dev, src_dev));
    STRATA_RETURN_IF_ERROR(SetDevice());
    return CudaCheck(cudaMemcpyAsync(dst, src, bytes, MemcpyKind(dir), s->stream),
                     "cudaMemcpyAsync " + dir_name + " of " + FormatBytes(bytes) + " on stream " + s->name);
  }

  Status CopySync(void* dst, const void* src, uint64_t bytes, CopyDir dir) override {
    if (bytes == 0) return OkStatus();
    bool dst_dev = dir != CopyDir::kDeviceToHost, src_dev = dir != CopyDir::kHostToDevice;
    std::string dir_name(CopyDirName(dir));
    STRATA_RETURN_IF_ERROR(ValidateCopy(tracker_, dst, src, bytes, dir_name.c_str(), dst_dev, src_dev));
    STRATA_RETURN_IF_ERROR(SetDevice());
    return CudaCheck(cudaMemcpy(dst, src, bytes, MemcpyKind(dir)),
                     "cudaMemcpy " + dir_name + " of " + FormatBytes(bytes));
  }

  Status Enqueue(StreamId stream, std::function<Status()> fn) override {
    STRATA_ASSIGN_OR_RETURN(CudaStream * s, Get(stream));
    if (!fn) return InvalidArgumentError("Enqueue on stream " + s->name + ": empty function");
    return LaunchHostWork(s, new HostWork{std::move(fn), s->error, nullptr}, "Enqueue");
  }

  Result<std::shared_ptr<Event>> Record(StreamId stream) override {
    STRATA_ASSIGN_OR_RETURN(CudaStream * s, Get(stream));
    STRATA_RETURN_IF_ERROR(SetDevice());
    std::shared_ptr<ErrorCell> snapshot;
    if (s->has_host_work.load(std::memory_order_acquire)) {
      // Copy the stream's failure into the event's own cell when the stream gets here,
      // so Wait() reports failures before the event and not those after it.
      snapshot = std::make_shared<ErrorCell>();
      STRATA_RETURN_IF_ERROR(LaunchHostWork(s, new HostWork{nullptr, snapshot, s->error}, "Record"));
    }
    cudaEvent_t ev = nullptr;
    STRATA_RETURN_IF_ERROR(
        CudaCheck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags"));
    auto event = std::make_shared<CudaEvent>(this, index_, ev, std::move(snapshot));
    STRATA_RETURN_IF_ERROR(CudaCheck(cudaEventRecord(ev, s->stream), "cudaEventRecord on stream " + s->name));
    return std::shared_ptr<Event>(std::move(event));
  }

  Status Wait(StreamId stream, const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(CudaStream * s, Get(stream));
    auto* e = dynamic_cast<const CudaEvent*>(&event);
    if (e == nullptr || e->owner() != this) {
      return InvalidArgumentError("Wait on stream " + s->name +
                                  ": the event was not recorded on this device");
    }
    STRATA_RETURN_IF_ERROR(SetDevice());
    STRATA_RETURN_IF_ERROR(
        CudaCheck(cudaStreamWaitEvent(s->stream, e->event(), 0), "cudaStreamWaitEvent on stream " + s->name));
    if (e->snapshot()) {
      // The waiting stream inherits the failure the event carries.
      STRATA_RETURN_IF_ERROR(LaunchHostWork(s, new HostWork{nullptr, s->error, e->snapshot()}, "Wait"));
    }
    return OkStatus();
  }

  Status Synchronize(StreamId stream) override {
    STRATA_ASSIGN_OR_RETURN(CudaStream * s, Get(stream));
    STRATA_RETURN_IF_ERROR(SetDevice());
    STRATA_RETURN_IF_ERROR(
        CudaCheck(cudaStreamSynchronize(s->stream), "cudaStreamSynchronize on stream " + s->name));
    return s->error->Take();
  }

  Status SynchronizeAll() override {
    Status first;
    uint32_t n = num_streams_.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < n; ++i) {
      Status s = Synchronize(StreamId{i});
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }

  void* NativeStream(StreamId stream) const override {
    CudaStream* s = Find(stream);
    return s ? static_cast<void*>(s->stream) : nullptr;
  }

 private:
  Status SetDevice() const {
    return CudaCheck(cudaSetDevice(index_), "cudaSetDevice(" + std::to_string(index_) + ")");
  }

  Status LaunchHostWork(CudaStream* s, HostWork* work, const char* what) {
    s->has_host_work.store(true, std::memory_order_release);
    STRATA_RETURN_IF_ERROR(SetDevice());
    cudaError_t err = cudaLaunchHostFunc(s->stream, RunHostWork, work);
    if (err != cudaSuccess) {
      delete work;
      return CudaCheck(err, std::string("cudaLaunchHostFunc (") + what + ") on stream " + s->name);
    }
    return OkStatus();
  }

  CudaStream* Find(StreamId stream) const {
    if (stream.index >= num_streams_.load(std::memory_order_acquire)) return nullptr;
    return streams_[stream.index].get();
  }
  Result<CudaStream*> Get(StreamId stream) const {
    CudaStream* s = Find(stream);
    if (s == nullptr) {
      return InvalidArgumentError("cuda device: unknown stream " +
                                  (stream.valid() ? std::to_string(stream.index) : std::string("(invalid)")) +
                                  " (create streams with CreateStream)");
    }
    return s;
  }

  const int index_;
  const std::string name_;
  const std::string bus_id_;
  AllocationTracker tracker_;
  std::mutex create_mu_;
  std::array<std::unique_ptr<CudaStream>, kMaxStreams> streams_;
  std::atomic<uint32_t> num_streams_{0};
};

}  // namespace

Result<std::unique_ptr<Device>> CreateCudaDevice(const DeviceOptions& options) {
  STRATA_ASSIGN_OR_RETURN(CudaDeviceInfo info, QueryCudaDevice(options.index));
  // Headroom for the CUDA context, cuBLAS workspaces and kernels' own allocations.
  const uint64_t headroom = info.free_memory / 20, model = options.model_bytes;
  const std::string gpu = "cuda:" + std::to_string(options.index) + " (" + info.name + ")";
  if (options.capacity == 0 && model + headroom >= info.free_memory) {
    return OutOfBudgetError(gpu + ": the model's own device memory (its activations) " + FormatBytes(model) +
                            " leaves no room for the engine in the GPU's free memory " +
                            FormatBytes(info.free_memory) +
                            "; lower the micro-batch or turn on activation_checkpointing");
  }
  const uint64_t capacity = options.capacity == 0 ? info.free_memory - headroom - model : options.capacity;
  if (capacity + model > info.free_memory) {
    return OutOfBudgetError(
        gpu + ": device budget " + FormatBytes(capacity) +
        (model > 0 ? " and the model's own " + FormatBytes(model) + " (its activations)" : "") +
        " exceed the GPU's free memory " + FormatBytes(info.free_memory) + "; lower strata.device_budget" +
        (model > 0 ? " or the micro-batch" : ""));
  }
  STRATA_LOG(kInfo, "device") << "cuda:" << options.index << " " << info.name << " (" << info.pci_bus_id
                              << "), budget " << FormatBytes(capacity) << " of "
                              << FormatBytes(info.total_memory)
                              << (model > 0 ? ", beside the model's own " + FormatBytes(model) : "");
  return std::unique_ptr<Device>(
      std::make_unique<CudaDevice>(options.index, capacity, info.name, info.pci_bus_id));
}

}  // namespace strata::tiering
