// The NVMe optimizer step (offload_optimizer nvme): a chunk's master | m | v live in NVMe
// slots, one per piece and version, and are stepped piece by piece through a pool of
// pinned staging sets: reads run ahead (the rest of this chunk, then the chunks the
// backward finishes next), a piece steps, and its new state is written behind to the
// chunk's other version. A step's result becomes current only when every piece of it is
// on disk and the step is committed, so a failure part-way loses nothing.
//
// Buffers come back to their pools only when the I/O on them is done: a read's set when
// the step takes it (or DropNvmeReads), a write's when ReclaimNvmeWrites sees it
// complete, TakeOptStaging / TakeOut16Staging need it, or WaitNvmeWrites waits for it.
#include <chrono>
#include <cstring>
#include <string>

#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

Result<void*> Engine::Impl::ReuseOldest(std::deque<NvmeWrite>& writes) {
  NvmeWrite& w = writes.front();
  STRATA_RETURN_IF_ERROR(WaitWrite(w));
  void* buf = w.buf;
  writes.pop_front();
  return buf;
}

Status Engine::Impl::WaitWrite(const NvmeWrite& w) {
  Status st = w.Wait();
  if (st.ok() || w.chunk < 0) return st;
  opt[w.chunk].has_pending = false;
  RollBackEpoch(w.epoch);
  return st;
}

void Engine::Impl::RollBackEpoch(int64_t epoch) {
  for (size_t c = 0; c < opt.size(); ++c) {
    OptChunk& o = opt[c];
    if (epoch < 0 || o.commit_epoch != epoch) continue;
    if (!o.commit_deferred) o.current = 1 - o.current;
    o.commit_deferred = false;
    o.commit_epoch = -1;
    o.has_pending = false;
    SyncParamSource(static_cast<int>(c));
    // The copy kept in memory is the lost step's: the next gather reads the disk's.
    if (param_from_master) SetFresh(static_cast<int>(c), nullptr);
  }
}

void Engine::Impl::SyncParamSource(int chunk) {
  if (!param_from_master) return;
  const OptChunk& o = opt[chunk];
  ParamSource src;
  src.version = o.commit_deferred ? 1 - o.current : o.current;
  for (const NvmeWrite& w : nvme_writes) {
    if (w.chunk != chunk) continue;
    for (int p = 0; p < pieces; ++p) {
      if (w.slot == o.slot[src.version][p]) src.writes.push_back(w.handle);
    }
  }
  std::lock_guard lock(param_write_mu);
  param_source[chunk] = std::move(src);
}

Status Engine::Impl::SettleEarlierSteps() {
  // Writes are queued in the order they were issued, so earlier steps' come first.
  while (!nvme_writes.empty() && nvme_writes.front().epoch < step_epoch) {
    STRATA_RETURN_IF_ERROR(WaitWrite(nvme_writes.front()));  // a failed one stays for WaitNvmeWrites
    opt_staging.Give(nvme_writes.front().buf);
    nvme_writes.pop_front();
  }
  return OkStatus();
}

Result<float*> Engine::Impl::TakeOptStaging() {
  if (void* p = opt_staging.TryTake()) return static_cast<float*>(p);
  if (!nvme_writes.empty()) {
    STRATA_ASSIGN_OR_RETURN(void* p, ReuseOldest(nvme_writes));
    return static_cast<float*>(p);
  }
  // Every set is in a read ahead, which only this thread consumes: a bug, not a wait.
  return InternalError("engine: no NVMe staging set is free and none is being written (" +
                       std::to_string(nvme_reads.size()) + " reads ahead hold them all)");
}

Result<void*> Engine::Impl::TakeOut16Staging() {
  void* p = out16_staging.TryTake();
  if (p == nullptr && !out16_kept.empty()) {
    p = out16_kept.front();
    out16_kept.pop_front();
  }
  if (p == nullptr && !param_writes.empty()) {
    STRATA_ASSIGN_OR_RETURN(p, ReuseOldest(param_writes));
  }
  if (p == nullptr) {
    return InternalError("engine: no parameter staging buffer is free and none is being written");
  }
  ForgetFreshBuffer(p);
  return p;
}

void* Engine::Impl::BorrowFresh(int chunk) {
  {
    // A write that failed is reported where the gather waits for it (FetchShard), not
    // hidden behind a copy of what never reached the disk.
    std::lock_guard lock(param_write_mu);
    if (!param_source.empty()) {
      for (const IoHandle& h : param_source[chunk].writes) {
        if (h.Poll() && !h.Wait().ok()) return nullptr;
      }
    }
  }
  std::lock_guard lock(fresh_mu);
  if (fresh_shard.empty() || fresh_shard[chunk] == nullptr) return nullptr;
  ++fresh_lent[fresh_shard[chunk]];
  return fresh_shard[chunk];
}

