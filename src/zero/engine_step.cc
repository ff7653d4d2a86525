// The optimizer step: global norm and overflow, speculative steps during backward and
// their commit or redo, the pipelined NVMe path, and putting the updated compute
// parameters where the next forward reads them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "strata/grad_stats.h"
#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

// Where the optimizer writes a chunk's updated compute values: straight into device
// memory when the optimizer state lives there, else into a pinned staging buffer that
// PublishParams moves on.
void* Engine::Impl::Out16Target(int chunk, bool* on_host) {
  if (param_from_master) {
    // No compute copy to write: the master is the shard (a resident chunk's gathers copy
    // it from memory), and a staging buffer may be smaller than a shard (stream_pieces).
    *on_host = false;
    return nullptr;
  }
  if (OptTierOf(chunk) == ZeroTier::kDevice && stage < 3) {
    *on_host = false;
    return static_cast<uint8_t*>(param_full) + (chunk * layout.chunk_elems + opt_offset) * csize;
  }
  *on_host = true;
  if (StreamsCompute()) {
    out16_scratch.resize(opt_elems * csize);
    return out16_scratch.data();
  }
  return param_staging.Take();
}

void Engine::Impl::ReleaseOut16(void* out, bool on_host) {
  if (on_host && out != out16_scratch.data()) param_staging.Give(out);
}

// Moves this rank's updated compute values of `chunk` (opt_elems of them at src) to
// where the next forward reads them. from_host: src is pinned host memory.
Status Engine::Impl::PublishParams(int chunk, const void* src, bool from_host) {
  const uint64_t bytes = opt_elems * csize;
  if (stage < 3) {
    void* dst = static_cast<uint8_t*>(param_full) + (chunk * layout.chunk_elems + opt_offset) * csize;
    if (!from_host) return OkStatus();  // written in place on the device
    return CopyToDevice(dst, src, bytes);
  }
  switch (ParamTierOf(chunk)) {
    case ZeroTier::kDevice:
      if (from_host) return CopyToDevice(param_shard[chunk].ptr, src, bytes);
      return ops->Copy(zero::OpsLane::kOptimizer, param_shard[chunk].ptr, src, bytes);
    case ZeroTier::kHost: std::memcpy(param_shard[chunk].ptr, src, bytes); return OkStatus();
    case ZeroTier::kNvme: {
      SetFresh(chunk, nullptr);  // a shard written behind earlier is stale now
      // The gather reads the committed master itself (SyncParamSource points at it).
      if (param_from_master) return OkStatus();
      if (StreamsCompute()) return WriteShardPieces(chunk, static_cast<const uint8_t*>(src));
      auto h = param_store->Write(param_shard[chunk].slot, src, bytes);
      STRATA_RETURN_IF_ERROR((h.ok() ? h->Wait() : h.status()).WithContext("writing parameters to NVMe"));
      bytes_nvme_written += bytes;
      return OkStatus();
    }
  }
  return OkStatus();
}

zero::OptimizerStep Engine::Impl::StepArgs(int chunk, float grad_scale, bool speculative, int next_chunk) {
  zero::OptimizerStep a;
  a.chunk = chunk;
  a.adam = adam;
  a.adam.grad_scale = grad_scale;
  a.compute = compute;
  a.speculative = speculative;
  a.next_chunk = next_chunk;
  a.overlap = overlap;
  a.epoch = step_epoch;
  a.arena = speculative ? &*speculation_arena : nullptr;
  return a;
}

Status Engine::Impl::StepChunk(int chunk, float grad_scale, bool speculative, int next_chunk,
                               const float* grad, bool publish, bool* updated) {
  if (OptTierOf(chunk) == ZeroTier::kNvme)
    return StepChunkNvme(chunk, grad_scale, speculative, next_chunk, grad);
  OptChunk& o = opt[chunk];
  zero::MemoryOptimizer& backend = MemoryBackend(chunk);
  if (grad == nullptr) grad = o.grad;
  // No room to keep the old state: the chunk steps in Step(). Only this thread takes spares.
  if (speculative && !backend.HasSpare()) return OkStatus();
  int64_t t0 = NowNs();
  const auto span_start = std::chrono::steady_clock::now();
  bool on_host;
  void* out = Out16Target(chunk, &on_host);
  // A device that cannot write host memory computes into out16_device first. Only one
  // thread steps at a time (the optimizer worker is drained before Step() steps).
  void* step_out =
      backend.tier() == ZeroTier::kDevice && on_host && out16_device != nullptr ? out16_device : out;
  Result<bool> stepped = backend.Step(StepArgs(chunk, grad_scale, speculative, next_chunk), grad, step_out);
  Status s = stepped.status();
  if (updated) *updated = s.ok();
  if (s.ok() && *stepped && step_out != out && publish) {
    s = ops->ReadToHost(zero::OpsLane::kOptimizer, out, step_out, opt_elems * csize);
  }
  opt_busy_ns += NowNs() - t0;
  Span(track_optimizer,
       std::string(speculative ? "step (speculative) chunk " : "step chunk ") + std::to_string(chunk),
       span_start);
  const bool taken = stepped.ok() && *stepped;
  if (s.ok() && taken && publish) s = PublishParams(chunk, out, on_host);
  ReleaseOut16(out, on_host);
  if (speculative && taken) {
    o.has_pending = true;
    o.speculated = true;
    ++speculative_count;
  }
  return s.WithContext("optimizer step of chunk " + std::to_string(chunk));
}

