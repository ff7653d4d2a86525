// The hooks the model calls around each module: stage 3 gathers (engine_gather.cc),
// gradient buffers, and the asynchronous reduction of finished chunks.
//
// Every collective is issued by comm_worker in the order the training thread submits
// it; that order depends only on the model and the configuration, so it is the same
// on every rank (which is what makes the collectives match).
#include <chrono>

#include "strata/grad_stats.h"
#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

Status Engine::BeginMicroBatch() {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  if (s.in_micro_batch) ++s.micro_batch;
  s.in_micro_batch = true;
  if (s.micro_batch >= s.config.gradient_accumulation_steps) {
    return FailedPreconditionError("engine: " + std::to_string(s.micro_batch + 1) +
                                   " micro-batches without Step(); gradient_accumulation_steps is " +
                                   std::to_string(s.config.gradient_accumulation_steps));
  }
  return OkStatus();
}

Status Engine::Impl::CheckModule(int module) const {
  if (module >= 0 && module < static_cast<int>(modules.size())) return OkStatus();
  return InvalidArgumentError("engine: module index " + std::to_string(module) + " out of range: the model registered " +
                              std::to_string(modules.size()) + " modules");
}

Status Engine::Impl::EnterModule(int module, int pos) {
  if (stage != 3) return OkStatus();
  for (int c : layout.module_chunks[module]) STRATA_RETURN_IF_ERROR(EnsureGathered(c));
  Prefetch(pos);
  return OkStatus();
}

Result<model::ModuleParams> Engine::BeforeForward(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  if (!s.in_micro_batch) STRATA_RETURN_IF_ERROR(BeginMicroBatch());
  STRATA_RETURN_IF_ERROR(s.FailHook(s.EnterModule(module, s.ForwardPos(module)), "BeforeForward", module));
  if (module == 0 && s.LastMicroBatch()) s.ReadStatesAhead();
  model::ModuleParams p;
  p.dtype = s.compute;
  for (const auto& t : s.layout.tensors[module]) {
    p.tensors.push_back(static_cast<uint8_t*>(s.ChunkParams(t.chunk)) + t.offset * s.csize);
  }
  s.module_start = std::chrono::steady_clock::now();
  return p;
}

Status Engine::AfterForward(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  s.Span(s.track_compute, "forward " + s.modules[module].name, s.module_start);
  s.TimeModule();
  if (s.stage == 3) {
    // A released gather buffer may be refilled at once: the module's kernels must be done.
    STRATA_RETURN_IF_ERROR(s.FailHook(s.ops->WaitForModel(), "AfterForward", module));
    s.ReleaseGathered(module, s.ForwardPos(module));
  }
  return OkStatus();
}

Result<model::ModuleBackward> Engine::BeforeBackward(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  STRATA_RETURN_IF_ERROR(s.FailHook(s.EnterModule(module, s.BackwardPos(module)), "BeforeBackward", module));
  model::ModuleBackward b;
  b.params.dtype = s.compute;
  b.grads.accumulate = false;
  for (int c : s.layout.module_chunks[module]) {
    if (s.grad_bufs.count(c)) continue;
    // Blocks only until an earlier chunk's reduction hands its buffer back.
    auto* g = static_cast<float*>(s.grad_pool.Take());
    for (auto [lo, hi] : s.layout.chunk_gaps[c]) {
      Status z = s.ops->Zero(zero::OpsLane::kTraining, g + lo, (hi - lo) * 4);
      if (!z.ok()) {
        s.grad_pool.Give(g);
        return s.FailHook(z, "BeforeBackward", module);
      }
    }
    s.grad_bufs[c] = g;
    s.chunk_pending_modules[c] = s.layout.chunk_module_count[c];
  }
  for (const auto& t : s.layout.tensors[module]) {
    b.params.tensors.push_back(static_cast<uint8_t*>(s.ChunkParams(t.chunk)) + t.offset * s.csize);
    b.grads.tensors.push_back(s.grad_bufs[t.chunk] + t.offset);
  }
  s.module_start = std::chrono::steady_clock::now();
  return b;
}

Status Engine::AfterBackward(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  s.Span(s.track_compute, "backward " + s.modules[module].name, s.module_start);
  s.TimeModule();
  // The reductions below read the module's gradients; a released gather buffer may be
  // refilled at once.
  STRATA_RETURN_IF_ERROR(s.FailHook(s.ops->WaitForModel(), "AfterBackward", module));
  if (s.stage == 3) s.ReleaseGathered(module, s.BackwardPos(module));
  for (int c : s.layout.module_chunks[module]) {
    if (--s.chunk_pending_modules[c] > 0) continue;
    float* g = s.grad_bufs[c];
    s.grad_bufs.erase(c);
    // Whether this is the window's last micro-batch is decided here, on the training
    // thread: the worker may run after the next micro-batch has begun.
    const bool last = s.LastMicroBatch();
    const int index = s.micro_batch;
    s.reduces.push_back(s.comm_worker.Submit([&s, c, g, index, last] { return s.ReduceChunk(c, g, index, last); }));
  }
  // Keep the queue short: drop finished reductions, surfacing their errors now.
  while (!s.reduces.empty() &&
         s.reduces.front().wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    Status st = s.reduces.front().get();
    s.reduces.pop_front();
    STRATA_RETURN_IF_ERROR(s.FailHook(st, "AfterBackward", module));
  }
  return OkStatus();
}

// Runs on comm_worker: reduces one chunk's gradients over the ranks and adds this
// rank's part to its gradient shard on the optimizer's tier.
Status Engine::Impl::ReduceChunk(int chunk, float* grad, int micro_batch_index, bool last_micro_batch) {
  const int64_t chunk_elems = layout.chunk_elems;
  Status st;
  if (compute == DType::kFp16) {
    // fp16 training reduces fp16 gradients: values past the fp16 range become inf here,
    // which is the overflow the loss scaler reacts to.
    st = ops->RoundThroughFp16(zero::OpsLane::kReduce, grad, chunk_elems);
    if (!st.ok()) {
      grad_pool.Give(grad);
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
    st = device_comm->ReduceScatter(grad, reduce_recv, layout.shard_elems, DType::kF32, ReduceOp::kSum).Wait();
    part = reduce_recv;
    bytes_comm += chunk_elems * 4;
  }
  comm_busy_ns += NowNs() - t0;
  Span(track_comm, "reduce chunk " + std::to_string(chunk), span_start, chunk_elems * 4);
  if (st.ok() && grad_tier == ZeroTier::kNvme) {
    st = AccumulateGradOnNvme(chunk, part, micro_batch_index, last_micro_batch);  // speculates itself
    grad_pool.Give(grad);
    return st.WithContext("reducing the gradients of chunk " + std::to_string(chunk));
  }
  if (st.ok() && grad_tier == ZeroTier::kHost) {
    st = CopyToHost(host_recv, part, opt_elems * 4);
    part = host_recv;
  }
  if (st.ok()) st = OpsOn(grad_tier).Accumulate(zero::OpsLane::kReduce, opt[chunk].grad, part, opt_elems);
  grad_pool.Give(grad);
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
