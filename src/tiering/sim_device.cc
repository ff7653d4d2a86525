// The sim device: host memory with a hard capacity; each stream is a worker thread
// that runs its queue in order; events are completion flags.
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "strata/log.h"
#include "strata/units.h"
#include "tiering/allocation_tracker.h"
#include "tiering/device_backends.h"

namespace strata::tiering {
namespace {

constexpr uint32_t kMaxStreams = 64;

// The completion flag; shared by the Event handed out and the queue entries that
// complete or wait on it, so a caller may drop its Event before the worker gets there.
struct EventState {
  explicit EventState(const void* o) : owner(o) {}
  const void* owner;
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool done = false;
  Status status;

  Status Wait() const {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return status;
  }
  void Complete(Status s) {
    {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      done = true;
    }
    cv.notify_all();
  }
};

class SimEvent final : public Event {
 public:
  explicit SimEvent(std::shared_ptr<EventState> state) : state_(std::move(state)) {}
  bool Ready() const override {
    std::lock_guard<std::mutex> lock(state_->mu);
    return state_->done;
  }
  Status Wait() const override { return state_->Wait(); }
  const std::shared_ptr<EventState>& state() const { return state_; }

 private:
  std::shared_ptr<EventState> state_;
};

// One queue entry. kWork runs `fn` unless the stream has failed; kRecord completes
// `event` with the stream's failure; kWait blocks the worker on `event`.
struct Item {
  enum Kind { kWork, kRecord, kWait } kind = kWork;
  std::function<Status()> fn;
  std::shared_ptr<EventState> event;
};

class SimStream {
 public:
  explicit SimStream(std::string name) : name_(std::move(name)), worker_([this] { Run(); }) {}
  ~SimStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    worker_.join();
  }
  const std::string& name() const { return name_; }

  void Push(Item item) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(item));
      ++enqueued_;
      wake = worker_idle_;
    }
    // Only an idle worker needs a wake-up; a busy one finds the item when it looks.
    if (wake) cv_.notify_one();
  }

  Status Synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t target = enqueued_;
    ++sync_waiters_;
    done_cv_.wait(lock, [&] { return completed_ >= target; });
    --sync_waiters_;
    Status s = std::move(error_);
    error_ = OkStatus();
    return s;
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      worker_idle_ = true;
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      worker_idle_ = false;
      if (queue_.empty()) return;  // stop_ and drained
      Item item = std::move(queue_.front());
      queue_.pop_front();
      Status failed = error_;
      lock.unlock();
      Status result;
      switch (item.kind) {
        case Item::kWork:
          if (failed.ok()) result = item.fn();
          break;
        case Item::kRecord: item.event->Complete(failed); break;
        case Item::kWait:
          result = item.event->Wait();
          if (!result.ok())
            result = result.WithContext("stream " + name_ + " waited on an event of a failed stream");
          break;
      }
      if (!result.ok()) {
        STRATA_LOG(kDebug, "device") << "sim stream " << name_ << " failed: " << result.ToString();
      }
      lock.lock();
      if (!result.ok() && error_.ok()) error_ = std::move(result);
      ++completed_;
      if (sync_waiters_ > 0) done_cv_.notify_all();
    }
  }

  const std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;       // work or stop arrived
  std::condition_variable done_cv_;  // an item completed
  std::deque<Item> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  Status error_;
  bool stop_ = false;
  bool worker_idle_ = false;
  int sync_waiters_ = 0;
  std::thread worker_;  // last: starts after the members it uses
};

class SimDevice final : public Device {
 public:
  explicit SimDevice(uint64_t capacity) : tracker_("sim", capacity) {}
  ~SimDevice() override {
    uint32_t n = num_streams_.load();
    for (uint32_t i = 0; i < n; ++i) streams_[i]->Synchronize().IgnoreError();  // draining; failures are moot
    for (uint32_t i = 0; i < n; ++i) streams_[i].reset();
    for (const auto& [p, size] : tracker_.Snapshot()) std::free(reinterpret_cast<void*>(p));
  }

  DeviceKind kind() const override { return DeviceKind::kSim; }
  std::string name() const override { return "sim (" + FormatBytes(tracker_.capacity()) + ")"; }
  std::string pci_bus_id() const override { return ""; }
  bool host_accessible() const override { return true; }
  uint64_t capacity() const override { return tracker_.capacity(); }
  uint64_t allocated() const override { return tracker_.allocated(); }
  uint64_t high_water() const override { return tracker_.high_water(); }
  void ResetHighWater() override { tracker_.ResetHighWater(); }

  Result<void*> Allocate(uint64_t bytes) override {
    STRATA_ASSIGN_OR_RETURN(uint64_t rounded, tracker_.Reserve(bytes));
    void* p = std::aligned_alloc(kDeviceAlignment, rounded);
    if (p == nullptr) {
      tracker_.Unreserve(rounded);
      return ResourceExhaustedError("sim device: the host has no memory left for " + FormatBytes(bytes) +
                                    " of simulated device memory; lower strata.device_budget");
    }
    tracker_.Insert(p, rounded);
    return p;
  }

