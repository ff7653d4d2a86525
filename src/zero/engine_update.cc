// The update at the end of an accumulation window (Step()), in the order of the serial
// definition in engine.h: finish the backward's reductions and speculative steps, agree
// on the global norm and overflow, then commit, redo or undo each chunk's step.
#include <algorithm>
#include <cmath>

#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

Result<StepResult> Engine::Impl::StepOnce() {
  StepResult r;
  const int64_t t_start = NowNs();
  r.loss_scale = scaler->scale();
  STRATA_RETURN_IF_ERROR(FinishReductions());
  if (stage == 3) {
    // Normally nothing is left after a backward; a forward without one leaves its kept
    // chunks, which the step is about to make stale.
    STRATA_RETURN_IF_ERROR(DropGathered());
  }
  // The statistics need the reductions only, not the speculative steps still running.
  STRATA_ASSIGN_OR_RETURN(const GlobalStats g, AgreeStats());
  const double loss_scale = scaler->scale();
  r.grad_norm = std::sqrt(g.sum_sq) / loss_scale;
  double clip = 1;
  if (!g.overflow && config.gradient_clipping > 0) {
    const double c = config.gradient_clipping / (r.grad_norm + 1e-6);
    if (c < 1) clip = c;
  }
  r.clip_coef = clip;
  r.skipped = g.overflow;
  // Resident chunks of the NVMe optimizer never speculate: they step from memory on
  // every core while the NVMe steps of the backward's speculation finish on the disk.
  // Device chunks of a CPU optimizer step on the device while the CPU's finish.
  std::vector<int> early;
  if (!g.overflow) {
    for (int c = 0; c < layout.num_chunks; ++c) {
      if (StepsInPlace(c)) early.push_back(c);
    }
    STRATA_RETURN_IF_ERROR(StepChunks(early, GradScale(clip, loss_scale)));
  }
  STRATA_RETURN_IF_ERROR(WaitSpeculation());
  // Writes behind go on into the next forward: what reads or rewrites a slot waits for
  // its writes (NvmeOptimizer, WaitParamWrite).
  r.step_wait_s = (NowNs() - t_start) * 1e-9;
  if (g.overflow) {
    STRATA_RETURN_IF_ERROR(UndoSpeculation(r));
  } else {
    STRATA_RETURN_IF_ERROR(ApplyUpdate(clip, loss_scale, r, early));
  }
  STRATA_RETURN_IF_ERROR(EndWindow(g.overflow));
  TakeCounters(r, g.prefetch_depth);
  TuneOverlap(r);
  ++step_epoch;
  return r;
}

void Engine::Impl::TuneOverlap(StepResult& r) {
  r.overlapped = overlap;
  const int64_t now = NowNs();
  const int window = static_cast<int>(step_epoch);
  if (window_end_ns > 0 && !window_disturbed &&
      overlap_tuner.Record(window, static_cast<double>(now - window_end_ns) * 1e-9)) {
    STRATA_LOG(kInfo, "engine") << "strata.overlap auto: " << overlap_tuner.reason() << " from step "
                                << window + 2;
  }
  window_end_ns = now;
  window_disturbed = false;
  overlap = overlap_tuner.ModeFor(window + 1);
}

Status Engine::Impl::FinishReductions() {
  if (in_micro_batch) STRATA_RETURN_IF_ERROR(EndMicroBatch());
  STRATA_RETURN_IF_ERROR(reducer->Wait());
  // Each gradient shard written behind was read back by a later micro-batch: what is
  // left are their buffers (with the comm worker idle, this thread may take them).
  return grad_writes.Drain(/*report=*/true);
}

Status Engine::Impl::WaitSpeculation() {
  opt_worker.Drain();
  for (auto& o : opt) {
    if (!o.spec_done.valid()) continue;
    Status st = o.spec_done.get();
    o.spec_done = {};
    STRATA_RETURN_IF_ERROR(st);
  }
  return OkStatus();
}

// Global norm and overflow: every rank's shard stats, summed in rank order in double;
// with them, the prefetch depth each rank measured, of which all take the deepest (the
// ranks must release and gather the same chunks).
Result<Engine::Impl::GlobalStats> Engine::Impl::AgreeStats() {
  STRATA_ASSIGN_OR_RETURN(GradStats local, LocalGradStats());
  GlobalStats g{local.sum_sq, local.has_inf_nan, stage == 3 ? gatherer->MeasuredPrefetch() : 0};
  if (stage == 0 || world_size == 1) return g;
  double mine[3] = {local.sum_sq, local.has_inf_nan ? 1.0 : 0.0, static_cast<double>(g.prefetch_depth)};
  std::vector<double> all(3 * world_size);
  auto done = comm_worker.Submit([&] {
    return world->AllGather(mine, all.data(), 6, DType::kF32).Wait();  // 3 doubles as 6 floats
  });
  STRATA_RETURN_IF_ERROR(done.get());
  g.sum_sq = 0;
  g.overflow = false;
  for (int q = 0; q < world_size; ++q) {
    g.sum_sq += all[3 * q];
    g.overflow = g.overflow || all[3 * q + 1] != 0;
    g.prefetch_depth = std::max(g.prefetch_depth, static_cast<int>(all[3 * q + 2]));
  }
  return g;
}

