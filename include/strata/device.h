// The device seam: memory with capacity accounting, ordered asynchronous queues
// ("streams"), events, and asynchronous copies between host and device memory.
//
// Two backends, chosen by CreateDevice():
//  - cuda: cudaMalloc'd HBM; streams are cudaStreamNonBlocking streams; copies are
//    cudaMemcpyAsync; events are cudaEvents. Only built when CUDA is (STRATA_HAVE_CUDA).
//  - sim:  a simulated device in host memory with a hard capacity. Each stream is a
//    worker thread that runs its work in order; copies are memcpy on that worker; events
//    are completion flags. It is not a mock: the same schedules run on it, and CPU
//    "kernels" (Enqueue) compute on device memory, which is host-addressable.
//
// Ownership: the Device owns its allocations and streams. Destroying a Device waits for
// every stream to drain, then frees what is still allocated. Pointers returned by
// Allocate() are valid until Free() or the Device's destruction.
//
// Threads: every method may be called from any thread. Work enqueued on one stream runs
// in the order it was enqueued (calls from several threads onto the same stream are
// ordered by the time each call returns). Streams run concurrently with each other.
//
// Errors: a call that can be checked at once (unknown stream, a null or out-of-range
// device pointer, a copy that would overrun an allocation) returns the failure directly
// and enqueues nothing. A failure while the work runs (a host function that returns a
// non-OK Status, a CUDA error) is kept by the stream: later work on that stream is
// skipped on sim, and on cuda later host functions are skipped (copies already queued
// on the GPU still run). The first such failure is returned by the next Synchronize()
// of that stream, which also clears it, and by Event::Wait() of every event recorded
// after it; a stream that Wait()s on a failed event inherits the failure.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "strata/config.h"
#include "strata/status.h"

namespace strata {

enum class CopyDir { kHostToDevice, kDeviceToHost, kDeviceToDevice };
// "H2D", "D2H", "D2D".
std::string_view CopyDirName(CopyDir dir);

// Names one stream of one Device. Obtained from Device::CreateStream; plain value.
struct StreamId {
  uint32_t index = UINT32_MAX;
  bool valid() const { return index != UINT32_MAX; }
  friend bool operator==(StreamId a, StreamId b) { return a.index == b.index; }
};

// A point in a stream's work. Ready once everything enqueued on the stream before it
// was recorded has run. Shared by whoever waits on it; it must not outlive its Device.
class Event {
 public:
  virtual ~Event() = default;
  // True when the work before the event has finished (successfully or not). Never blocks.
  virtual bool Ready() const = 0;
  // Blocks the calling thread until Ready(); returns the first failure of the stream
  // that happened before the event, or OK. May be called repeatedly, from any thread.
  virtual Status Wait() const = 0;
};

// Where CreateDevice looks and how big the device is.
struct DeviceOptions {
  DeviceKind kind = DeviceKind::kAuto;  // auto: cuda when a GPU is present, sim elsewhere
  int index = 0;                        // CUDA device ordinal (cuda only)
  // Capacity for Allocate(): sim: the simulated HBM (0: 8 GiB); cuda: a budget within
  // the GPU's free memory (0: the free memory at creation, less 5% headroom for the
  // CUDA context and kernels). A budget above the free memory is OutOfBudget.
  uint64_t capacity = 0;
  // cuda: device memory the model allocates itself beside the budget (its activations):
  // a capacity of 0 leaves it out of the free memory too, and a budget that with it
  // exceeds the free memory is OutOfBudget, naming both. Ignored on sim, where the
  // model's memory is the host's.
  uint64_t model_bytes = 0;
};

inline constexpr uint64_t kDefaultSimCapacity = 8ull << 30;

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;  // kSim or kCuda, never kAuto
  // "sim (8.00 GiB)", "NVIDIA H200 (cuda:0)".
  virtual std::string name() const = 0;
  // PCI bus id ("0000:17:00.0") for locality look-ups in Topology; "" on sim.
  virtual std::string pci_bus_id() const = 0;
  // True when device memory is addressable from the host (sim): CPU kernels may then
  // run on it from Enqueue()d host functions.
  virtual bool host_accessible() const = 0;

  // Accounting, in bytes. allocated() counts live allocations (rounded up to 256 B);
  // high_water() is the peak of allocated() since creation or ResetHighWater().
  virtual uint64_t capacity() const = 0;
  virtual uint64_t allocated() const = 0;
  virtual uint64_t high_water() const = 0;
  virtual void ResetHighWater() = 0;

