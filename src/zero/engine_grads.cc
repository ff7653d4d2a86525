// Gradient shards on NVMe (grad_tier kNvme, chosen by strata.gradients or when the
// host budget cannot hold one fp32 shard per chunk).
//
// Why: with the optimizer state on NVMe the fp32 gradient shards are the largest thing
// left in pinned host memory (4 bytes per parameter per rank), which caps the model at
// about twice the host budget. Here a reduced shard passes through one of a few pinned
// buffers (grad_host) on its way to a slot of its own store; the step reads it back with
// the state into the same staging set. When the step is speculative the shard is used
// from the pinned buffer before it goes to disk, so the disk copy is only read again
// when that step is redone (clipping engaged) or when overlap is off; without clipping
// no redo can happen and the final shard is not written at all.
//
// Accumulation over micro-batches reads the shard back, adds, and writes it again on
// the comm worker, in submission order; every reduction of a chunk after its first in
// the window costs one read and one write per shard. The read goes in a few ranges at
// once, and each is added as it lands, so that the adds overlap the rest of the read
// instead of following all of it (the disk would otherwise idle through them). The
// writes before the last micro-batch's go behind (grad_writes): the backward goes on
// while they land, and the next micro-batch's read of the slot waits for its write.
#include <algorithm>
#include <chrono>
#include <vector>

#include "strata/grad_stats.h"
#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

Status Engine::Impl::OpenGradStore() {
  // Resident chunks, and those whose gradients alone are kept, have pinned shards.
  const int on_disk = layout.num_chunks - info.optimizer_resident_chunks - info.gradient_resident_chunks;
  if (on_disk == 0) return OkStatus();
  NvmeStoreOptions so;
  so.paths = SwapPaths(config, config.zero.offload_optimizer);
  so.name = "strata-grad-r" + std::to_string(rank);
  so.slot_size = grad_slot_bytes;
  so.slot_count = on_disk;
  so.checksum = config.strata.checksum;
  if (stream_grads) return OpenGradPieces(so);
  STRATA_ASSIGN_OR_RETURN(grad_store, NvmeStore::Open(*io, so));
  for (int c = 0; c < layout.num_chunks; ++c) {
    if (GradTierOf(c) != ZeroTier::kNvme) continue;
    STRATA_ASSIGN_OR_RETURN(opt[c].grad_slot, grad_store->Allocate());
  }
  return OkStatus();
}

Status Engine::Impl::OpenGradPieces(NvmeStoreOptions so) {
  STRATA_ASSIGN_OR_RETURN(grad_pieces, OpenPieceSwap(std::move(so), 4, [this](int c) {
                            return GradTierOf(c) == ZeroTier::kNvme;
                          }));
  const uint64_t piece_bytes = piece_shape.SlotBytes(4);
  for (int i = 0; i < zero::kGradWritePieces + zero::kGradReadPieces; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(piece_bytes, "gradient pieces on their way to and from NVMe"));
    if (i < zero::kGradWritePieces)
      grad_pieces->AddWriteBuffer(static_cast<float*>(p));
    else
      grad_pieces->AddReadBuffer(static_cast<float*>(p));
  }
  return OkStatus();
}

Status Engine::Impl::AccumulateToHost(float* dst, const float* part, int64_t count) {
  const uint64_t step = recv_staging_elems, elems = count < 0 ? opt_elems : count;
  for (uint64_t off = 0; off < elems; off += step) {
    const uint64_t n = std::min(step, elems - off);
    STRATA_RETURN_IF_ERROR(CopyToHost(host_recv, part + off, n * 4));
    STRATA_RETURN_IF_ERROR(zero::HostMemoryOps().Accumulate(zero::OpsLane::kReduce, dst + off, host_recv, n));
  }
  return OkStatus();
}

Result<float*> Engine::Impl::TakeGradBuffer() {
  grad_writes.Reclaim();
  STRATA_ASSIGN_OR_RETURN(void* p, grad_writes.TakeFreeOrOldest());
  return static_cast<float*>(p != nullptr ? p : grad_host.Take());  // a speculative step gives one back
}

