// Stage 3's gathered chunks on the device (internal): which chunk is gathered where, when
// gathers start along the recorded trace, and when their buffers are released.
//
// The gatherer owns the choice, not the bytes' journey: it hands a free device buffer to
// the engine's StartFn, which brings this rank's shard in from its tier and all-gathers
// the chunk into the buffer on the engine's workers, and it keeps the future that says
// when the buffer is whole. Gathers start for the chunks of the next prefetch_modules()
// uses after the one running, as buffers allow; a gathered chunk stays while a module in
// that window needs it, and the chunks of the keep and carry plans (keep_plan.h) stay
// between their uses. Which chunks are gathered and released depends only on module
// indices, the buffer count and the depth, which the ranks agree on, never on timing, so
// every rank issues the same all-gathers in the same order. A micro-batch off the
// recording gathers on demand and releases what no module holds.
//
// Threads: the training thread only, but for NoteGatherLatency (any thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <vector>

#include "strata/status.h"
#include "zero/layout.h"
#include "zero/trace.h"

namespace strata::zero {

// What the plan (gather_plan.h) decides for the gatherer.
struct GatherPlan {
  int buffers = 0;               // device buffers of one chunk's compute values
  int max_prefetch_modules = 0;  // the deepest window the buffers allow
  std::vector<uint8_t> kept;     // by chunk: stays from its forward use to its last backward use
  std::vector<uint8_t> carried;  // by chunk: stays from a micro-batch's backward to the next forward
  int kept_count() const;
  int carried_count() const;
};

class ParamGatherer {
 public:
  // Starts gathering `chunk` into `buf` (a whole chunk's compute values); the future
  // is ready once the buffer holds the chunk, or with the error that stopped it. It must
  // not call back into the gatherer but for NoteGatherLatency.
  using StartFn = std::function<std::shared_future<Status>(int chunk, void* buf)>;

  // `layout` and `order` must outlive the gatherer.
  ParamGatherer(const Layout& layout, const CallOrder& order, StartFn start);

  // The plan, device buffers for plan.buffers chunks, and by chunk the place of each
  // run's chunk in its run's own buffer (nullptr outside runs; empty: no runs). The
  // engine owns their memory. Before the first gather.
  void Configure(const GatherPlan& plan, std::vector<void*> buffers, std::vector<void*> run_places = {});

  // The buffer of a gathered chunk; the chunk must be gathered (Enter).
  void* Params(int chunk) const;

  // Gathers the chunks of `module` (waiting for them) and starts the gathers of the
  // window after trace position `pos` (-1: a use off the trace, gathered on demand).
  // OutOfBudget when every buffer is held by a module in use; a gather's error.
  Status Enter(int module, int pos);
  // After the module at `pos` ran (its kernels done): frees the gathered chunks that
  // neither the window nor the keep and carry plans hold. A failed gather it frees
  // is logged (its error was or will be returned by an Enter).
  void Leave(int module, int pos, bool last_micro_batch);

  // FailedPrecondition naming a chunk a module's hooks still hold.
  Status CheckNoneHeld() const;
  // Frees every gathered chunk once its gather is done; the first gather's error.
  Status DropAll();
  // After a failed step: frees what no module holds, ignoring the gathers' errors.
  void DropUnheld();

  // The last step's measurements, for the depth of the next window: the time from a
  // gather's start to its buffer being whole (any thread), and a module's compute.
  void NoteGatherLatency(int64_t ns);
  void NoteModuleCompute(int64_t ns);
  // The depth the measurements ask for (prefetch_depth.h); clears them.
  int MeasuredPrefetch();

  int prefetch_modules() const { return prefetch_modules_; }
  void set_prefetch_modules(int depth) { prefetch_modules_ = depth; }
  int max_prefetch_modules() const { return plan_.max_prefetch_modules; }
  int buffers() const { return plan_.buffers; }
  // Chunks released early because no planned buffer was free, since the last call.
  int TakeEvictions() { return std::exchange(evictions_, 0); }

 private:
  struct Gathered {
    void* buf = nullptr;
    std::shared_future<Status> ready;
    int users = 0;  // modules between Enter and Leave
  };
  Status EnsureGathered(int chunk);
  void Start(int chunk);
  void Prefetch(int pos);
  Status FreeUnused(int chunk);  // a buffer for `chunk` from a gathered chunk nobody uses

  const Layout& layout_;
  const CallOrder& order_;
  StartFn start_;
  GatherPlan plan_;
  std::vector<void*> free_;
  std::vector<void*> run_places_;
  bool InRun(int chunk) const { return !run_places_.empty() && run_places_[chunk] != nullptr; }
  void Free(int chunk, void* buf) {
    if (!InRun(chunk)) free_.push_back(buf);
  }
  std::map<int, Gathered> gathered_;
  int prefetch_modules_ = 1;
  int evictions_ = 0;
  std::atomic<int64_t> gather_latency_ns_{0};
  std::atomic<int> gathers_timed_{0};
  int64_t module_compute_ns_ = 0;
  int modules_timed_ = 0;
};

}  // namespace strata::zero