// Runs on comm_worker once the chunk's gradient shard is final.
void Engine::Impl::MaybeSpeculate(int chunk, const float* grad, std::function<Status()> done) {
  // A resident chunk of the NVMe optimizer has no spare state to step into (the room
  // went to residency): it steps in place in Step(), one pass over memory. So does a
  // device chunk of a CPU optimizer: the spares are host memory.
  if (!overlap || StepsInPlace(chunk)) return;
  const float scale = scaler->grad_scale();
  opt[chunk].spec_done = opt_worker.Submit([this, chunk, scale, grad, done] {
    Status s = [&]() -> Status {
      // A shard on NVMe had its stats taken on its way there (engine_grads.cc).
      if (grad == nullptr && GradTierOf(chunk) != ZeroTier::kNvme) {
        const auto check_start = std::chrono::steady_clock::now();
        const GradShard shard{GradView{opt[chunk].grad, DType::kF32}, static_cast<size_t>(opt_elems)};
        auto stats = OpsOn(GradTierOf(chunk))
                         .ComputeStats(zero::OpsLane::kOptimizer, {&shard, 1}, &*speculation_arena);
        Span(track_optimizer, "grad check (speculative) chunk " + std::to_string(chunk), check_start);
        if (!stats.ok()) return stats.status();
        if (stats->has_inf_nan) return OkStatus();  // this step will be skipped anyway
      }
      // Backward finishes chunks in descending order: read the one below ahead.
      return StepChunk(chunk, scale, /*speculative=*/true, chunk - 1, grad);
    }();
    if (done) {
      Status d = done();
      if (s.ok()) s = d;
    }
    return s;
  });
}

Status Engine::Impl::CommitChunk(int chunk) {
  OptChunk& o = opt[chunk];
  if (!o.has_pending) return OkStatus();
  // NVMe: current once its writes are on disk (SettleCommit).
  Backend(chunk).Commit(chunk, step_epoch);
  if (OptTierOf(chunk) == ZeroTier::kNvme) SyncParamSource(chunk);
  o.has_pending = false;
  return OkStatus();
}

// Forgets a speculative result. The compute copy it published is stale then; the
// caller either steps the chunk again (which republishes) or calls RestoreParams.
Status Engine::Impl::DiscardChunk(int chunk) {
  OptChunk& o = opt[chunk];
  if (!o.has_pending) return OkStatus();
  Backend(chunk).Discard(chunk);
  o.has_pending = false;
  return OkStatus();
}

// Republishes the compute copy from the committed master (after a skipped step whose
// speculation had already published new values).
Status Engine::Impl::RestoreParams(int chunk) {
  if (param_from_master) {
    // The next gather reads the committed master; only the copy kept in memory is stale.
    SetFresh(chunk, nullptr);
    return OkStatus();
  }
  std::vector<float> master(opt_elems);
  if (OptTierOf(chunk) == ZeroTier::kNvme) {
    STRATA_RETURN_IF_ERROR(WaitNvmeWrites());
    STRATA_RETURN_IF_ERROR(nvme_opt->DropReads());
  }
  STRATA_RETURN_IF_ERROR(Backend(chunk).ReadMaster(chunk, master.data()));
  bool on_host;
  void* out = Out16Target(chunk, &on_host);
  // The compute copy is rounded on the host; off the host it goes up afterwards.
  std::vector<uint8_t> staged(on_host ? 0 : opt_elems * csize);
  void* rounded = on_host ? out : staged.data();
  if (compute == DType::kF32) {
    std::memcpy(rounded, master.data(), opt_elems * 4);
  } else {
    model::FromFloat(master.data(), opt_elems, compute, rounded);
  }
  Status s =
      on_host ? OkStatus() : ops->WriteFromHost(zero::OpsLane::kTraining, out, rounded, opt_elems * csize);
  if (s.ok()) s = PublishParams(chunk, out, on_host);
  ReleaseOut16(out, on_host);
  return s;
}

