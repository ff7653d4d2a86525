// Gradient buffers and their reduction: each chunk's fp32 gradients are gathered in a
// device buffer over the backward uses of its tensors, then reduced over the ranks
// (all-reduce at stages 0-1, reduce-scatter at 2-3) and added into this rank's gradient
// shard on the optimizer's tier.
//
// A chunk is reduced when its last backward use of the micro-batch is done (counted
// from the recorded call order, engine_hooks.cc), else at the micro-batch's end. A
// buffer may also be reduced early, as a partial sum, when a module needs one and none
// is free: reductions add, so the gradient shard is the same. In the window's last
// micro-batch every chunk gets exactly one final reduction (a zero one for a chunk no
// backward touched), which is what starts its speculative step and takes its stats.
#include <chrono>

#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

void Engine::Impl::GiveGradBuffer(int chunk, float* g) {
  if (!layout.InRun(chunk)) return grad_pool.Give(g);
  {
    std::lock_guard lock(run_grad_mu);
    run_grad_busy[chunk] = 0;
  }
  run_grad_cv.notify_all();
}

Status Engine::Impl::HoldGradBuffer(int chunk, const std::vector<int>& in_use) {
  void* buf = nullptr;
  if (layout.InRun(chunk)) {
    // Its place is its own: free once the last reduction from it is done.
    std::unique_lock lock(run_grad_mu);
    run_grad_cv.wait(lock, [&] { return !run_grad_busy[chunk]; });
    run_grad_busy[chunk] = 1;
    buf = run_grad[chunk];
  }
  while (buf == nullptr && (buf = grad_pool.TryTake()) == nullptr) {
    // A reduction gives its buffer back before its future is ready, and another take may
    // already have had that buffer: wait for the reduction itself, then look again, never
    // for the pool (which may get nothing more).
    auto running = std::find_if(reduces.begin(), reduces.end(), [](const std::shared_future<Status>& r) {
      return r.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
    });
    if (running != reduces.end()) {
      running->wait();
      continue;
    }
    // Nothing in flight: every buffer not held below is in the pool.
    if ((buf = grad_pool.TryTake()) != nullptr) break;
    // Every buffer is held by a chunk waiting for more backward uses (a tied tensor's
    // chunk, or a micro-batch off the recording): reduce one that this use does not need
    // now as a partial sum; its reduction then runs, and the loop waits for it.
    auto victim = std::find_if(grad_bufs.begin(), grad_bufs.end(), [&](const auto& held) {
      return !layout.InRun(held.first) &&  // a run chunk's place frees no buffer
             std::find(in_use.begin(), in_use.end(), held.first) == in_use.end();
    });
    if (victim == grad_bufs.end()) {
      return OutOfBudgetError("engine: no free gradient buffer for chunk " + std::to_string(chunk) + " (" +
                              std::to_string(grad_buffers) +
                              " buffers, all held by chunks of the same use); raise strata.device_budget");
    }
    SubmitReduce(victim->first, /*final=*/false);
  }
  auto* g = static_cast<float*>(buf);
  for (auto [lo, hi] : layout.chunk_gaps[chunk]) {
    Status z = ops->Zero(zero::OpsLane::kTraining, g + lo, (hi - lo) * 4);
    if (!z.ok()) {
      GiveGradBuffer(chunk, g);
      return z;
    }
  }
  for (TensorId id : layout.chunk_tensors[chunk]) grad_written[id] = 0;
  grad_bufs[chunk] = g;
  return OkStatus();
}

void Engine::Impl::SubmitReduce(int chunk, bool final) {
  float* g = grad_bufs.at(chunk);
  grad_bufs.erase(chunk);
  // Tensors of the chunk that no backward use wrote since the buffer was taken (a frozen
  // module's, or one whose uses all came in another buffer) add nothing.
  Status zeroed;
  for (TensorId id : layout.chunk_tensors[chunk]) {
    if (grad_written[id] || !zeroed.ok()) continue;
    const int64_t start = layout.StartIn(id, chunk);  // the tensor's part in this chunk
    const int64_t lo = std::max<int64_t>(0, start);
    const int64_t hi = std::min(layout.chunk_elems, start + layout.tensors[id].numel);
    zeroed = ops->Zero(zero::OpsLane::kTraining, g + lo, (hi - lo) * 4);
  }
  const bool first = !reduced_in_window[chunk];
  reduced_in_window[chunk] = 1;
  if (final) reduced_final[chunk] = 1;
  // Whether this is the window's last micro-batch is decided here, on the training
  // thread: the worker may run after the next micro-batch has begun.
  const bool last = final && LastMicroBatch();
  if (!zeroed.ok()) {
    GiveGradBuffer(chunk, g);
    std::promise<Status> failed;
    failed.set_value(zeroed);
    reduces.push_back(failed.get_future().share());
    return;
  }
  reduces.push_back(
      comm_worker.Submit([this, chunk, g, first, last] { return ReduceChunk(chunk, g, first, last); }));
}

