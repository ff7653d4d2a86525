// The engine's side of the NVMe optimizer step (nvme_optimizer.h steps the state): the
// gradient shard read back from NVMe, and the updated 16-bit shard put where the next
// forward reads it: written behind to the parameter swap, kept in memory as a fresh copy
// for the first gathers, or read from the optimizer's master (param_from_master).
//
// A parameter buffer comes back to out16_staging only when its write is on disk
// (param_writes), or, kept as a fresh copy, when no gather copies from it any more.
#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

zero::NvmeOptimizer::Hooks Engine::Impl::NvmeHooks() {
  zero::NvmeOptimizer::Hooks h;
  h.resident = [this](int c) { return Resident(c); };
  h.stepped = [this](int c) { return opt[c].speculated; };
  h.lost = [this](int c, bool version_changed) {
    opt[c].has_pending = false;
    if (!version_changed) return;
    SyncParamSource(c);
    // The copy kept in memory is the lost step's: the next gather reads the disk's.
    if (param_from_master) SetFresh(c, nullptr);
  };
  return h;
}

void Engine::Impl::SyncParamSource(int chunk) {
  if (!param_from_master) return;
  ParamSource src;
  src.version = nvme_opt->ReadVersion(chunk);
  src.writes = nvme_opt->WritesTo(chunk, src.version);
  std::lock_guard lock(param_write_mu);
  param_source[chunk] = std::move(src);
}