Status Engine::Flush() {
  Impl& s = *impl_;
  if (s.in_micro_batch) {
    return FailedPreconditionError("engine: Flush() inside a micro-batch; call it after Step()");
  }
  s.opt_worker.Drain();
  if (s.opt_tier != ZeroTier::kNvme) return OkStatus();
  // After a failed step its writes were waited for and logged (AbandonStep).
  Status first = s.WaitNvmeWrites(/*report=*/s.failed.ok());
  for (int c = 0; c < s.layout.num_chunks; ++c) {
    Status st = s.nvme_opt->SettleCommit(c);
    if (first.ok() && !st.ok()) first = st;
  }
  return s.FailBehind(first);
}

Result<GradStats> Engine::Impl::LocalGradStats() {
  GradStats all;
  // The shards in memory, by the tier whose ops read them.
  std::vector<GradShard> on_host, on_device;
  for (int c = 0; c < layout.num_chunks; ++c) {
    const ZeroTier tier = GradTierOf(c);
    if (tier == ZeroTier::kNvme) {
      all.Merge(opt[c].grad_stats);  // taken before the shard went to disk
      continue;
    }
    const GradShard shard{GradView{opt[c].grad, DType::kF32}, static_cast<size_t>(opt_elems)};
    (tier == ZeroTier::kDevice ? on_device : on_host).push_back(shard);
  }
  for (ZeroTier tier : {ZeroTier::kDevice, ZeroTier::kHost}) {
    const std::vector<GradShard>& shards = tier == ZeroTier::kDevice ? on_device : on_host;
    if (shards.empty()) continue;
    STRATA_ASSIGN_OR_RETURN(GradStats held, OpsOn(tier).ComputeStats(zero::OpsLane::kTraining, shards));
    all.Merge(held);
  }
  return all;
}