  // Allocates `bytes` (> 0) of device memory, 256-byte aligned. Over capacity it is
  // OutOfBudget naming the request, the capacity and what is allocated; nothing is
  // evicted here (that is the tier manager's job). The memory is not initialised.
  virtual Result<void*> Allocate(uint64_t bytes) = 0;
  // Frees a pointer returned by Allocate(). Work still queued on a stream that uses it
  // must have completed (synchronise first). Freeing an unknown pointer aborts.
  virtual void Free(void* ptr) = 0;

  // Creates an ordered work queue. `name` appears in logs and traces ("h2d", "d2h",
  // "compute"). At most 64 streams per device; more is ResourceExhausted.
  virtual Result<StreamId> CreateStream(std::string name) = 0;
  virtual std::string_view StreamName(StreamId stream) const = 0;

  // Enqueues a copy of `bytes` from `src` to `dst` on `stream`. H2D: dst is device
  // memory, src host memory; D2H the reverse; D2D both device. Host memory may be
  // pinned (HostArena) or pageable; on cuda a pageable copy is staged by the driver and
  // is slower. Both buffers must stay valid and untouched until the copy completes
  // (observe it with an event or Synchronize). bytes == 0 enqueues nothing.
  virtual Status CopyAsync(StreamId stream, void* dst, const void* src, uint64_t bytes, CopyDir dir) = 0;

  // A plain synchronous copy on the calling thread, outside every stream: cudaMemcpy on
  // cuda, memcpy on sim. For reference measurements (the limit beside `strata bench
  // pcie`'s figures) and one-off set-up copies, not for the transfer path. The same
  // argument checks as CopyAsync; a copy error is returned directly.
  virtual Status CopySync(void* dst, const void* src, uint64_t bytes, CopyDir dir) = 0;

  // Enqueues host work that runs in stream order, after everything enqueued before it
  // and before everything enqueued after it. sim: it runs on the stream's worker thread
  // (this is where CPU kernels run). cuda: it runs on a CUDA driver thread through
  // cudaLaunchHostFunc and MUST NOT call CUDA (no copies, syncs or allocations), and it
  // blocks the stream while it runs, so keep it short. A non-OK return is a stream
  // failure (see the header comment).
  virtual Status Enqueue(StreamId stream, std::function<Status()> fn) = 0;

  // Records an event after the work enqueued on `stream` so far.
  virtual Result<std::shared_ptr<Event>> Record(StreamId stream) = 0;
  // Makes `stream` wait (without blocking the caller) until `event` is ready. The event
  // must come from this Device's Record(); one from another device is InvalidArgument.
  virtual Status Wait(StreamId stream, const Event& event) = 0;
  // Blocks until everything enqueued on `stream` has run; returns (and clears) the
  // stream's first failure since the last Synchronize.
  virtual Status Synchronize(StreamId stream) = 0;
  // Synchronize() on every stream; the first failure found is returned.
  virtual Status SynchronizeAll() = 0;

  // The backend's native stream handle, for kernels launched by other layers: a
  // cudaStream_t on cuda, nullptr on sim.
  virtual void* NativeStream(StreamId stream) const = 0;

 protected:
  Device() = default;
};

// Creates a device. kAuto picks cuda when this binary was built with CUDA and a GPU is
// present, sim otherwise. kCuda where there is no usable GPU is Unavailable with what
// cudaGetDeviceCount said (or that this binary was built without CUDA) and
// "use --device sim" as the way out.
Result<std::unique_ptr<Device>> CreateDevice(const DeviceOptions& options);

// What the CUDA runtime says about GPUs, without creating a device. `available` is
// true when at least one GPU can be used; otherwise `reason` says why (built without
// CUDA; the cudaGetDeviceCount error; no devices).
struct CudaProbe {
  bool built_with_cuda = false;
  bool available = false;
  int device_count = 0;
  int runtime_version = 0;  // cudaRuntimeGetVersion, e.g. 13000
  int driver_version = 0;   // cudaDriverGetVersion; 0 without a driver
  std::string reason;
};
CudaProbe ProbeCuda();

// Properties of one CUDA device (for `strata info`); Unavailable where ProbeCuda is.
struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  std::string pci_bus_id;
  uint64_t total_memory = 0;
  uint64_t free_memory = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int async_engines = 0;  // copy engines
};
Result<CudaDeviceInfo> QueryCudaDevice(int index);

}  // namespace strata
