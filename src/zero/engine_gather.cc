// Stage 3: the journey of a chunk's parameters to the device, for the gatherer
// (param_gatherer.h, which decides what is gathered when), and optimizer-state read-ahead.
//
// A gather brings this rank's shard in from its tier (the device, pinned memory, a fresh
// copy the step left in memory, or NVMe) and all-gathers the chunk over the ranks.
// NVMe shards are read in two halves: the read is issued on the training thread as
// soon as the gather starts (into a pinned staging buffer, when one is free), and
// fetch_worker waits for it and copies it to the device. Several reads are then in
// flight at once, and one shard's copy overlaps the next one's read. A streamed shard
// (stream_pieces) is read on fetch_worker instead, half a buffer ahead of its copy.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

void* Engine::Impl::ChunkParams(int chunk) {
  if (stage < 3) return static_cast<uint8_t*>(param_full) + chunk * layout.chunk_elems * csize;
  return gatherer->Params(chunk);
}

// Someone waits for a shard soon (the module it serves is at most the window ahead): it
// goes to the disk before the optimizer's reads ahead and writes behind.
Result<std::vector<IoHandle>> Engine::Impl::ReadParamShard(int chunk, void* staged) {
  if (!param_from_master) {
    STRATA_ASSIGN_OR_RETURN(IoHandle h, param_store->Read(param_shard[chunk].slot, staged,
                                                          layout.shard_elems * csize, IoPriority::kUrgent));
    return std::vector<IoHandle>{h};
  }
  int version;
  {
    std::lock_guard lock(param_write_mu);
    version = param_source[chunk].version;
  }
  return ReadMasterPieces(chunk, version, staged, 0, piece_shape.pieces);
}

Result<std::vector<IoHandle>> Engine::Impl::ReadMasterPieces(int chunk, int version, void* staged, int first,
                                                             int end) {
  std::vector<IoHandle> reads;
  for (int p = first; p < end; ++p) {
    uint8_t* dst = static_cast<uint8_t*>(staged) + (p - first) * piece_shape.piece_elems * 4;
    if (!piece_shape.Live(chunk, p)) {
      std::memset(dst, 0, piece_shape.Elems(p) * 4);  // never written: zeros, as its state
      continue;
    }
    auto h = nvme_opt->store()->Read(nvme_opt->Slot(chunk, version, p), dst, piece_shape.Elems(p) * 4,
                                     IoPriority::kUrgent);
    if (!h.ok()) {
      for (const IoHandle& r : reads) (void)r.Wait();  // the buffer goes back only when quiet
      return h.status();
    }
    reads.push_back(*h);
  }
  return reads;
}

uint64_t Engine::Impl::ShardReadBytes(int chunk, int first, int end) const {
  if (!param_from_master) return layout.shard_elems * csize;
  if (end < 0) end = piece_shape.pieces;
  uint64_t bytes = 0;
  for (int p = first; p < end; ++p) bytes += piece_shape.Live(chunk, p) ? piece_shape.Elems(p) * 4 : 0;
  return bytes;
}