Status Engine::Impl::AllGatherParams() {
  if (stage == 0 || stage == 3 || world_size == 1) return OkStatus();
  std::vector<std::shared_future<Status>> done;
  for (int c = 0; c < layout.num_chunks; ++c) {
    uint8_t* chunk = static_cast<uint8_t*>(param_full) + c * layout.chunk_elems * csize;
    done.push_back(comm_worker.Submit([this, chunk] {
      int64_t t0 = NowNs();
      Status s =
          device_comm->AllGather(chunk + opt_offset * csize, chunk, layout.shard_elems, compute).Wait();
      comm_busy_ns += NowNs() - t0;
      bytes_comm += layout.chunk_elems * csize;
      return s;
    }));
  }
  Status first;
  for (auto& f : done) {
    Status s = f.get();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

Result<StepResult> Engine::Step() {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.RefuseWhileEvaluating("Step"));
  STRATA_RETURN_IF_ERROR(s.CheckHooksDone());
  // Commits record the step_epoch they were made at; StepOnce moves it on at its end.
  const int64_t stepping = s.step_epoch;
  auto r = s.StepOnce();
  if (!r.ok()) s.AbandonStep(r.status(), "Step()", stepping);
  return r;
}

void Engine::Impl::MarkFailed(const Status& why, std::string call) {
  failed = why;
  failed_call = std::move(call);
  const std::string what = failed_call + " failed (" + failed.ToString() + ")";
  if (world != nullptr && world->size() > 1) world->PostFailure(what);
  // The peers may be waiting in a device collective (NCCL), which watches its own board.
  if (device_comm != nullptr && device_comm != world && device_comm->size() > 1)
    device_comm->PostFailure(what);
}

Status Engine::Impl::FailBehind(Status st) {
  if (st.ok() || !failed.ok()) return st;
  MarkFailed(st, "write behind Step()");
  STRATA_LOG(kError, "engine") << "a write behind Step() failed; the step it belonged to is undone: "
                               << st.ToString();
  return st;
}

Status Engine::Impl::RefuseAfterFailure() const {
  if (failed.ok()) return OkStatus();
  return FailedPreconditionError("engine: an earlier " + failed_call + " failed (" + failed.ToString() +
                                 "); GatherMaster still reads a whole step's parameters (see Engine::Step); "
                                 "create a new engine to train on");
}

Status Engine::Impl::FailHook(Status st, std::string_view hook, int module) {
  if (st.ok() || !failed.ok()) return st;
  std::string call = std::string(hook) + "(" + std::to_string(module) + ")";
  // Said before the waits below: with several ranks they last until the peers' matching
  // collectives run, which a failed peer may never do.
  STRATA_LOG(kError, "engine") << call << " failed, abandoning the step: " << st.ToString();
  // Speculation during the backward commits nothing (StepOnce does, before it moves the
  // step epoch on): AbandonStep drops the pending results; the current epoch has no
  // commits yet to roll back.
  AbandonStep(st, std::move(call), step_epoch);
  return st;
}

void Engine::Impl::AbandonStep(const Status& why, std::string call, int64_t stepping) {
  MarkFailed(why, std::move(call));  // before the waits below, which may need the peers' collectives
  // Reductions still queued would go on writing gradient shards and speculating. Their
  // errors are this failure's consequences: the first one was reported.
  (void)reducer->Wait();
  reducer->DropHeld();
  open_backward = -1;
  opt_worker.Drain();
  for (auto& o : opt) {
    if (o.spec_done.valid()) (void)o.spec_done.get();
    o.spec_done = {};
  }
  gatherer->DropUnheld();
  if (opt_tier == ZeroTier::kNvme) {
    (void)nvme_opt->DropReads();
    // A write of the step before this one that failed now is a result lost as well.
    Status lost = WaitNvmeWrites();
    if (!lost.ok()) STRATA_LOG(kError, "engine") << "after the failed step: " << lost.ToString();
    nvme_opt->RollBack(stepping);  // this step's commits
    for (auto& o : opt) o.has_pending = false;
  }
  in_micro_batch = false;
}

Status Engine::GatherMaster(TensorId tensor, std::vector<float>* out) {
  Impl& s = *impl_;
  if (tensor < 0 || tensor >= static_cast<int>(s.layout.tensors.size())) {
    return InvalidArgumentError("engine: GatherMaster of tensor id " + std::to_string(tensor) +
                                ": the model declared " + std::to_string(s.layout.tensors.size()) +
                                " tensors");
  }
  const zero::Layout& l = s.layout;
  out->clear();
  out->reserve(l.tensors[tensor].numel);
  // Chunk by chunk: a tensor larger than a chunk lies in a run of them.
  for (int chunk = l.FirstChunk(tensor); chunk <= l.LastChunk(tensor); ++chunk) {
    std::vector<float> full;
    STRATA_RETURN_IF_ERROR(s.GatherChunkMaster(chunk, tensor, full));
    const int64_t start = l.StartIn(tensor, chunk);
    const int64_t lo = std::max<int64_t>(0, start),
                  hi = std::min(l.chunk_elems, start + l.tensors[tensor].numel);
    out->insert(out->end(), full.begin() + lo, full.begin() + hi);
  }
  return OkStatus();
}

// The whole chunk's master values, on every rank.
Status Engine::Impl::GatherChunkMaster(int chunk, TensorId tensor, std::vector<float>& full) {
  Impl& s = *this;
  // This rank's master values of the chunk, placed in a zeroed full chunk, summed over
  // the ranks (each position is owned by exactly one rank; stage 0: rank 0's copy).
  full.assign(s.layout.chunk_elems, 0.0f);
  if (s.stage > 0 || s.rank == 0) {
    if (s.OptTierOf(chunk) == ZeroTier::kNvme) {
      // The optimizer worker owns the staging pool and the writes during a micro-batch.
      // A reduction that failed leaves the window without its gradients, as in a hook.
      STRATA_RETURN_IF_ERROR(s.FailHook(s.reducer->Wait(), "GatherMaster", tensor));
      s.opt_worker.Drain();
      STRATA_RETURN_IF_ERROR(s.FailBehind(s.WaitNvmeWrites(/*report=*/s.failed.ok())));
    }
    STRATA_RETURN_IF_ERROR(s.Backend(chunk).ReadMaster(chunk, full.data() + s.opt_offset));
  }
  if (s.world_size > 1) {
    auto done = s.comm_worker.Submit([&] {
      return s.world->AllReduce(full.data(), full.data(), full.size(), DType::kF32, ReduceOp::kSum).Wait();
    });
    STRATA_RETURN_IF_ERROR(done.get());
  }
  return OkStatus();
}

}  // namespace strata
