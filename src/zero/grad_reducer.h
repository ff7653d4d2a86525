// The gradient reducer: each chunk's fp32 gradients collect in a device buffer over the
// backward uses of its tensors in a micro-batch, then are reduced over the ranks on the
// comm worker (all-reduce at stages 0-1, reduce-scatter at 2-3). This rank's part of the
// result goes to the sink, the engine's, which adds it into the gradient shard on the
// optimizer's tier (and may start the chunk's speculative step).
//
// A chunk is reduced when its last backward use of the micro-batch is done (counted from
// the recorded call order), else at the micro-batch's end. A buffer may also be reduced
// early, as a partial sum, when a use needs one and none is free: reductions add, so the
// shard is the same. In the window's last micro-batch every chunk gets exactly one final
// reduction (a zero one for a chunk no backward touched), which is the one that starts
// its speculative step and takes its stats. A run's chunks (layout.h) have places of
// their own, adjacent, so that a tensor larger than a chunk is one span for the model.
//
// Threads: the training thread calls everything; reductions and the sink run on the
// worker. A buffer goes back once its reduction has read it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <vector>

#include "strata/comm.h"
#include "strata/module_hooks.h"
#include "strata/timeline.h"
#include "zero/buffer_pool.h"
#include "zero/device_ops.h"
#include "zero/layout.h"
#include "zero/serial_worker.h"

namespace strata::zero {

class GradReducer {
 public:
  struct Options {
    const Layout* layout = nullptr;
    DeviceOps* ops = nullptr;
    Communicator* comm = nullptr;  // device collectives; unused at world size 1
    int world_size = 1;
    int stage = 0;
    int64_t opt_offset = 0;  // where this rank's part of a chunk starts
    DType compute = DType::kF32;
    SerialWorker* worker = nullptr;
    Timeline* timeline = nullptr;  // optional: a span per reduction on `track`
    int track = 0;
  };
  // Takes this rank's part (device memory, the shard's length) of the chunk's reduced
  // gradient. first_in_window: the window's first reduction of the chunk (overwrite,
  // do not add); last: its final one of the window's last micro-batch. On the worker.
  using Sink = std::function<Status(int chunk, const float* part, bool first_in_window, bool last)>;
  GradReducer(Options options, Sink sink);

  // --- set-up, before the first micro-batch ---
  void AddBuffer(float* buf) { pool_.Add(buf); }  // one chunk long, zeroed
  void SetRunPlaces(std::vector<float*> places);  // by chunk; nullptr outside runs
  // Device staging of one reduced chunk (stages 0-1) or shard (2-3).
  void SetRecv(float* recv) { recv_ = recv; }
  int buffers() const { return buffers_; }
  void set_buffers(int n) { buffers_ = n; }  // the count planned, for errors

  // --- a micro-batch ---
  // expected: by chunk, the backward uses the recording expects in it.
  void BeginMicroBatch(std::vector<int> expected);
  bool Holds(int chunk) const { return held_.count(chunk) != 0; }
  float* Buffer(int chunk) const { return held_.at(chunk); }
  // Takes a buffer for `chunk` (in_use: chunks of the use asking, not reduced early to
  // free one), zeroes its padding and marks its tensors unwritten. OutOfBudget when
  // every buffer is held by chunks of the same use.
  Status Hold(int chunk, const std::vector<int>& in_use);
  // Whether the tensor's next gradient adds to its buffer (it was written since the
  // buffer was taken); marks it written.
  bool MarkWritten(TensorId id);
  // Whether the chunk's final reduction of this micro-batch was issued.
  bool Final(int chunk) const { return final_[chunk] != 0; }
  // After a backward use of `chunk`: reduces it when the recording expects no more and
  // the micro-batch has followed the recording so far (`follows`).
  void CountUse(int chunk, bool follows, bool last_micro_batch);
  // Reduces what is still held, in chunk order, and in the window's last micro-batch
  // every chunk not yet final.
  Status EndMicroBatch(bool last_micro_batch);
  // The first error of the reductions done so far, which are dropped. Never blocks.
  Status PollDone();
  // Waits for every reduction submitted; the first error.
  Status Wait();
  // Waits until the reductions submitted so far have run; their results stay queued.
  void WaitRun() const;
  // Gives back every held buffer unreduced (a failed step).
  void DropHeld();
  // A new accumulation window: the next reduction of each chunk overwrites its shard.
  void EndWindow();

  struct Counters {
    int64_t busy_ns = 0;
    uint64_t bytes = 0;
  };
  Counters TakeCounters();

 private:
  void Submit(int chunk, bool final, bool last_micro_batch);
  Status Reduce(int chunk, float* grad, bool first_in_window, bool last);
  void Give(int chunk, float* g);

  const Options o_;
  const Sink sink_;
  BufferPool pool_;
  int buffers_ = 0;
  float* recv_ = nullptr;
  // Run chunks' places, and whether each is held (from Hold until its reduction read it).
  std::vector<float*> run_place_;
  std::vector<uint8_t> run_busy_;
  std::mutex run_mu_;
  std::condition_variable run_cv_;
  std::map<int, float*> held_;                      // by chunk, ordered: EndMicroBatch reduces in chunk order
  std::vector<int> expected_;                       // by chunk: backward uses still expected
  std::vector<uint8_t> final_;                      // by chunk: final reduction of this micro-batch issued
  std::vector<uint8_t> in_window_;                  // by chunk: reduced since the window began
  std::vector<uint8_t> written_;                    // by tensor: written since its buffer was taken
  std::deque<std::shared_future<Status>> reduces_;  // in flight, oldest first
  std::atomic<int64_t> busy_ns_{0};
  std::atomic<uint64_t> bytes_{0};
};

}  // namespace strata::zero
