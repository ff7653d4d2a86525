#include "zero/grad_reducer.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "zero/clock.h"

namespace strata::zero {
GradReducer::GradReducer(Options options, Sink sink)
    : o_(options),
      sink_(std::move(sink)),
      expected_(options.layout->num_chunks, 0),
      final_(options.layout->num_chunks, 0),
      in_window_(options.layout->num_chunks, 0),
      written_(options.layout->tensors.size(), 0) {}

void GradReducer::SetRunPlaces(std::vector<float*> places) {
  run_place_ = std::move(places);
  run_busy_.assign(run_place_.size(), 0);
}

void GradReducer::BeginMicroBatch(std::vector<int> expected) {
  expected_ = std::move(expected);
  std::fill(final_.begin(), final_.end(), 0);
}

bool GradReducer::MarkWritten(TensorId id) {
  const bool was = written_[id] != 0;
  written_[id] = 1;
  return was;
}

void GradReducer::Give(int chunk, float* g) {
  if (!o_.layout->InRun(chunk)) return pool_.Give(g);
  {
    std::lock_guard lock(run_mu_);
    run_busy_[chunk] = 0;
  }
  run_cv_.notify_all();
}

Status GradReducer::Hold(int chunk, const std::vector<int>& in_use) {
  const Layout& l = *o_.layout;
  void* buf = nullptr;
  if (l.InRun(chunk)) {
    // Its place is its own: free once the last reduction from it is done.
    std::unique_lock lock(run_mu_);
    run_cv_.wait(lock, [&] { return !run_busy_[chunk]; });
    run_busy_[chunk] = 1;
    buf = run_place_[chunk];
  }
  while (buf == nullptr && (buf = pool_.TryTake()) == nullptr) {
    // A reduction gives its buffer back before its future is ready, and another take may
    // already have had that buffer: wait for the reduction itself, then look again, never
    // for the pool (which may get nothing more).
    auto running = std::find_if(reduces_.begin(), reduces_.end(), [](const std::shared_future<Status>& r) {
      return r.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
    });
    if (running != reduces_.end()) {
      running->wait();
      continue;
    }
    // Nothing in flight: every buffer not held below is in the pool.
    if ((buf = pool_.TryTake()) != nullptr) break;
    // Every buffer is held by a chunk waiting for more backward uses (a tied tensor's
    // chunk, or a micro-batch off the recording): reduce one that this use does not need
    // now as a partial sum; its reduction then runs, and the loop waits for it.
    auto victim = std::find_if(held_.begin(), held_.end(), [&](const auto& held) {
      return !l.InRun(held.first) &&  // a run chunk's place frees no buffer
             std::find(in_use.begin(), in_use.end(), held.first) == in_use.end();
    });
    if (victim == held_.end()) {
      return OutOfBudgetError("engine: no free gradient buffer for chunk " + std::to_string(chunk) + " (" +
                              std::to_string(buffers_) +
                              " buffers, all held by chunks of the same use); raise strata.device_budget");
    }
    Submit(victim->first, /*final=*/false, /*last_micro_batch=*/false);
  }
  auto* g = static_cast<float*>(buf);
  for (auto [lo, hi] : l.chunk_gaps[chunk]) {
    Status z = o_.ops->Zero(OpsLane::kTraining, g + lo, (hi - lo) * 4);
    if (!z.ok()) {
      Give(chunk, g);
      return z;
    }
  }
  for (TensorId id : l.chunk_tensors[chunk]) written_[id] = 0;
  held_[chunk] = g;
  return OkStatus();
}

void GradReducer::Submit(int chunk, bool final, bool last_micro_batch) {
  const Layout& l = *o_.layout;
  float* g = held_.at(chunk);
  held_.erase(chunk);
  // Tensors of the chunk that no backward use wrote since the buffer was taken (a frozen
  // module's, or one whose uses all came in another buffer) add nothing.
  Status zeroed;
  for (TensorId id : l.chunk_tensors[chunk]) {
    if (written_[id] || !zeroed.ok()) continue;
    const int64_t start = l.StartIn(id, chunk);  // the tensor's part in this chunk
    const int64_t lo = std::max<int64_t>(0, start);
    const int64_t hi = std::min(l.chunk_elems, start + l.tensors[id].numel);
    zeroed = o_.ops->Zero(OpsLane::kTraining, g + lo, (hi - lo) * 4);
  }
  const bool first = !in_window_[chunk];
  in_window_[chunk] = 1;
  if (final) final_[chunk] = 1;
  // Whether this is the window's last micro-batch is decided here, on the training
  // thread: the worker may run after the next micro-batch has begun.
  const bool last = final && last_micro_batch;
  if (!zeroed.ok()) {
    Give(chunk, g);
    std::promise<Status> failed;
    failed.set_value(zeroed);
    reduces_.push_back(failed.get_future().share());
    return;
  }
  reduces_.push_back(
      o_.worker->Submit([this, chunk, g, first, last] { return Reduce(chunk, g, first, last); }));
}

void GradReducer::CountUse(int chunk, bool follows, bool last_micro_batch) {
  if (--expected_[chunk] > 0 || !follows) return;
  Submit(chunk, /*final=*/true, last_micro_batch);
}

Status GradReducer::EndMicroBatch(bool last_micro_batch) {
  while (!held_.empty()) Submit(held_.begin()->first, /*final=*/true, last_micro_batch);
  if (!last_micro_batch) return OkStatus();
  for (int c = 0; c < o_.layout->num_chunks; ++c) {
    if (final_[c]) continue;
    STRATA_RETURN_IF_ERROR(Hold(c, {}));
    Submit(c, /*final=*/true, last_micro_batch);
  }
  return OkStatus();
}

// On the worker: reduces one chunk's gradients over the ranks and hands this rank's
// part to the sink.
Status GradReducer::Reduce(int chunk, float* grad, bool first_in_window, bool last) {
  const int64_t chunk_elems = o_.layout->chunk_elems;
  Status st;
  if (o_.compute == DType::kFp16) {
    // fp16 training reduces fp16 gradients: values past the fp16 range become inf here,
    // which is the overflow the loss scaler reacts to.
    st = o_.ops->RoundThroughFp16(OpsLane::kReduce, grad, chunk_elems);
  }
  const int64_t t0 = NowNs();
  const auto span_start = std::chrono::steady_clock::now();
  const float* part = grad + o_.opt_offset;
  if (st.ok() && o_.world_size > 1) {
    if (o_.stage <= 1) {
      st = o_.comm->AllReduce(grad, recv_, chunk_elems, DType::kF32, ReduceOp::kSum).Wait();
      part = recv_ + o_.opt_offset;
    } else {
      st = o_.comm->ReduceScatter(grad, recv_, o_.layout->shard_elems, DType::kF32, ReduceOp::kSum).Wait();
      part = recv_;
    }
    bytes_ += chunk_elems * 4;
  }
  busy_ns_ += NowNs() - t0;
  if (o_.timeline) {
    o_.timeline->Record(o_.track, "reduce chunk " + std::to_string(chunk), span_start,
                        std::chrono::steady_clock::now(), chunk_elems * 4);
  }
  if (st.ok()) st = sink_(chunk, part, first_in_window, last);
  Give(chunk, grad);
  return st.WithContext("reducing the gradients of chunk " + std::to_string(chunk));
}

Status GradReducer::PollDone() {
  while (!reduces_.empty() &&
         reduces_.front().wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    Status st = reduces_.front().get();
    reduces_.pop_front();
    STRATA_RETURN_IF_ERROR(st);
  }
  return OkStatus();
}

Status GradReducer::Wait() {
  Status first;
  while (!reduces_.empty()) {
    Status st = reduces_.front().get();
    reduces_.pop_front();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

void GradReducer::WaitRun() const {
  for (const auto& r : reduces_) r.wait();
}

void GradReducer::DropHeld() {
  for (auto& [chunk, g] : held_) Give(chunk, g);
  held_.clear();
}

void GradReducer::EndWindow() { std::fill(in_window_.begin(), in_window_.end(), 0); }

GradReducer::Counters GradReducer::TakeCounters() {
  return Counters{busy_ns_.exchange(0), bytes_.exchange(0)};
}

}  // namespace strata::zero