void Engine::Impl::ReturnFresh(void* buf) {
  std::lock_guard lock(fresh_mu);
  if (--fresh_lent[buf] == 0) fresh_lent.erase(buf);
  fresh_cv.notify_all();
}

void Engine::Impl::SetFresh(int chunk, void* buf) {
  // A resident chunk's master in memory is its shard whenever no newer copy is.
  if (buf == nullptr) buf = ResidentShard(chunk);
  std::lock_guard lock(fresh_mu);
  if (!fresh_shard.empty()) fresh_shard[chunk] = buf;
}

void Engine::Impl::ForgetFreshBuffer(void* buf) {
  std::unique_lock lock(fresh_mu);
  fresh_cv.wait(lock, [&] { return fresh_lent.count(buf) == 0; });
  for (void*& b : fresh_shard) {
    if (b == buf) b = nullptr;
  }
}

Status Engine::Impl::WaitSlotWrites(const std::deque<NvmeWrite>& writes, SlotId slot) {
  for (const NvmeWrite& w : writes) {
    if (w.slot == slot) STRATA_RETURN_IF_ERROR(WaitWrite(w));
  }
  return OkStatus();
}

bool Engine::Impl::ParamWriteDone(int chunk) {
  std::lock_guard lock(param_write_mu);
  if (param_source.empty()) return true;
  for (const IoHandle& h : param_source[chunk].writes) {
    if (!h.Poll()) return false;
  }
  return true;
}

Status Engine::Impl::WaitParamWrite(int chunk) {
  std::vector<IoHandle> writes;
  {
    std::lock_guard lock(param_write_mu);
    if (!param_source.empty()) writes = param_source[chunk].writes;
  }
  for (const IoHandle& h : writes) {
    STRATA_RETURN_IF_ERROR(h.Wait().WithContext(param_from_master ? "writing optimizer state to NVMe"
                                                                  : "writing parameters to NVMe"));
  }
  return OkStatus();
}

Status Engine::Impl::SettleCommit(int chunk) {
  OptChunk& o = opt[chunk];
  if (!o.commit_deferred) return OkStatus();
  for (int p = 0; p < pieces; ++p)
    STRATA_RETURN_IF_ERROR(WaitSlotWrites(nvme_writes, o.slot[1 - o.current][p]));
  o.current = 1 - o.current;
  o.commit_deferred = false;
  return OkStatus();
}

Status Engine::Impl::IssueNvmeRead(int chunk, int piece) {
  STRATA_RETURN_IF_ERROR(SettleCommit(chunk));
  const OptChunk& o = opt[chunk];
  STRATA_RETURN_IF_ERROR(WaitSlotWrites(nvme_writes, o.slot[o.current][piece]));
  STRATA_ASSIGN_OR_RETURN(float* buf, TakeOptStaging());
  auto rd = opt_store->Read(o.slot[o.current][piece], buf, PieceBytes(piece));
  if (!rd.ok()) {
    opt_staging.Give(buf);
    return rd.status();
  }
  nvme_reads[PieceKey(chunk, piece)] = NvmeRead{buf, *rd};
  return OkStatus();
}

void Engine::Impl::ReclaimNvmeWrites() {
  auto reclaim = [](std::deque<NvmeWrite>& writes, Pool& pool) {
    while (!writes.empty() && writes.front().handle.Poll()) {
      // A failed one is kept for whoever reports it (WaitWrite there undoes its step).
      if (!writes.front().Wait().ok()) return;
      pool.Give(writes.front().buf);
      writes.pop_front();
    }
  };
  reclaim(nvme_writes, opt_staging);
  reclaim(param_writes, out16_staging);
}

Status Engine::Impl::WaitNvmeWrites(bool report) {
  Status first;
  auto drain = [&](std::deque<NvmeWrite>& writes, Pool& pool) {
    while (!writes.empty()) {
      Status st = WaitWrite(writes.front());
      if (first.ok() && !st.ok() && report) first = st;
      // What never reached the disk must not be served in its place either.
      if (!st.ok()) ForgetFreshBuffer(writes.front().buf);
      pool.Give(writes.front().buf);
      writes.pop_front();
    }
  };
  drain(nvme_writes, opt_staging);
  drain(param_writes, out16_staging);
  return first;
}

Status Engine::Impl::DropNvmeReads() {
  Status first;
  for (auto& [key, r] : nvme_reads) {
    Status st = r.handle.Wait();  // the buffer is the engine's again only once the read is done
    opt_staging.Give(r.buf);
    if (first.ok() && !st.ok()) first = st;
  }
  nvme_reads.clear();
  return first;
}

