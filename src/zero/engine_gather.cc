// Stage 3 parameter gathers along the trace, and optimizer-state read-ahead.
//
// The trace of a micro-batch is the recorded call order (trace.h). Gathers start for the
// chunks of the next prefetch_modules uses after the one running, as gather buffers allow; a
// gathered chunk stays while a module in that window needs it, so the last modules of
// forward are still there when backward starts with them, and the chunks the keep plan
// chose (keep_plan.h) stay from forward to backward and, with gradient accumulation, from
// one micro-batch's backward to the next one's forward. Which chunks are gathered and
// released depends only on module indices, buffer counts and the depth, which the
// ranks agree on (engine.cc, Step()), never on timing, so every rank issues the same
// all-gathers in the same order. A micro-batch off the recording gathers on demand and
// releases what no module holds.
//
// NVMe shards are read in two halves: the read is issued on the training thread as
// soon as the gather starts (into a pinned staging buffer, when one is free), and
// fetch_worker waits for it and copies it to the device. Several reads are then in
// flight at once, and one shard's copy overlaps the next one's read.
#include <algorithm>
#include <chrono>
#include <cstring>

#include "strata/log.h"
#include "zero/engine_impl.h"
#include "zero/keep_plan.h"
#include "zero/prefetch_depth.h"

namespace strata {

void* Engine::Impl::ChunkParams(int chunk) {
  if (stage < 3) return static_cast<uint8_t*>(param_full) + chunk * layout.chunk_elems * csize;
  auto it = gathered.find(chunk);
  STRATA_CHECK_MSG(it != gathered.end(), "chunk used before it was gathered");
  return it->second.buf;
}

// Someone waits for a shard soon (the module it serves is at most the window ahead): it
// goes to the disk before the optimizer's reads ahead and writes behind.
Result<std::vector<IoHandle>> Engine::Impl::ReadParamShard(int chunk, void* staged) {
  std::vector<IoHandle> reads;
  if (!param_from_master) {
    STRATA_ASSIGN_OR_RETURN(IoHandle h, param_store->Read(param_shard[chunk].slot, staged,
                                                          layout.shard_elems * csize, IoPriority::kUrgent));
    reads.push_back(h);
    return reads;
  }
  int version;
  {
    std::lock_guard lock(param_write_mu);
    version = param_source[chunk].version;
  }
  for (int p = 0; p < pieces; ++p) {
    uint8_t* dst = static_cast<uint8_t*>(staged) + p * piece_elems * 4;
    if (!PieceLive(chunk, p)) {
      std::memset(dst, 0, PieceElems(p) * 4);  // never written: zeros, as its state
      continue;
    }
    auto h = opt_store->Read(opt[chunk].slot[version][p], dst, PieceElems(p) * 4, IoPriority::kUrgent);
    if (!h.ok()) {
      for (const IoHandle& r : reads) (void)r.Wait();  // the buffer goes back only when quiet
      return h.status();
    }
    reads.push_back(*h);
  }
  return reads;
}

uint64_t Engine::Impl::ShardReadBytes(int chunk) const {
  if (!param_from_master) return layout.shard_elems * csize;
  uint64_t bytes = 0;
  for (int p = 0; p < pieces; ++p) bytes += PieceLive(chunk, p) ? PieceElems(p) * 4 : 0;
  return bytes;
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

void Engine::Impl::StartGather(int chunk) {
  Gathered g;
  g.buf = gather_pool.free.back();
  gather_pool.free.pop_back();
  const uint64_t shard_bytes = layout.shard_elems * csize;
  void* mine = static_cast<uint8_t*>(g.buf) + rank * shard_bytes;
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
      (staged = param_staging.TryTake()) != nullptr && ParamWriteDone(chunk)) {
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
  g.ready = comm_worker.Submit([this, fetched, g, mine, chunk, issued_ns] {
    STRATA_RETURN_IF_ERROR(fetched.get());
    int64_t t0 = NowNs();
    const auto span_start = std::chrono::steady_clock::now();
    // No device communicator (cuda, one rank): the shard is the whole chunk, in place.
    Status st = device_comm == nullptr
                    ? OkStatus()
                    : device_comm->AllGather(mine, g.buf, layout.shard_elems, compute).Wait();
    comm_busy_ns += NowNs() - t0;
    Span(track_comm, "all-gather chunk " + std::to_string(chunk), span_start, layout.chunk_elems * csize);
    bytes_comm += layout.chunk_elems * csize;
    gather_latency_ns += NowNs() - issued_ns;
    ++gathers_timed;
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
          if (gather_evictions++ == 0) {
            STRATA_LOG(kWarn, "engine") << "no planned gather buffer free for chunk " << chunk << "; chunk "
                                        << it->first << " released early (the buffer plan missed a case; "
                                        << "correct, but gathered again later)";
          }
          STRATA_RETURN_IF_ERROR(it->second.ready.get());
          gather_pool.free.push_back(it->second.buf);
          gathered.erase(it);
          break;
        }
      }
      if (gather_pool.free.empty()) {
        return OutOfBudgetError("engine: no free gather buffer for chunk " + std::to_string(chunk) + " (" +
                                std::to_string(gather_buffers) +
                                " buffers, all in use); raise strata.device_budget");
      }
    }
    StartGather(chunk);
  }
  Gathered& g = gathered[chunk];
  STRATA_RETURN_IF_ERROR(g.ready.get());
  ++g.users;
  return OkStatus();
}

