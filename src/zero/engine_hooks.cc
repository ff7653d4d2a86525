// The hooks the model calls around each module: stage 3 gathers (with one module of
// prefetch), gradient buffers, and the asynchronous reduction of finished chunks.
//
// Every collective is issued by comm_worker in the order the training thread submits
// it; that order depends only on the model and the configuration, so it is the same
// on every rank (which is what makes the collectives match).
#include <chrono>
#include <cstring>

#include "strata/grad_stats.h"
#include "strata/half.h"
#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

void* Engine::Impl::ChunkParams(int chunk) {
  if (stage < 3) return static_cast<uint8_t*>(param_full) + chunk * layout.chunk_elems * csize;
  auto it = gathered.find(chunk);
  STRATA_CHECK_MSG(it != gathered.end(), "chunk used before it was gathered");
  return it->second.buf;
}

// Reads this rank's 16-bit shard of `chunk` from its tier into dst (device memory).
Status Engine::Impl::GatherNow(int chunk, void* dst) {
  const uint64_t bytes = layout.shard_elems * csize;
  int64_t t0 = NowNs();
  const auto span_start = std::chrono::steady_clock::now();
  Status st;
  switch (param_tier) {
    case ZeroTier::kDevice:
      st = device->CopyAsync(h2d, dst, param_shard[chunk].ptr, bytes, CopyDir::kDeviceToDevice);
      if (st.ok()) st = device->Synchronize(h2d);
      break;
    case ZeroTier::kHost: st = CopyToDevice(dst, param_shard[chunk].ptr, bytes); break;
    case ZeroTier::kNvme: {
      void* buf = param_staging.Take();
      auto h = param_store->Read(param_shard[chunk].slot, buf, bytes);
      st = h.ok() ? h->Wait() : h.status();
      if (st.ok()) {
        bytes_nvme_read += bytes;
        st = CopyToDevice(dst, buf, bytes);
      }
      param_staging.Give(buf);
      break;
    }
  }
  io_busy_ns += NowNs() - t0;
  Span(track_fetch, "fetch chunk " + std::to_string(chunk), span_start, bytes);
  return st.WithContext("fetching the parameter shard of chunk " + std::to_string(chunk));
}

void Engine::Impl::StartGather(int chunk) {
  Gathered g;
  g.buf = gather_pool.free.back();
  gather_pool.free.pop_back();
  const uint64_t shard_bytes = layout.shard_elems * csize;
  void* mine = static_cast<uint8_t*>(g.buf) + rank * shard_bytes;
  std::shared_future<Status> fetched = fetch_worker.Submit([this, chunk, mine] { return GatherNow(chunk, mine); });
  g.ready = comm_worker.Submit([this, fetched, g, mine, chunk] {
    STRATA_RETURN_IF_ERROR(fetched.get());
    int64_t t0 = NowNs();
    const auto span_start = std::chrono::steady_clock::now();
    Status st = world->AllGather(mine, g.buf, layout.shard_elems, compute).Wait();
    comm_busy_ns += NowNs() - t0;
    Span(track_comm, "all-gather chunk " + std::to_string(chunk), span_start, layout.chunk_elems * csize);
    bytes_comm += layout.chunk_elems * csize;
    return st;
  });
  gathered[chunk] = g;
}

Status Engine::Impl::EnsureGathered(int chunk) {
  if (!gathered.count(chunk)) {
    if (gather_pool.free.empty()) {
      // Reuse the buffer of a gathered chunk nobody uses now (the oldest prefetch).
      for (auto it = gathered.begin(); it != gathered.end(); ++it) {
        if (it->second.users == 0) {
          STRATA_RETURN_IF_ERROR(it->second.ready.get());
          gather_pool.free.push_back(it->second.buf);
          gathered.erase(it);
          break;
        }
      }
      if (gather_pool.free.empty()) {
        return OutOfBudgetError("engine: no free gather buffer for chunk " + std::to_string(chunk) + " (" +
                                std::to_string(gather_buffers) + " buffers, all in use); raise strata.device_budget");
      }
    }
    StartGather(chunk);
  }
  Gathered& g = gathered[chunk];
  STRATA_RETURN_IF_ERROR(g.ready.get());
  ++g.users;
  return OkStatus();
}

// Drops gathered chunks that neither `module` (still running) nor `next_module` needs.
void Engine::Impl::ReleaseGathered(int module, int next_module) {
  for (int c : layout.module_chunks[module]) --gathered[c].users;
  const std::vector<int>* keep = next_module >= 0 ? &layout.module_chunks[next_module] : nullptr;
  for (auto it = gathered.begin(); it != gathered.end();) {
    bool needed = keep && std::find(keep->begin(), keep->end(), it->first) != keep->end();
    // Releasing does not depend on timing (that would let ranks diverge in the order
    // of later collectives): a chunk still in flight is waited for.
    if (it->second.users == 0 && !needed) {
      Status st = it->second.ready.get();
      if (!st.ok()) {
        STRATA_LOG(kError, "engine") << "gather of chunk " << it->first << " failed: " << st.ToString();
      }
      gather_pool.free.push_back(it->second.buf);
      it = gathered.erase(it);
    } else {
      ++it;
    }
  }
}