Status Engine::Impl::ReadAhead(int chunk, int first_piece, int next_chunk, bool descending) {
  ReclaimNvmeWrites();
  // Two sets stay for the piece that steps and its write; with only two, one read ahead.
  const int limit = std::max(opt_staging_count - 2, std::min(opt_staging_count - 1, 1));
  int in_flight = static_cast<int>(nvme_reads.size());
  auto issue = [&](int c, int p) -> Result<bool> {
    if (Resident(c) || !PieceLive(c, p) || nvme_reads.count(PieceKey(c, p))) return true;
    if (in_flight >= limit) return false;
    void* free_set = opt_staging.TryTake();  // never wait for a write here
    if (free_set == nullptr) return false;
    opt_staging.Give(free_set);  // IssueNvmeRead takes it again; only this thread takes sets now
    STRATA_RETURN_IF_ERROR(IssueNvmeRead(c, p));
    ++in_flight;
    return true;
  };
  for (int p = first_piece; p < pieces; ++p) {
    STRATA_ASSIGN_OR_RETURN(bool more, issue(chunk, p));
    if (!more) return OkStatus();
  }
  for (int c = next_chunk; c >= 0; c = descending ? c - 1 : -1) {
    // A module's chunks may finish out of order: one already stepped needs no read.
    if (descending && opt[c].speculated) continue;
    for (int p = 0; p < pieces; ++p) {
      STRATA_ASSIGN_OR_RETURN(bool more, issue(c, p));
      if (!more) return OkStatus();
    }
  }
  return OkStatus();
}

Status Engine::Impl::StepPieceNvme(int chunk, int piece, float grad_scale, bool speculative, int next_chunk,
                                   const float* grad, void* out) {
  OptChunk& o = opt[chunk];
  const int64_t n = PieceElems(piece);
  // Span names only when a timeline records them: this runs a hundred times a step.
  const std::string name =
      timeline ? "chunk " + std::to_string(chunk) + " piece " + std::to_string(piece) : std::string();
  int64_t t0 = NowNs();
  const auto wait_start = std::chrono::steady_clock::now();
  const int key = PieceKey(chunk, piece);
  if (!nvme_reads.count(key)) STRATA_RETURN_IF_ERROR(IssueNvmeRead(chunk, piece));
  NvmeRead r = nvme_reads[key];
  nvme_reads.erase(key);
  float* st = r.buf;
  Status s = r.handle.Wait();
  io_busy_ns += NowNs() - t0;
  if (timeline) Span(track_nvme, "wait read " + name, wait_start, PieceBytes(piece));
  // The piece's read wait, Adam and issuing its write, on the optimizer lane.
  struct StepSpan {
    Impl* s;
    std::string name;
    std::chrono::steady_clock::time_point begin;
    ~StepSpan() { s->Span(s->track_optimizer, name, begin); }
  } step_span{this, timeline ? (speculative ? "step (speculative) " : "step ") + name : std::string(),
              wait_start};
  if (s.ok()) bytes_nvme_read += PieceBytes(piece);
  // Backward finishes chunks in descending order; Step() names the next one it steps.
  if (s.ok()) {
    // A read ahead that cannot be issued is not this piece's failure: whoever needs that
    // piece issues the read again and reports the error. Without overlap only this
    // chunk's pieces are read ahead, as the whole chunk was read at once before pieces.
    Status ahead = ReadAhead(chunk, piece + 1, overlap ? next_chunk : -1, /*descending=*/speculative);
    if (!ahead.ok()) STRATA_LOG(kWarn, "engine") << "optimizer state read-ahead: " << ahead.ToString();
  }
  if (s.ok()) {
    AdamParams p = adam;
    p.grad_scale = grad_scale;
    t0 = NowNs();
    s = zero::AdamOnHost(p, st, n, grad, compute, out, speculative ? &speculation_arena : nullptr);
    opt_busy_ns += NowNs() - t0;
  }
  if (s.ok()) {
    // Written behind to the version that is not current (once an earlier write of that
    // slot, e.g. a redone step's speculation, is done). That slot holds the version
    // before the current one, which an earlier step not yet all on disk would need back
    // if one of its writes failed (RollBackEpoch): those writes go first.
    const SlotId slot = o.slot[1 - o.current][piece];
    save_gate.WaitFree(zero::SaveGate::SlotKey(slot));  // a checkpoint save may still read it
    s = SettleEarlierSteps();
    if (s.ok()) s = WaitSlotWrites(nvme_writes, slot);
    // The master part alone is readable too when a gather reads it as the parameter shard.
    auto wr = s.ok() ? opt_store->Write(slot, st, PieceBytes(piece), param_from_master ? n * 4 : 0)
                     : Result<IoHandle>(s);
    if (wr.ok()) {
      bytes_nvme_written += PieceBytes(piece);
      nvme_writes.push_back(NvmeWrite{*wr, st, slot, chunk, step_epoch, "writing optimizer state to NVMe"});
      return OkStatus();
    }
    s = wr.status();
  }
  opt_staging.Give(st);
  return s.WithContext("NVMe optimizer step of chunk " + std::to_string(chunk) + " piece " +
                       std::to_string(piece));
}