Result<void*> Engine::Impl::TakeOut16Staging() {
  param_writes.Reclaim();
  void* p = out16_staging.TryTake();
  if (p == nullptr && !out16_kept.empty()) {
    p = out16_kept.front();
    out16_kept.pop_front();
  }
  if (p == nullptr && !param_writes.empty()) {
    STRATA_ASSIGN_OR_RETURN(p, param_writes.ReuseOldest());
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

Status Engine::Impl::WaitNvmeWrites(bool report) {
  Status first = nvme_opt ? nvme_opt->WaitWrites(report) : OkStatus();
  // What never reached the disk must not be served in its place either.
  Status params = param_writes.Drain(report, [this](void* buf) { ForgetFreshBuffer(buf); });
  if (first.ok()) first = params;
  Status grads = grad_pieces ? grad_pieces->Drain(report) : OkStatus();
  if (first.ok()) first = grads;
  grads = grad_writes.Drain(report);
  if (first.ok()) first = grads;
  Status params16 = param_pieces ? param_pieces->Drain(report) : OkStatus();
  return first.ok() ? params16 : first;
}

Result<void*> Engine::Impl::NvmeStepOutput(int chunk, bool* on_host) {
  *on_host = true;
  // Streamed: nothing to keep; the next gather reads the master this step writes, or
  // the pieces SetPieceOutputs hands out.
  if (stream_pieces > 0) return static_cast<void*>(nullptr);
  if (publish_behind) return TakeOut16Staging();
  return Out16Target(chunk, on_host);
}

void Engine::Impl::SetGradPieces(int chunk, zero::PieceReader* reader, zero::OptimizerStep& args) {
  args.grad_piece = [this, chunk, reader](int p) -> Result<const float*> {
    const int64_t t0 = NowNs();
    auto g = reader->Get(p);
    io_busy_ns += NowNs() - t0;
    if (!g.ok()) {
      return g.status().WithContext("reading piece " + std::to_string(p) +
                                    " of the gradient shard of chunk " + std::to_string(chunk));
    }
    return g;
  };
}

Status Engine::Impl::StepChunkNvme(int chunk, float grad_scale, bool speculative, int next_chunk,
                                   const float* grad) {
  OptChunk& o = opt[chunk];
  // The last step's version must be current before this one writes the other.
  STRATA_RETURN_IF_ERROR(nvme_opt->SettleCommit(chunk));
  // Gradients on NVMe are read back (one read for all pieces, in flight while the first
  // piece's state arrives) unless the caller holds the shard.
  const bool read_grad = grad == nullptr && GradTierOf(chunk) == ZeroTier::kNvme;
  if (read_grad && !o.grad_on_disk) {
    return InternalError(
        "engine: chunk " + std::to_string(chunk) +
        " must be stepped from its gradient on NVMe, which was not written (a speculative step "
        "was expected to use it)");
  }
  // Streamed: a piece at a time, as the optimizer asks for them (piece_swap.h).
  std::optional<zero::PieceReader> pieces;
  if (read_grad && stream_grads) pieces.emplace(grad_pieces.get(), chunk);
  float* grad_buf = nullptr;
  IoHandle grad_read;
  if (read_grad && !pieces) {
    grad_buf = static_cast<float*>(grad_host.Take());
    auto rd = grad_store->Read(o.grad_slot, grad_buf, grad_slot_bytes);
    if (!rd.ok()) {
      grad_host.Give(grad_buf);
      return rd.status().WithContext("reading the gradient shard of chunk " + std::to_string(chunk));
    }
    grad_read = *rd;
    grad = grad_buf;
  }
  if (grad == nullptr && !pieces) grad = o.grad;
  bool on_host = true;
  Result<void*> taken = NvmeStepOutput(chunk, &on_host);
  Status s = taken.status();
  void* out = taken.ok() ? *taken : nullptr;
  if (s.ok() && read_grad && !pieces) {
    const int64_t t0 = NowNs();
    s = grad_read.Wait().WithContext("reading the gradient shard of chunk " + std::to_string(chunk));
    io_busy_ns += NowNs() - t0;
    if (s.ok()) bytes_nvme_read += grad_slot_bytes;
  }
  zero::OptimizerStep args = StepArgs(chunk, grad_scale, speculative, next_chunk);
  if (StreamsCompute()) SetPieceOutputs(chunk, args);
  if (pieces) SetGradPieces(chunk, &*pieces, args);
  if (s.ok()) s = nvme_opt->Step(args, grad, out).status();
  if (pieces) {
    Status done = pieces->Finish();
    if (s.ok()) s = done;
    bytes_nvme_read += pieces->bytes_read();
  }
  if (read_grad && !pieces) {
    if (!s.ok()) (void)grad_read.Wait();  // the buffer must be quiet before reuse
    grad_host.Give(grad_buf);
  }
  if (!StreamsCompute()) s = PlaceSteppedShard(chunk, out, on_host, s);
  if (!s.ok()) return s.WithContext("NVMe optimizer step of chunk " + std::to_string(chunk));
  if (!overlap) STRATA_RETURN_IF_ERROR(WaitNvmeWrites());
  if (speculative) {
    o.has_pending = true;
    o.speculated = true;
    ++speculative_count;
  } else {
    nvme_opt->Commit(chunk, step_epoch);  // current once the writes are on disk (SettleCommit)
    SyncParamSource(chunk);
  }
  return OkStatus();
}

Status Engine::Impl::WriteShardPieces(int chunk, const uint8_t* src) {
  for (int p = 0; p < piece_shape.pieces; ++p) {
    if (!piece_shape.Live(chunk, p)) continue;  // the gathers zero it
    STRATA_ASSIGN_OR_RETURN(float* buf, param_pieces->TakeWriteBuffer());
    std::memcpy(buf, src + p * piece_shape.piece_elems * csize, piece_shape.Elems(p) * csize);
    STRATA_RETURN_IF_ERROR(param_pieces->Write(chunk, p, buf).WithContext("writing parameters to NVMe"));
    bytes_nvme_written += param_pieces->piece_bytes(p);
  }
  return param_pieces->WaitChunk(chunk).WithContext("writing parameters to NVMe");
}

Result<float*> Engine::Impl::TakeOutPiece() {
  if (param_pieces) return param_pieces->TakeWriteBuffer();
  return static_cast<float*>(out_pieces.Take());
}

void Engine::Impl::GiveOutPiece(float* buf) {
  if (param_pieces) {
    param_pieces->GiveWriteBuffer(buf);
  } else {
    out_pieces.Give(buf);
  }
}

// StreamsCompute: the step's compute values of each live piece go where the shard lives:
// its slot on NVMe, written behind, or its place in host or device memory.
void Engine::Impl::SetPieceOutputs(int chunk, zero::OptimizerStep& args) {
  args.out_piece = [this](int) -> Result<void*> {
    STRATA_ASSIGN_OR_RETURN(float* buf, TakeOutPiece());
    return static_cast<void*>(buf);
  };
  args.piece_done = [this, chunk](int p, void* buf, bool ok) -> Status {
    auto* piece = static_cast<float*>(buf);
    const uint64_t offset = p * piece_shape.piece_elems * csize, bytes = piece_shape.Elems(p) * csize;
    Status st;
    if (ok && ParamTierOf(chunk) == ZeroTier::kNvme) {
      st = param_pieces->Write(chunk, p, piece);  // the buffer comes back once on disk
      if (st.ok()) bytes_nvme_written += param_pieces->piece_bytes(p);
      return st.WithContext("writing parameters to NVMe");
    }
    if (ok && ParamTierOf(chunk) == ZeroTier::kHost) {
      std::memcpy(static_cast<uint8_t*>(param_shard[chunk].ptr) + offset, buf, bytes);
    } else if (ok) {
      st = CopyToDevice(static_cast<uint8_t*>(param_shard[chunk].ptr) + offset, buf, bytes);
    }
    GiveOutPiece(piece);
    return st;
  };
}

Status Engine::Impl::PlaceSteppedShard(int chunk, void* out, bool on_host, Status s) {
  if (param_from_master) {
    // Its values are the master just written behind: kept in memory for the next
    // forward, never written on their own.
    if (s.ok()) {
      SetFresh(chunk, out);  // out null (streaming): a resident chunk's master, else none
      if (out != nullptr) out16_kept.push_back(out);
    } else if (out != nullptr) {
      out16_staging.Give(out);
    }
  } else if (publish_behind && !ParamOnDisk(chunk)) {
    if (s.ok()) s = PublishParams(chunk, out, /*from_host=*/true);
    if (out != nullptr) out16_staging.Give(out);
  } else if (publish_behind) {
    if (s.ok()) s = WaitParamWrite(chunk);
    if (s.ok()) {
      const SlotId slot = param_shard[chunk].slot;
      auto pw = param_store->Write(slot, out, opt_elems * csize);
      if (pw.ok()) {
        bytes_nvme_written += opt_elems * csize;
        param_writes.Push(zero::WriteBehind::Write{*pw, out, slot, -1, -1, "writing parameters to NVMe"});
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
    ReleaseOut16(out, on_host);
  }
  return s;
}

}  // namespace strata