Status Engine::Impl::UndoSpeculation(StepResult& r) {
  for (int c = 0; c < layout.num_chunks; ++c) {
    if (!opt[c].speculated) continue;
    STRATA_RETURN_IF_ERROR(DiscardChunk(c));
    STRATA_RETURN_IF_ERROR(RestoreParams(c));
    ++r.redone_steps;
  }
  return OkStatus();
}

float Engine::Impl::GradScale(double clip, double loss_scale) const {
  return clip == 1 ? scaler->grad_scale() : static_cast<float>(clip / loss_scale);
}

Status Engine::Impl::ApplyUpdate(double clip, double loss_scale, StepResult& r,
                                 const std::vector<int>& stepped) {
  std::vector<int> to_step;
  for (int c = 0; c < layout.num_chunks; ++c) {
    if (std::find(stepped.begin(), stepped.end(), c) != stepped.end()) continue;
    OptChunk& o = opt[c];
    if (o.speculated && o.has_pending && clip == 1) {
      STRATA_RETURN_IF_ERROR(CommitChunk(c));
      continue;
    }
    if (o.speculated) {
      STRATA_RETURN_IF_ERROR(DiscardChunk(c));
      ++r.redone_steps;
    }
    to_step.push_back(c);
  }
  STRATA_RETURN_IF_ERROR(StepChunks(to_step, GradScale(clip, loss_scale)));
  ++step_count;
  adam.step = step_count + 1;
  return AllGatherParams();
}

Status Engine::Impl::StepChunks(const std::vector<int>& chunks, float grad_scale) {
  // With the optimizer in memory a chunk's state is updated in place. When one's
  // parameters cannot be written, the rest are still stepped (not published), so the
  // master the failed engine keeps is a whole step rather than part of one.
  Status unpublished;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int next = i + 1 < chunks.size() ? chunks[i + 1] : -1;
    bool updated = false;
    Status st = StepChunk(chunks[i], grad_scale, /*speculative=*/false, next, nullptr,
                          /*publish=*/unpublished.ok(), &updated);
    if (st.ok()) continue;
    // This chunk's update itself failed: the master is part of a step after all.
    if (!updated) return unpublished.ok() ? st : unpublished;
    if (unpublished.ok()) unpublished = st;
  }
  return unpublished;
}

Status Engine::Impl::EndWindow(bool overflow) {
  if (opt_tier == ZeroTier::kNvme) {
    // Reads ahead nobody used: their buffers matter, not their errors (the step is done).
    Status dropped = nvme_opt->DropReads();
    if (!dropped.ok()) STRATA_LOG(kWarn, "engine") << "unused optimizer state read: " << dropped.ToString();
  }
  reducer->EndWindow();
  for (int c = 0; c < layout.num_chunks; ++c) {
    OptChunk& o = opt[c];
    o.speculated = false;
    // nvme: the next first reduction overwrites.
    if (o.grad)
      STRATA_RETURN_IF_ERROR(OpsOn(GradTierOf(c)).Zero(zero::OpsLane::kTraining, o.grad, opt_elems * 4));
  }
  STRATA_RETURN_IF_ERROR(scaler->Update(overflow));
  micro_batch = 0;
  in_micro_batch = false;
  return OkStatus();
}

void Engine::Impl::TakeCounters(StepResult& r, int prefetch_depth) {
  r.speculative_steps = speculative_count.exchange(0);
  // The NVMe optimizer counts its own I/O and Adam.
  const zero::NvmeOptimizer::Counters nvme =
      nvme_opt ? nvme_opt->TakeCounters() : zero::NvmeOptimizer::Counters{};
  r.optimizer_busy_s = (opt_busy_ns.exchange(0) + nvme.adam_busy_ns) * 1e-9;
  const zero::GradReducer::Counters reduced = reducer->TakeCounters();
  r.comm_busy_s = (comm_busy_ns.exchange(0) + reduced.busy_ns) * 1e-9;
  r.io_busy_s = (io_busy_ns.exchange(0) + nvme.io_busy_ns) * 1e-9;
  r.model_wait_s = std::chrono::duration<double>(std::exchange(model_wait, {})).count();
  r.prefetch_modules = stage == 3 ? gatherer->prefetch_modules() : 0;
  r.gather_evictions = gatherer->TakeEvictions();
  r.shards_from_memory = std::exchange(shards_from_memory, 0);
  if (stage == 3) gatherer->set_prefetch_modules(prefetch_depth);
  r.bytes_nvme_read = bytes_nvme_read.exchange(0) + nvme.bytes_read;
  r.bytes_nvme_written = bytes_nvme_written.exchange(0) + nvme.bytes_written;
  r.bytes_h2d = bytes_h2d.exchange(0);
  r.bytes_d2h = bytes_d2h.exchange(0);
  r.bytes_comm = bytes_comm.exchange(0) + reduced.bytes;
  r.device_high_water = device->high_water();
  r.host_high_water = arena ? arena->high_water() : 0;
}

}  // namespace strata