void Engine::Impl::Prefetch(int pos) {
  if (order->diverged() || pos < 0) return;  // off the recording, or an evaluation pass
  const zero::Trace& trace = order->trace();
  for (int p = pos + 1; p <= pos + prefetch_modules && p < trace.size(); ++p) {
    for (int c : zero::GatheredChunks(trace.at(p), layout)) {
      if (gathered.count(c)) continue;
      if (gather_pool.free.empty()) return;  // in trace order: nothing later jumps the queue
      StartGather(c);
    }
  }
}

int Engine::Impl::MeasuredPrefetch() {
  const int gathers = gathers_timed.exchange(0);
  const int64_t latency = gather_latency_ns.exchange(0);
  int depth = prefetch_modules;
  if (max_prefetch_modules > 0 && gathers > 0 && modules_timed > 0) {
    depth = zero::PrefetchDepth(latency * 1e-9 / gathers, module_compute_ns * 1e-9 / modules_timed,
                                max_prefetch_modules);
    STRATA_LOG(kDebug, "engine") << "measured prefetch depth " << depth << " modules (gather "
                                 << latency / 1e6 / gathers << " ms, module compute "
                                 << module_compute_ns / 1e6 / modules_timed << " ms)";
  }
  module_compute_ns = 0;
  modules_timed = 0;
  return depth;
}

Status Engine::Impl::CheckHooksDone() const {
  if (open_backward >= 0) {
    // A backward left open (a model kernel failed between its hooks): its gradients were
    // never finished, and a step now would apply the window without them.
    return FailedPreconditionError("engine: Step() while the backward of module \"" +
                                   model.modules[open_backward].name +
                                   "\" is open (BeginBackward without EndBackward)");
  }
  for (const auto& [chunk, g] : gathered) {
    if (g.users > 0) {
      return FailedPreconditionError("engine: Step() while module hooks hold chunk " + std::to_string(chunk) +
                                     " (call it after Release / EndBackward of every module)");
    }
  }
  return OkStatus();
}

Status Engine::Impl::DropGathered() {
  STRATA_RETURN_IF_ERROR(CheckHooksDone());
  Status first;
  for (auto& [chunk, g] : gathered) {
    Status st = g.ready.get();  // the buffer is free only once its gather is done
    if (first.ok() && !st.ok()) first = st;
    gather_pool.free.push_back(g.buf);
  }
  gathered.clear();
  return first;
}

void Engine::Impl::ReleaseGathered(int module, int pos) {
  for (int c : layout.module_chunks[module]) --gathered[c].users;
  const bool follows = !order->diverged() && pos >= 0;
  const zero::Trace& trace = order->trace();
  std::vector<int> keep;
  for (int p = pos + 1; follows && p <= pos + prefetch_modules && p < trace.size(); ++p) {
    const auto& chunks = zero::GatheredChunks(trace.at(p), layout);
    keep.insert(keep.end(), chunks.begin(), chunks.end());
  }
  for (auto it = gathered.begin(); it != gathered.end();) {
    const bool needed = std::find(keep.begin(), keep.end(), it->first) != keep.end() ||
                        (follows && zero::StaysGathered(order->uses(), kept_chunk, carried_chunk, it->first,
                                                        pos, LastMicroBatch()));
    // A chunk still in flight is waited for: releasing must not depend on timing.
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

void Engine::Impl::ReadStatesAhead() {
  if (opt_tier != ZeroTier::kNvme || !overlap) return;
  // The backward finishes the last chunk first. A failed read is not lost: the step
  // finds no read for its chunk and issues it again, which reports the error.
  opt_worker.Submit([this] {
    Status st = ReadAheadDescending(layout.num_chunks - 1);
    if (!st.ok()) STRATA_LOG(kWarn, "engine") << "optimizer state read-ahead: " << st.ToString();
    return OkStatus();
  });
}

}  // namespace strata