Status Engine::Impl::AccumulateGradOnNvme(int chunk, const float* part, bool first_in_window,
                                          bool last_micro_batch) {
  OptChunk& o = opt[chunk];
  const uint64_t bytes = opt_elems * 4;
  const std::string of_chunk = "the gradient shard of chunk " + std::to_string(chunk);
  // The previous micro-batch's write of this slot lands before it is read or written again.
  STRATA_RETURN_IF_ERROR(grad_writes.WaitSlot(o.grad_slot).WithContext(of_chunk));
  STRATA_ASSIGN_OR_RETURN(float* buf, TakeGradBuffer());
  Status st;
  if (first_in_window) {
    st = CopyToHost(buf, part, bytes);
  } else {
    st = ReadAndAccumulateGrad(chunk, buf, part);
  }
  if (st.ok() && last_micro_batch) {
    // The global norm and the overflow flag need every shard; take this one's part now,
    // while it is in memory, so Step() reads nothing back to learn them.
    auto stats = ComputeGradStats(GradView{buf, DType::kF32}, opt_elems);
    if (stats.ok()) {
      o.grad_stats = *stats;
    } else {
      st = stats.status();
    }
  }
  if (!st.ok()) {
    grad_host.Give(buf);
    return st;
  }
  const bool speculate = last_micro_batch && overlap && !o.grad_stats.has_inf_nan;
  o.grad_on_disk = false;
  if (speculate && config.gradient_clipping <= 0) {
    // Without clipping a speculative step is never redone (an overflow elsewhere skips
    // the whole step and restores the parameters), so nothing reads this shard again:
    // it need not go to disk at all.
    MaybeSpeculate(chunk, buf, [this, buf] {
      grad_host.Give(buf);
      return OkStatus();
    });
    return OkStatus();
  }
  auto wr = grad_store->Write(o.grad_slot, buf, grad_slot_bytes);
  if (!wr.ok()) {
    grad_host.Give(buf);
    return wr.status().WithContext("writing " + of_chunk + " to NVMe");
  }
  bytes_nvme_written += grad_slot_bytes;
  o.grad_on_disk = true;
  if (!last_micro_batch) {
    // The next micro-batch reads it back (WaitSlot above); the backward goes on meanwhile.
    grad_writes.Push(
        zero::WriteBehind::Write{*wr, buf, o.grad_slot, -1, -1, "writing a gradient shard to NVMe"});
    return OkStatus();
  }
  IoHandle write = *wr;
  auto finish = [this, write, buf, of_chunk]() mutable {
    Status s = write.Wait();
    grad_host.Give(buf);
    return s.WithContext("writing " + of_chunk + " to NVMe");
  };
  if (speculate) {
    // The speculative step reads the pinned copy while it is written, and hands the
    // buffer back once both are done.
    MaybeSpeculate(chunk, buf, finish);
    return OkStatus();
  }
  return finish();
}

Status Engine::Impl::ReadAndAccumulateGrad(int chunk, float* buf, const float* part) {
  const auto span_start = std::chrono::steady_clock::now();
  STRATA_ASSIGN_OR_RETURN(std::vector<NvmeStore::Range> reads,
                          grad_store->ReadInRanges(opt[chunk].grad_slot, buf, zero::kGradReadRanges));
  Status st;
  for (NvmeStore::Range& r : reads) {
    const int64_t t0 = NowNs();
    Status landed = r.read.Wait();  // every one, also after an error: `buf` goes back after
    io_busy_ns += NowNs() - t0;
    if (st.ok()) st = landed;
    if (!st.ok()) continue;
    bytes_nvme_read += r.length;
    // Its floats (the shard's opt_elems; the slot's tail past them is padding).
    const uint64_t lo = r.offset / 4, hi = std::min<uint64_t>(opt_elems, (r.offset + r.length) / 4);
    if (lo < hi) st = AccumulateToHost(buf + lo, part + lo, static_cast<int64_t>(hi - lo));
  }
  Span(track_nvme, "read grad chunk " + std::to_string(chunk), span_start, grad_slot_bytes);
  return st;
}

Status Engine::Impl::AccumulateGradPieces(int chunk, const float* part, bool first_in_window,
                                          bool last_micro_batch) {
  OptChunk& o = opt[chunk];
  GradStats stats;
  o.grad_on_disk = false;
  for (int p = 0; p < piece_shape.pieces; ++p) {
    if (!piece_shape.Live(chunk, p)) continue;  // the step never asks for it
    const int64_t off = p * piece_shape.piece_elems, n = piece_shape.Elems(p);
    STRATA_ASSIGN_OR_RETURN(float* buf, grad_pieces->TakeWriteBuffer());
    Status st;
    if (first_in_window) {
      st = CopyToHost(buf, part + off, n * 4);
    } else {
      const int64_t t0 = NowNs();
      auto rd = grad_pieces->Read(chunk, p, buf);
      st = rd.ok() ? rd->Wait() : rd.status();
      io_busy_ns += NowNs() - t0;
      if (st.ok()) {
        bytes_nvme_read += grad_pieces->piece_bytes(p);
        st = AccumulateToHost(buf, part + off, n);
      }
    }
    if (st.ok() && last_micro_batch) {
      auto piece_stats = ComputeGradStats(GradView{buf, DType::kF32}, n);
      if (piece_stats.ok()) stats.Merge(*piece_stats);
      st = piece_stats.status();
    }
    if (st.ok()) {
      st = grad_pieces->Write(chunk, p, buf);  // buf comes back once on disk
      if (st.ok()) bytes_nvme_written += grad_pieces->piece_bytes(p);
    } else {
      grad_pieces->GiveWriteBuffer(buf);
    }
    if (!st.ok()) return st.WithContext("the gradient shard of chunk " + std::to_string(chunk));
  }
  o.grad_on_disk = true;
  if (!last_micro_batch) return OkStatus();
  o.grad_stats = stats;
  // The speculative step reads the pieces back (MaybeSpeculate takes no stats then).
  if (overlap && !stats.has_inf_nan) MaybeSpeculate(chunk);
  return OkStatus();
}

}  // namespace strata