  void Free(void* ptr) override {
    if (ptr == nullptr) return;
    tracker_.Remove(ptr);
    std::free(ptr);
  }

  Result<StreamId> CreateStream(std::string name) override {
    std::lock_guard<std::mutex> lock(create_mu_);
    uint32_t n = num_streams_.load();
    if (n >= kMaxStreams) {
      return ResourceExhaustedError("sim device: cannot create stream " + name + ": at most " +
                                    std::to_string(kMaxStreams) + " streams per device");
    }
    streams_[n] = std::make_unique<SimStream>(std::move(name));
    num_streams_.store(n + 1, std::memory_order_release);
    return StreamId{n};
  }

  std::string_view StreamName(StreamId stream) const override {
    SimStream* s = Find(stream);
    return s ? std::string_view(s->name()) : std::string_view("?");
  }

  Status CopyAsync(StreamId stream, void* dst, const void* src, uint64_t bytes, CopyDir dir) override {
    STRATA_ASSIGN_OR_RETURN(SimStream * s, Get(stream));
    if (bytes == 0) return OkStatus();
    bool dst_dev = dir != CopyDir::kDeviceToHost, src_dev = dir != CopyDir::kHostToDevice;
    std::string dir_name(CopyDirName(dir));
    STRATA_RETURN_IF_ERROR(ValidateCopy(tracker_, dst, src, bytes, dir_name.c_str(), dst_dev, src_dev));
    s->Push(Item{Item::kWork,
                 [dst, src, bytes] {
                   std::memcpy(dst, src, bytes);
                   return OkStatus();
                 },
                 nullptr});
    return OkStatus();
  }

  Status CopySync(void* dst, const void* src, uint64_t bytes, CopyDir dir) override {
    if (bytes == 0) return OkStatus();
    bool dst_dev = dir != CopyDir::kDeviceToHost, src_dev = dir != CopyDir::kHostToDevice;
    std::string dir_name(CopyDirName(dir));
    STRATA_RETURN_IF_ERROR(ValidateCopy(tracker_, dst, src, bytes, dir_name.c_str(), dst_dev, src_dev));
    std::memcpy(dst, src, bytes);
    return OkStatus();
  }

  Status Enqueue(StreamId stream, std::function<Status()> fn) override {
    STRATA_ASSIGN_OR_RETURN(SimStream * s, Get(stream));
    if (!fn) return InvalidArgumentError("Enqueue on stream " + s->name() + ": empty function");
    s->Push(Item{Item::kWork, std::move(fn), nullptr});
    return OkStatus();
  }

  Result<std::shared_ptr<Event>> Record(StreamId stream) override {
    STRATA_ASSIGN_OR_RETURN(SimStream * s, Get(stream));
    auto state = std::make_shared<EventState>(this);
    s->Push(Item{Item::kRecord, nullptr, state});
    return std::shared_ptr<Event>(std::make_shared<SimEvent>(std::move(state)));
  }

  Status Wait(StreamId stream, const Event& event) override {
    STRATA_ASSIGN_OR_RETURN(SimStream * s, Get(stream));
    auto* e = dynamic_cast<const SimEvent*>(&event);
    if (e == nullptr || e->state()->owner != this) {
      return InvalidArgumentError("Wait on stream " + s->name() +
                                  ": the event was not recorded on this device");
    }
    s->Push(Item{Item::kWait, nullptr, e->state()});
    return OkStatus();
  }

  Status Synchronize(StreamId stream) override {
    STRATA_ASSIGN_OR_RETURN(SimStream * s, Get(stream));
    return s->Synchronize();
  }

  Status SynchronizeAll() override {
    Status first;
    uint32_t n = num_streams_.load(std::memory_order_acquire);
    for (uint32_t i = 0; i < n; ++i) {
      Status s = streams_[i]->Synchronize();
      if (first.ok() && !s.ok()) first = s;
    }
    return first;
  }

  void* NativeStream(StreamId) const override { return nullptr; }

 private:
  SimStream* Find(StreamId stream) const {
    if (stream.index >= num_streams_.load(std::memory_order_acquire)) return nullptr;
    return streams_[stream.index].get();
  }
  Result<SimStream*> Get(StreamId stream) const {
    SimStream* s = Find(stream);
    if (s == nullptr) {
      return InvalidArgumentError("sim device: unknown stream " +
                                  (stream.valid() ? std::to_string(stream.index) : std::string("(invalid)")) +
                                  " (create streams with CreateStream)");
    }
    return s;
  }

  AllocationTracker tracker_;
  std::mutex create_mu_;
  std::array<std::unique_ptr<SimStream>, kMaxStreams> streams_;
  std::atomic<uint32_t> num_streams_{0};
};

}  // namespace

Result<std::unique_ptr<Device>> CreateSimDevice(uint64_t capacity) {
  return std::unique_ptr<Device>(std::make_unique<SimDevice>(capacity));
}

}  // namespace strata::tiering