Status Engine::Impl::StreamShard(int chunk, uint8_t* dst, uint8_t* staged) {
  STRATA_RETURN_IF_ERROR(WaitParamWrite(chunk));
  int version = 0;
  if (param_from_master) {
    std::lock_guard lock(param_write_mu);
    version = param_source[chunk].version;  // one version for every half
  }
  const int pieces = piece_shape.pieces, per = stream_pieces;
  // Pieces sit a slot apart in a half (for the master's, exactly a piece apart).
  const uint64_t stride = piece_shape.SlotBytes(csize);
  auto half = [&](int first) { return staged + (first / per % 2) * per * stride; };
  auto read = [&](int first) -> Result<std::vector<IoHandle>> {
    const int end = std::min(first + per, pieces);
    if (param_from_master) return ReadMasterPieces(chunk, version, half(first), first, end);
    std::vector<IoHandle> reads;
    for (int p = first; p < end; ++p) {
      uint8_t* to = half(first) + (p - first) * stride;
      if (!piece_shape.Live(chunk, p)) {
        std::memset(to, 0, piece_shape.Elems(p) * csize);  // never written: zeros
        continue;
      }
      auto h = param_pieces->Read(chunk, p, reinterpret_cast<float*>(to));
      if (!h.ok()) {
        for (const IoHandle& r : reads) (void)r.Wait();  // the half is reused only when quiet
        return h.status();
      }
      reads.push_back(*h);
      bytes_nvme_read += param_pieces->piece_bytes(p);
    }
    return reads;
  };
  auto reads = read(0);
  STRATA_RETURN_IF_ERROR(reads.status());
  Status st;
  for (int first = 0; first < pieces; first += per) {
    const int end = std::min(first + per, pieces);
    for (const IoHandle& r : *reads) {
      Status done = r.Wait();  // every one: the half is reused after
      if (st.ok()) st = done;
    }
    reads = std::vector<IoHandle>{};
    if (st.ok() && end < pieces) reads = read(end);
    if (st.ok()) st = reads.status();
    if (param_from_master && st.ok()) bytes_nvme_read += ShardReadBytes(chunk, first, end);
    for (int p = first; st.ok() && p < end; ++p) {
      st = CopyToDevice(dst + p * piece_shape.piece_elems * csize, half(first) + (p - first) * stride,
                        piece_shape.Elems(p) * csize);
    }
    if (!st.ok()) {
      if (reads.ok()) {
        for (const IoHandle& r : *reads) (void)r.Wait();
      }
      return st;
    }
  }
  return OkStatus();
}

// Brings this rank's 16-bit shard of `chunk` into dst (device memory).
Status Engine::Impl::FetchShard(int chunk, void* dst, void* staged, std::vector<IoHandle> reads, void* fresh,
                                std::chrono::steady_clock::time_point start) {
  const uint64_t bytes = layout.shard_elems * csize;
  int64_t t0 = NowNs();
  Status st;
  switch (ParamTierOf(chunk)) {
    case ZeroTier::kDevice:
      st = device->CopyAsync(h2d, dst, param_shard[chunk].ptr, bytes, CopyDir::kDeviceToDevice);
      if (st.ok()) st = device->Synchronize(h2d);
      break;
    case ZeroTier::kHost: st = CopyToDevice(dst, param_shard[chunk].ptr, bytes); break;
    case ZeroTier::kNvme: {
      if (fresh != nullptr) {
        st = CopyToDevice(dst, fresh, bytes);
        ReturnFresh(fresh);
        break;
      }
      if (staged == nullptr) {
        staged = param_staging.Take();
        --fetches_awaiting_staging;
      }
      if (stream_pieces > 0) {
        st = StreamShard(chunk, static_cast<uint8_t*>(dst), static_cast<uint8_t*>(staged));
        param_staging.Give(staged);
        break;
      }
      if (reads.empty()) {
        st = WaitParamWrite(chunk);
        auto h = st.ok() ? ReadParamShard(chunk, staged) : Result<std::vector<IoHandle>>(st);
        if (h.ok()) reads = std::move(*h);
        st = h.status();
      }
      for (const IoHandle& r : reads) {
        Status done = r.Wait();  // every one: the buffer is reused after
        if (st.ok()) st = done;
      }
      if (st.ok()) {
        bytes_nvme_read += ShardReadBytes(chunk);
        st = CopyToDevice(dst, staged, bytes);
      }
      param_staging.Give(staged);
      break;
    }
  }
  io_busy_ns += NowNs() - t0;
  Span(track_fetch, "fetch chunk " + std::to_string(chunk), start, bytes);
  return st.WithContext("fetching the parameter shard of chunk " + std::to_string(chunk));
}