Status Engine::Impl::EndMicroBatch() {
  if (open_backward >= 0) {
    return FailedPreconditionError("engine: the micro-batch ended while the backward of module \"" +
                                   model.modules[open_backward].name +
                                   "\" is open (BeginBackward without EndBackward)");
  }
  // In chunk order (grad_bufs is ordered), the same on every rank.
  while (!grad_bufs.empty()) SubmitReduce(grad_bufs.begin()->first, /*final=*/true);
  if (LastMicroBatch()) {
    for (int c = 0; c < layout.num_chunks; ++c) {
      if (reduced_final[c]) continue;
      STRATA_RETURN_IF_ERROR(HoldGradBuffer(c, {}));
      SubmitReduce(c, /*final=*/true);
    }
  }
  if (std::optional<std::string> change = order->EndMicroBatch()) STRATA_LOG(kInfo, "engine") << *change;
  return OkStatus();
}

// Runs on comm_worker: reduces one chunk's gradients over the ranks and adds this
// rank's part to its gradient shard on the optimizer's tier.
Status Engine::Impl::ReduceChunk(int chunk, float* grad, bool first_in_window, bool last_micro_batch) {
  const int64_t chunk_elems = layout.chunk_elems;
  Status st;
  if (compute == DType::kFp16) {
    // fp16 training reduces fp16 gradients: values past the fp16 range become inf here,
    // which is the overflow the loss scaler reacts to.
    st = ops->RoundThroughFp16(zero::OpsLane::kReduce, grad, chunk_elems);
    if (!st.ok()) {
      GiveGradBuffer(chunk, grad);
      return st.WithContext("reducing the gradients of chunk " + std::to_string(chunk));
    }
  }
  int64_t t0 = NowNs();
  const auto span_start = std::chrono::steady_clock::now();
  const float* part;
  if (world_size == 1) {
    part = grad + opt_offset;
  } else if (stage <= 1) {
    st = device_comm->AllReduce(grad, reduce_recv, chunk_elems, DType::kF32, ReduceOp::kSum).Wait();
    part = reduce_recv + opt_offset;
    bytes_comm += chunk_elems * 4;
  } else {
    st =
        device_comm->ReduceScatter(grad, reduce_recv, layout.shard_elems, DType::kF32, ReduceOp::kSum).Wait();
    part = reduce_recv;
    bytes_comm += chunk_elems * 4;
  }
  comm_busy_ns += NowNs() - t0;
  Span(track_comm, "reduce chunk " + std::to_string(chunk), span_start, chunk_elems * 4);
  const ZeroTier tier = GradTierOf(chunk);
  if (st.ok() && tier == ZeroTier::kNvme) {
    st = AccumulateGradOnNvme(chunk, part, first_in_window, last_micro_batch);  // speculates itself
    GiveGradBuffer(chunk, grad);
    return st.WithContext("reducing the gradients of chunk " + std::to_string(chunk));
  }
  if (st.ok()) {
    st = tier == ZeroTier::kHost
             ? AccumulateToHost(opt[chunk].grad, part)
             : OpsOn(tier).Accumulate(zero::OpsLane::kReduce, opt[chunk].grad, part, opt_elems);
  }
  GiveGradBuffer(chunk, grad);
  if (!st.ok()) return st.WithContext("reducing the gradients of chunk " + std::to_string(chunk));
  if (last_micro_batch) MaybeSpeculate(chunk);
  return OkStatus();
}

Status Engine::Impl::WaitReduces() {
  Status first;
  while (!reduces.empty()) {
    Status st = reduces.front().get();
    reduces.pop_front();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

}  // namespace strata
