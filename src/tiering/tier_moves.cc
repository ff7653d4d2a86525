// Moves: handing them to lanes, running them (without the lock) and applying their
// completion to the residency state (with it).
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <cstring>

#include "strata/log.h"
#include "strata/units.h"
#include "tiering/tier_internal.h"

namespace strata {

using tiering::Block;
using tiering::Copy;
using tiering::Move;

namespace tiering {

Lane LaneOf(Move::Kind kind) {
  switch (kind) {
    case Move::Kind::kH2D: return Lane::kH2D;
    case Move::Kind::kD2H: return Lane::kD2H;
    case Move::Kind::kNvmeRead: return Lane::kNvmeRead;
    case Move::Kind::kNvmeWrite: return Lane::kNvmeWrite;
    case Move::Kind::kZeroFill: return Lane::kCpu;
  }
  return Lane::kCpu;
}

}  // namespace tiering

namespace {
const char* MoveVerb(Move::Kind k) {
  switch (k) {
    case Move::Kind::kH2D: return "H2D";
    case Move::Kind::kD2H: return "D2H";
    case Move::Kind::kNvmeRead: return "read";
    case Move::Kind::kNvmeWrite: return "write";
    case Move::Kind::kZeroFill: return "zero";
  }
  return "?";
}
}  // namespace

void TierManager::Impl::Launch(Move m) {
  in_flight++;
  Block* b = Find(m.block);
  STRATA_CHECK(b != nullptr);
  b->moves++;
  if (options.synchronous) {
    sync_queue.push_back(std::move(m));
    return;
  }
  lanes->Submit(tiering::LaneOf(m.kind), [this, m = std::move(m)] { RunMove(m, false); });
}

void TierManager::Impl::RunMove(const Move& m, bool locked) {
  Lane lane = tiering::LaneOf(m.kind);
  auto begin = Timeline::Clock::now();
  Status s = Execute(m);
  auto end = Timeline::Clock::now();
  timeline->Record(tracks[static_cast<size_t>(lane)],
                   tiering::BlockName(options, m.block) + " " + MoveVerb(m.kind) +
                       (m.prefetch ? " (prefetch)" : m.writeback ? " (evict)" : ""),
                   begin, end, m.bytes);
  std::unique_lock<std::mutex> lock(mu, std::defer_lock);
  if (!locked) lock.lock();
  LaneTelemetry& lt = lane_tele[static_cast<size_t>(lane)];
  lt.moves++;
  if (s.ok()) lt.bytes += m.bytes;
  lt.busy_s += std::chrono::duration<double>(end - begin).count();
  OnMoveDone(m, s);
}

Status TierManager::Impl::Execute(const Move& m) {
  switch (m.kind) {
    case Move::Kind::kH2D:
    case Move::Kind::kD2H: {
      bool h2d = m.kind == Move::Kind::kH2D;
      StreamId stream = h2d ? h2d_stream : d2h_stream;
      STRATA_RETURN_IF_ERROR(options.device->CopyAsync(
          stream, m.dst_ptr, m.src_ptr, m.bytes, h2d ? CopyDir::kHostToDevice : CopyDir::kDeviceToHost));
      return options.device->Synchronize(stream);
    }
    case Move::Kind::kNvmeRead:
      return nvme->ReadSlots(m.slots, m.dst_ptr, m.bytes);
    case Move::Kind::kNvmeWrite:
      return nvme->WriteSlots(m.slots, m.src_ptr, m.bytes);
    case Move::Kind::kZeroFill: {
      // Zero pages in parallel pieces: a fill of a large block is memory-bound.
      constexpr uint64_t kPiece = 1 << 20;
      auto* dst = static_cast<std::byte*>(m.dst_ptr);
      uint64_t pieces = (m.bytes + kPiece - 1) / kPiece;
      cpu_arena.execute([&] {
        tbb::parallel_for(uint64_t{0}, pieces, [&](uint64_t i) {
          uint64_t off = i * kPiece;
          std::memset(dst + off, 0, std::min(kPiece, m.bytes - off));
        });
      });
      return OkStatus();
    }
  }
  return InternalError("unknown move kind");
}

void TierManager::Impl::OnMoveDone(const Move& m, const Status& status) {
  in_flight--;
  Block* bp = Find(m.block);
  STRATA_CHECK(bp != nullptr);
  Block& b = *bp;
  b.moves--;
  if (m.prefetch) prefetch_outstanding--;
  const bool src_mem = m.src != Tier::kNvme;
  const bool dst_mem = m.dst != Tier::kNvme;
  if (src_mem) {
    b.copies[static_cast<size_t>(tiering::TierIndex(m.src))].readers--;
  } else {
    b.nvme.readers[static_cast<size_t>(m.slot)]--;
  }
  if (!dst_mem) b.nvme.writing[static_cast<size_t>(m.slot)] = false;

  if (status.ok()) {
    if (dst_mem) {
      size_t di = static_cast<size_t>(tiering::TierIndex(m.dst));
      Copy& c = b.copies[di];
      if (c.state == Copy::State::kLoading && c.version == b.version) {
        c.state = Copy::State::kValid;
      } else if (c.state == Copy::State::kLoading) {
        FreeCopy(b, m.dst);  // written meanwhile: these bytes are stale
        if (b.pins[di] > 0) Want(b, m.dst, false);
      }
    } else {
      tiering::NvmeCopy& n = b.nvme;
      if (b.speculating) {
        n.tentative = m.slot;
        n.tentative_version = m.version;
      } else {
        n.committed = m.slot;
        n.committed_version = m.version;
        n.zero = false;
        n.tentative = -1;
      }
    }
    if (m.writeback) {
      Copy& s = b.copies[static_cast<size_t>(tiering::TierIndex(m.src))];
      if (s.state == Copy::State::kLeaving) FreeCopy(b, m.src);
    }
  } else {
    tele.io_errors++;
    std::string what = std::string("moving ") + tiering::BlockName(options, m.block) + " " +
                       std::string(TierName(m.src)) + " -> " + std::string(TierName(m.dst));
    Status err = status.WithContext(what);
    STRATA_LOG(kWarn, "tier") << err.ToString() << "; the block stays valid where it was";
    if (async_error.ok()) async_error = err;
    if (dst_mem) {
      FreeCopy(b, m.dst);
    } else {
      if (b.nvme.tentative == m.slot) b.nvme.tentative = -1;
      b.evict_error[static_cast<size_t>(tiering::TierIndex(m.src))] = err;
    }
    if (m.writeback) {
      size_t si = static_cast<size_t>(tiering::TierIndex(m.src));
      Copy& s = b.copies[si];
      if (s.state == Copy::State::kLeaving) {
        s.state = Copy::State::kValid;
        leaving[si] -= b.alloc;
      }
      b.evict_error[si] = err;
      // An acquisition on the destination that came while this copy was loading dropped
      // its want and waits for this completion: it hears the error, as after a load.
      if (dst_mem && b.pins[static_cast<size_t>(tiering::TierIndex(m.dst))] > 0) FailTickets(b, m.dst, err);
      // Whoever waited for this room hears why it did not come.
      Status why = err.WithContext("while evicting to make room on " + std::string(TierName(m.src)));
      for (auto& [id, o] : blocks) {
        size_t oi = si;
        if (o.want[oi] != 0 && o.copies[oi].state == Copy::State::kAbsent) {
          if (o.want[oi] == 2) {
            FailTickets(o, m.src, why);
          } else {
            o.pending_error = why;
            DropWant(o, m.src);
          }
        }
      }
    } else if (dst_mem) {
      size_t di = static_cast<size_t>(tiering::TierIndex(m.dst));
      bool demand = dst_mem && b.pins[di] > 0;
      if (m.dst == Tier::kHost && b.want_hold[0] && b.pins[0] > 0) {
        FailTickets(b, Tier::kDevice, err);
        demand = true;
      } else if (m.dst == Tier::kHost && b.want_hold[0]) {
        DropWant(b, Tier::kDevice);
      }
      if (demand) {
        FailTickets(b, m.dst, err);
      } else {
        b.pending_error = err;
      }
    }
  }
  // A stale source copy goes once nothing reads it.
  if (src_mem) {
    size_t si = static_cast<size_t>(tiering::TierIndex(m.src));
    Copy& s = b.copies[si];
    if (s.state == Copy::State::kValid && s.version != b.version && s.readers == 0) FreeCopy(b, m.src);
  }
  NotifyTickets(b);
  Pump();
  cv.notify_all();
}

}  // namespace strata