std::shared_future<Status> Engine::Impl::StartChunkGather(int chunk, void* buf) {
  const uint64_t shard_bytes = layout.shard_elems * csize;
  void* mine = static_cast<uint8_t*>(buf) + rank * shard_bytes;
  const auto start = std::chrono::steady_clock::now();
  const int64_t issued_ns = NowNs();
  void* staged = nullptr;
  std::vector<IoHandle> reads;
  const bool on_disk = ParamTierOf(chunk) == ZeroTier::kNvme;
  void* fresh = on_disk ? BorrowFresh(chunk) : nullptr;
  if (fresh != nullptr) ++shards_from_memory;
  // Fetches run in order on fetch_worker, and one without a buffer takes one there,
  // blocking: so a gather may take a buffer here only while no earlier one waits for
  // one, else the buffers could all go to gathers queued behind the waiter (a deadlock
  // a deeper prefetch window made happen). A shard the last step is still writing is
  // read by FetchShard once it is on disk, into the buffer taken here all the same: the
  // gathers after it then still take theirs and read at once (without, the first
  // gathers of a forward queued behind the previous step's last writes one at a time,
  // leaving the disk idle in between).
  if (on_disk && fresh == nullptr && fetches_awaiting_staging.load() == 0 &&
      (staged = param_staging.TryTake()) != nullptr && stream_pieces == 0 && ParamWriteDone(chunk)) {
    auto h = ReadParamShard(chunk, staged);
    if (h.ok()) {
      reads = std::move(*h);
    } else {
      // FetchShard reads again and reports the error with its context.
      param_staging.Give(staged);
      staged = nullptr;
    }
  }
  if (on_disk && fresh == nullptr && staged == nullptr) ++fetches_awaiting_staging;
  std::shared_future<Status> fetched = fetch_worker.Submit([this, chunk, mine, staged, reads, fresh, start] {
    return FetchShard(chunk, mine, staged, reads, fresh, start);
  });
  return comm_worker.Submit([this, fetched, buf, mine, chunk, issued_ns] {
    STRATA_RETURN_IF_ERROR(fetched.get());
    int64_t t0 = NowNs();
    const auto span_start = std::chrono::steady_clock::now();
    // No device communicator (cuda, one rank): the shard is the whole chunk, in place.
    Status st = device_comm == nullptr
                    ? OkStatus()
                    : device_comm->AllGather(mine, buf, layout.shard_elems, compute).Wait();
    comm_busy_ns += NowNs() - t0;
    Span(track_comm, "all-gather chunk " + std::to_string(chunk), span_start, layout.chunk_elems * csize);
    bytes_comm += layout.chunk_elems * csize;
    gatherer->NoteGatherLatency(NowNs() - issued_ns);
    return st;
  });
}

Status Engine::Impl::CheckHooksDone() const {
  if (open_backward >= 0) {
    // A backward left open (a model kernel failed between its hooks): its gradients were
    // never finished, and a step now would apply the window without them.
    return FailedPreconditionError("engine: Step() while the backward of module \"" +
                                   model.modules[open_backward].name +
                                   "\" is open (BeginBackward without EndBackward)");
  }
  return stage == 3 ? gatherer->CheckNoneHeld() : OkStatus();
}

Status Engine::Impl::DropGathered() {
  STRATA_RETURN_IF_ERROR(CheckHooksDone());
  return gatherer->DropAll();
}

void Engine::Impl::ReadStatesAhead() {
  if (opt_tier != ZeroTier::kNvme || !overlap) return;
  // The backward finishes the last chunk first. A failed read is not lost: the step
  // finds no read for its chunk and issues it again, which reports the error.
  opt_worker.Submit([this] {
    const int last = layout.num_chunks - 1;
    Status st = nvme_opt->ReadAhead(last, 0, last - 1, /*descending=*/true);
    if (!st.ok()) STRATA_LOG(kWarn, "engine") << "optimizer state read-ahead: " << st.ToString();
    return OkStatus();
  });
}

}  // namespace strata
