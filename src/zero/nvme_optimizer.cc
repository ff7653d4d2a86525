#include "zero/nvme_optimizer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "strata/log.h"
#include "zero/clock.h"
#include "zero/device_ops.h"

namespace strata::zero {
NvmeOptimizer::NvmeOptimizer(PieceShape shape, int num_chunks, bool master_prefix, SaveGate* gate,
                             Hooks hooks)
    : shape_(std::move(shape)),
      master_prefix_(master_prefix),
      gate_(gate),
      hooks_(std::move(hooks)),
      versions_(num_chunks),
      writes_(&staging_, [this](const WriteBehind::Write& w) {
        // What the failed write belonged to is lost: its chunk's pending result, and the
        // step that wrote it, on every chunk.
        if (hooks_.lost) hooks_.lost(w.chunk, /*version_changed=*/false);
        RollBack(w.epoch);
      }) {}

void NvmeOptimizer::AddStagingSet(void* set) {
  staging_.Add(set);
  ++staging_sets_;
}

Status NvmeOptimizer::AttachStore(std::unique_ptr<NvmeStore> store) {
  store_ = std::move(store);
  for (int c = 0; c < static_cast<int>(versions_.size()); ++c) {
    if (hooks_.resident && hooks_.resident(c)) continue;
    for (auto& version : versions_[c].slot) {
      version.resize(shape_.pieces);
      for (SlotId& slot : version) {
        STRATA_ASSIGN_OR_RETURN(slot, store_->Allocate());
      }
    }
  }
  return OkStatus();
}

void NvmeOptimizer::SetTimeline(Timeline* timeline, int track_nvme, int track_optimizer) {
  timeline_ = timeline;
  track_nvme_ = track_nvme;
  track_optimizer_ = track_optimizer;
}

void NvmeOptimizer::Span(int track, const std::string& name, std::chrono::steady_clock::time_point begin,
                         uint64_t bytes) {
  if (timeline_) timeline_->Record(track, name, begin, std::chrono::steady_clock::now(), bytes);
}

int NvmeOptimizer::ReadVersion(int chunk) const {
  const Versions& v = versions_[chunk];
  return v.deferred ? 1 - v.current : v.current;
}

std::vector<IoHandle> NvmeOptimizer::WritesTo(int chunk, int version) const {
  std::vector<IoHandle> handles;
  const std::vector<SlotId>& slots = versions_[chunk].slot[version];
  for (const WriteBehind::Write& w : writes_.writes()) {
    if (w.chunk == chunk && std::find(slots.begin(), slots.end(), w.slot) != slots.end())
      handles.push_back(w.handle);
  }
  return handles;
}

NvmeOptimizer::Counters NvmeOptimizer::TakeCounters() {
  return Counters{bytes_read_.exchange(0), bytes_written_.exchange(0), io_busy_ns_.exchange(0),
                  adam_busy_ns_.exchange(0)};
}

void NvmeOptimizer::Commit(int chunk, int64_t epoch) {
  versions_[chunk].deferred = true;
  versions_[chunk].epoch = epoch;
}

Status NvmeOptimizer::SettleCommit(int chunk) {
  Versions& v = versions_[chunk];
  if (!v.deferred) return OkStatus();
  for (int p = 0; p < shape_.pieces; ++p) STRATA_RETURN_IF_ERROR(writes_.WaitSlot(v.slot[1 - v.current][p]));
  v.current = 1 - v.current;
  v.deferred = false;
  return OkStatus();
}

void NvmeOptimizer::RollBack(int64_t epoch) {
  for (int c = 0; c < static_cast<int>(versions_.size()); ++c) {
    Versions& v = versions_[c];
    if (epoch < 0 || v.epoch != epoch) continue;
    if (!v.deferred) v.current = 1 - v.current;
    v.deferred = false;
    v.epoch = -1;
    if (hooks_.lost) hooks_.lost(c, /*version_changed=*/true);
  }
}

Result<float*> NvmeOptimizer::TakeSet() {
  STRATA_ASSIGN_OR_RETURN(void* p, writes_.TakeFreeOrOldest());
  if (p != nullptr) return static_cast<float*>(p);
  // Every set is in a read ahead, which only this thread consumes: a bug, not a wait.
  return InternalError("engine: no NVMe staging set is free and none is being written (" +
                       std::to_string(reads_.size()) + " reads ahead hold them all)");
}

Status NvmeOptimizer::WaitWrites(bool report) { return writes_.Drain(report); }

Status NvmeOptimizer::DropReads() {
  Status first;
  for (auto& [key, r] : reads_) {
    Status st = r.handle.Wait();  // the set is the engine's again only once the read is done
    staging_.Give(r.buf);
    if (first.ok() && !st.ok()) first = st;
  }
  reads_.clear();
  return first;
}

Status NvmeOptimizer::IssueRead(int chunk, int p) {
  STRATA_RETURN_IF_ERROR(SettleCommit(chunk));
  const Versions& v = versions_[chunk];
  STRATA_RETURN_IF_ERROR(writes_.WaitSlot(v.slot[v.current][p]));
  STRATA_ASSIGN_OR_RETURN(float* buf, TakeSet());
  auto rd = store_->Read(v.slot[v.current][p], buf, shape_.Bytes(p));
  if (!rd.ok()) {
    staging_.Give(buf);
    return rd.status();
  }
  reads_[shape_.Key(chunk, p)] = Read{buf, *rd};
  return OkStatus();
}

Status NvmeOptimizer::ReadAhead(int chunk, int first_piece, int next_chunk, bool descending) {
  writes_.Reclaim();
  // Two sets stay for the piece that steps and its write; with only two, one read ahead.
  const int limit = std::max(staging_sets_ - 2, std::min(staging_sets_ - 1, 1));
  int in_flight = static_cast<int>(reads_.size());
  auto issue = [&](int c, int p) -> Result<bool> {
    if ((hooks_.resident && hooks_.resident(c)) || !shape_.Live(c, p) || reads_.count(shape_.Key(c, p)))
      return true;
    if (in_flight >= limit) return false;
    void* free_set = staging_.TryTake();  // never wait for a write here
    if (free_set == nullptr) return false;
    staging_.Give(free_set);  // IssueRead takes it again; only this thread takes sets now
    STRATA_RETURN_IF_ERROR(IssueRead(c, p));
    ++in_flight;
    return true;
  };
  for (int p = first_piece; p < shape_.pieces; ++p) {
    STRATA_ASSIGN_OR_RETURN(bool more, issue(chunk, p));
    if (!more) return OkStatus();
  }
  for (int c = next_chunk; c >= 0; c = descending ? c - 1 : -1) {
    // A module's chunks may finish out of order: one already stepped needs no read.
    if (descending && hooks_.stepped && hooks_.stepped(c)) continue;
    for (int p = 0; p < shape_.pieces; ++p) {
      STRATA_ASSIGN_OR_RETURN(bool more, issue(c, p));
      if (!more) return OkStatus();
    }
  }
  return OkStatus();
}

Result<bool> NvmeOptimizer::Step(const OptimizerStep& a, const float* grad, void* out) {
  // The last step's version must be current before this one writes the other.
  STRATA_RETURN_IF_ERROR(SettleCommit(a.chunk));
  if (!a.overlap) {
    Status ahead = ReadAhead(a.chunk, 0, -1, /*descending=*/false);
    if (!ahead.ok()) STRATA_LOG(kWarn, "engine") << "optimizer state read-ahead: " << ahead.ToString();
  }
  const size_t csize = DTypeSize(a.compute);
  for (int p = 0; p < shape_.pieces; ++p) {
    uint8_t* out_p = out == nullptr ? nullptr : static_cast<uint8_t*>(out) + p * shape_.piece_elems * csize;
    if (!shape_.Live(a.chunk, p)) {
      // The buffer held another chunk's values.
      if (out_p != nullptr) std::memset(out_p, 0, shape_.Elems(p) * csize);
      continue;
    }
    const float* g = grad != nullptr ? grad + p * shape_.piece_elems : nullptr;
    if (g == nullptr) {
      if (!a.grad_piece) return InternalError("NVMe optimizer: a step without a gradient");
      STRATA_ASSIGN_OR_RETURN(g, a.grad_piece(p));
    }
    if (out_p == nullptr && a.out_piece) {
      STRATA_ASSIGN_OR_RETURN(void* buf, a.out_piece(p));
      Status st = StepPiece(a, p, g, buf);
      Status done = a.piece_done(p, buf, st.ok());
      STRATA_RETURN_IF_ERROR(st);
      STRATA_RETURN_IF_ERROR(done);
      continue;
    }
    STRATA_RETURN_IF_ERROR(StepPiece(a, p, g, out_p));
  }
  return true;
}

Status NvmeOptimizer::StepPiece(const OptimizerStep& a, int p, const float* grad, void* out) {
  // Span names only when a timeline records them: this runs a hundred times a step.
  const std::string name =
      timeline_ ? "chunk " + std::to_string(a.chunk) + " piece " + std::to_string(p) : std::string();
  int64_t t0 = NowNs();
  const auto wait_start = std::chrono::steady_clock::now();
  const int key = shape_.Key(a.chunk, p);
  if (!reads_.count(key)) STRATA_RETURN_IF_ERROR(IssueRead(a.chunk, p));
  const Read r = reads_[key];
  reads_.erase(key);
  float* st = r.buf;
  Status s = r.handle.Wait();
  io_busy_ns_ += NowNs() - t0;
  if (timeline_) Span(track_nvme_, "wait read " + name, wait_start, shape_.Bytes(p));
  // The piece's read wait, Adam and issuing its write, on the optimizer lane.
  struct StepSpan {
    NvmeOptimizer* o;
    std::string name;
    std::chrono::steady_clock::time_point begin;
    ~StepSpan() { o->Span(o->track_optimizer_, name, begin); }
  } step_span{this, timeline_ ? (a.speculative ? "step (speculative) " : "step ") + name : std::string(),
              wait_start};
  if (s.ok()) {
    bytes_read_ += shape_.Bytes(p);
    // A read ahead that cannot be issued is not this piece's failure: whoever needs that
    // piece issues the read again and reports the error. Without overlap only this
    // chunk's pieces are read ahead.
    Status ahead = ReadAhead(a.chunk, p + 1, a.overlap ? a.next_chunk : -1, /*descending=*/a.speculative);
    if (!ahead.ok()) STRATA_LOG(kWarn, "engine") << "optimizer state read-ahead: " << ahead.ToString();
    t0 = NowNs();
    s = AdamOnHost(a.adam, st, shape_.Elems(p), grad, a.compute, out, a.arena);
    adam_busy_ns_ += NowNs() - t0;
  }
  if (s.ok()) s = WritePiece(a, p, st);
  if (s.ok()) return OkStatus();
  staging_.Give(st);
  return s.WithContext("NVMe optimizer step of chunk " + std::to_string(a.chunk) + " piece " +
                       std::to_string(p));
}

Status NvmeOptimizer::WritePiece(const OptimizerStep& a, int p, float* st) {
  // To the version that is not current (once an earlier write of that slot, e.g. a
  // redone step's speculation, is done). That slot holds the version before the current
  // one, which an earlier step not yet all on disk would need back if one of its writes
  // failed (RollBack): those writes go first.
  const Versions& v = versions_[a.chunk];
  const SlotId slot = v.slot[1 - v.current][p];
  gate_->WaitFree(SaveGate::SlotKey(slot));  // a checkpoint save may still read it
  STRATA_RETURN_IF_ERROR(writes_.SettleBefore(a.epoch));
  STRATA_RETURN_IF_ERROR(writes_.WaitSlot(slot));
  const int64_t n = shape_.Elems(p);
  STRATA_ASSIGN_OR_RETURN(IoHandle h, store_->Write(slot, st, shape_.Bytes(p), master_prefix_ ? n * 4 : 0));
  bytes_written_ += shape_.Bytes(p);
  writes_.Push(WriteBehind::Write{h, st, slot, a.chunk, a.epoch, "writing optimizer state to NVMe"});
  return OkStatus();
}

Status NvmeOptimizer::ReadMaster(int chunk, float* master) {
  STRATA_RETURN_IF_ERROR(SettleCommit(chunk));
  const Versions& v = versions_[chunk];
  STRATA_ASSIGN_OR_RETURN(float* st, TakeSet());
  Status s;
  for (int p = 0; s.ok() && p < shape_.pieces; ++p) {
    float* dst = master + p * shape_.piece_elems;
    if (!shape_.Live(chunk, p)) {
      std::fill(dst, dst + shape_.Elems(p), 0.0f);
      continue;
    }
    auto rd = store_->Read(v.slot[v.current][p], st, shape_.Bytes(p));
    s = rd.ok() ? rd->Wait() : rd.status();
    if (s.ok()) std::memcpy(dst, st, shape_.Elems(p) * 4);
  }
  staging_.Give(st);
  return s;
}

Status NvmeOptimizer::WriteCommitted(int chunk, int p, float* set) {
  const int64_t n = shape_.Elems(p);
  std::memset(set + 3 * n, 0, shape_.Bytes(p) - 3 * n * 4);
  const Versions& v = versions_[chunk];
  auto wr = store_->Write(v.slot[v.current][p], set, shape_.Bytes(p), master_prefix_ ? n * 4 : 0);
  STRATA_RETURN_IF_ERROR(wr.ok() ? wr->Wait() : wr.status());
  bytes_written_ += shape_.Bytes(p);
  return OkStatus();
}

}  // namespace strata::zero