Status Engine::Impl::StepChunkNvme(int chunk, float grad_scale, bool speculative, int next_chunk,
                                   const float* grad) {
  OptChunk& o = opt[chunk];
  // The last step's version must be current before this one writes the other slot.
  STRATA_RETURN_IF_ERROR(SettleCommit(chunk));
  // Gradients on NVMe are read back (one read for all pieces, in flight while the first
  // piece's state arrives) unless the caller holds the shard.
  const bool read_grad = grad == nullptr && grad_tier == ZeroTier::kNvme;
  if (read_grad && !o.grad_on_disk) {
    return InternalError(
        "engine: chunk " + std::to_string(chunk) +
        " must be stepped from its gradient on NVMe, which was not written (a speculative step "
        "was expected to use it)");
  }
  float* grad_buf = nullptr;
  IoHandle grad_read;
  if (read_grad) {
    grad_buf = static_cast<float*>(grad_host.Take());
    auto rd = grad_store->Read(o.grad_slot, grad_buf, grad_slot_bytes);
    if (!rd.ok()) {
      grad_host.Give(grad_buf);
      return rd.status().WithContext("reading the gradient shard of chunk " + std::to_string(chunk));
    }
    grad_read = *rd;
    grad = grad_buf;
  }
  if (grad == nullptr) grad = o.grad;
  bool on_host = true;
  void* out = nullptr;
  Status s;
  if (publish_behind) {
    auto taken = TakeOut16Staging();
    if (taken.ok())
      out = *taken;
    else
      s = taken.status();
  } else {
    out = Out16Target(chunk, &on_host);
  }
  if (s.ok() && read_grad) {
    const int64_t t0 = NowNs();
    s = grad_read.Wait().WithContext("reading the gradient shard of chunk " + std::to_string(chunk));
    io_busy_ns += NowNs() - t0;
    if (s.ok()) bytes_nvme_read += grad_slot_bytes;
  }
  if (s.ok() && !overlap) {
    Status ahead = ReadAhead(chunk, 0, -1, /*descending=*/false);
    if (!ahead.ok()) STRATA_LOG(kWarn, "engine") << "optimizer state read-ahead: " << ahead.ToString();
  }
  for (int p = 0; s.ok() && p < pieces; ++p) {
    uint8_t* out_p = static_cast<uint8_t*>(out) + p * piece_elems * csize;
    if (!PieceLive(chunk, p)) {
      std::memset(out_p, 0, PieceElems(p) * csize);  // the buffer held another chunk's values
      continue;
    }
    s = StepPieceNvme(chunk, p, grad_scale, speculative, next_chunk, grad + p * piece_elems, out_p);
  }
  if (read_grad) {
    if (!s.ok()) (void)grad_read.Wait();  // the buffer must be quiet before reuse
    grad_host.Give(grad_buf);
  }
  if (param_from_master) {
    // Its values are the master just written behind: kept in memory for the next
    // forward, never written on their own.
    if (s.ok()) {
      SetFresh(chunk, out);
      out16_kept.push_back(out);
    } else if (out != nullptr) {
      out16_staging.Give(out);
    }
  } else if (publish_behind && ParamResident(chunk)) {
    if (s.ok()) s = PublishParams(chunk, out, /*from_host=*/true);
    if (out != nullptr) out16_staging.Give(out);
  } else if (publish_behind) {
    if (s.ok()) s = WaitParamWrite(chunk);
    if (s.ok()) {
      const SlotId slot = param_shard[chunk].slot;
      auto pw = param_store->Write(slot, out, opt_elems * csize);
      if (pw.ok()) {
        bytes_nvme_written += opt_elems * csize;
        param_writes.push_back(NvmeWrite{*pw, out, slot, -1, -1, "writing parameters to NVMe"});
        SetFresh(chunk, out);
        std::lock_guard lock(param_write_mu);
        param_source[chunk].writes = {*pw};
        out = nullptr;
      } else {
        s = pw.status();
      }
    }
    if (out != nullptr) out16_staging.Give(out);
  } else if (out != nullptr) {
    if (s.ok()) s = PublishParams(chunk, out, on_host);
    if (on_host) param_staging.Give(out);
  }
  if (!s.ok()) return s.WithContext("NVMe optimizer step of chunk " + std::to_string(chunk));
  if (!overlap) STRATA_RETURN_IF_ERROR(WaitNvmeWrites());
  if (speculative) {
    o.has_pending = true;
    o.speculated = true;
    ++speculative_count;
  } else {
    o.commit_deferred = true;  // current once the writes are on disk (SettleCommit)
    o.commit_epoch = step_epoch;
    SyncParamSource(chunk);
  }
  return OkStatus();
}

}  // namespace strata