Status Engine::BeginMicroBatch() {
  Impl& s = *impl_;
  if (s.in_micro_batch) ++s.micro_batch;
  s.in_micro_batch = true;
  if (s.micro_batch >= s.config.gradient_accumulation_steps) {
    return FailedPreconditionError("engine: " + std::to_string(s.micro_batch + 1) +
                                   " micro-batches without Step(); gradient_accumulation_steps is " +
                                   std::to_string(s.config.gradient_accumulation_steps));
  }
  return OkStatus();
}

Result<model::ModuleParams> Engine::BeforeForward(int module) {
  Impl& s = *impl_;
  if (module < 0 || module >= static_cast<int>(s.modules.size())) {
    return InvalidArgumentError("engine: module index " + std::to_string(module) + " out of range");
  }
  if (!s.in_micro_batch) STRATA_RETURN_IF_ERROR(BeginMicroBatch());
  if (s.stage == 3) {
    for (int c : s.layout.module_chunks[module]) STRATA_RETURN_IF_ERROR(s.EnsureGathered(c));
    // Prefetch the next module's chunks while this one computes, as buffers allow.
    if (module + 1 < static_cast<int>(s.modules.size())) {
      for (int c : s.layout.module_chunks[module + 1]) {
        if (!s.gathered.count(c) && !s.gather_pool.free.empty()) s.StartGather(c);
      }
    }
  }
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
  s.Span(s.track_compute, "forward " + s.modules[module].name, s.module_start);
  if (s.stage == 3) {
    int last = static_cast<int>(s.modules.size()) - 1;
    s.ReleaseGathered(module, module < last ? module + 1 : module);
  }
  return OkStatus();
}

Result<model::ModuleBackward> Engine::BeforeBackward(int module) {
  Impl& s = *impl_;
  if (module < 0 || module >= static_cast<int>(s.modules.size())) {
    return InvalidArgumentError("engine: module index " + std::to_string(module) + " out of range");
  }
  if (s.stage == 3) {
    for (int c : s.layout.module_chunks[module]) STRATA_RETURN_IF_ERROR(s.EnsureGathered(c));
    if (module > 0) {
      for (int c : s.layout.module_chunks[module - 1]) {
        if (!s.gathered.count(c) && !s.gather_pool.free.empty()) s.StartGather(c);
      }
    }
  }
  model::ModuleBackward b;
  b.params.dtype = s.compute;
  b.grads.accumulate = false;
  for (int c : s.layout.module_chunks[module]) {
    if (s.grad_bufs.count(c)) continue;
    // Blocks only until an earlier chunk's reduction hands its buffer back.
    auto* g = static_cast<float*>(s.grad_pool.Take());
    for (auto [lo, hi] : s.layout.chunk_gaps[c]) std::memset(g + lo, 0, (hi - lo) * 4);
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
  s.Span(s.track_compute, "backward " + s.modules[module].name, s.module_start);
  if (s.stage == 3) s.ReleaseGathered(module, module - 1);
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
    STRATA_RETURN_IF_ERROR(st);
  }
  return OkStatus();
}

// Runs on comm_worker: reduces one chunk's gradients over the ranks and adds this
// rank's part to its gradient shard on the optimizer's tier.
Status Engine::Impl::ReduceChunk(int chunk, float* grad, int micro_batch_index, bool last_micro_batch) {
  const int64_t chunk_elems = layout.chunk_elems;
  if (compute == DType::kFp16) {
    // fp16 training reduces fp16 gradients: values past the fp16 range become inf here,
    // which is the overflow the loss scaler reacts to.
    for (int64_t i = 0; i < chunk_elems; ++i) grad[i] = Fp16ToFloat(FloatToFp16(grad[i]));
  }
  int64_t t0 = NowNs();
  const auto span_start = std::chrono::steady_clock::now();
  Status st;
  const float* part;
  if (world_size == 1) {
    part = grad + opt_offset;
  } else if (stage <= 1) {
    st = world->AllReduce(grad, reduce_recv, chunk_elems, DType::kF32, ReduceOp::kSum).Wait();
    part = reduce_recv + opt_offset;
    bytes_comm += chunk_elems * 4;
  } else {
    st = world->ReduceScatter(grad, reduce_recv, layout.shard_elems, DType::kF32, ReduceOp::kSum).Wait();
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
  if (st.ok()) {
    float* dst = opt[chunk].grad;
    for (int64_t i = 0; i < opt_elems; ++i) dst[i] += part[i];
  }
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
