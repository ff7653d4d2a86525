// The scheduler: turns wanted (block, tier) pairs and evictions into moves on lanes,
// making room under the budgets first. Every function here runs with Impl::mu held.
#include <algorithm>

#include "strata/log.h"
#include "strata/units.h"
#include "tiering/tier_internal.h"

namespace strata {

using tiering::Block;
using tiering::Copy;
using tiering::Move;
using tiering::Pending;
using tiering::TierIndex;
using tiering::TierAt;

namespace {
constexpr int kPrefetch = 1;
constexpr int kDemand = 2;
bool IsValid(const Block& b, const Copy& c) {
  return c.state == Copy::State::kValid && c.version == b.version;
}
}  // namespace

void TierManager::Impl::UpdateHighWater(Tier t) {
  size_t i = static_cast<size_t>(TierIndex(t));
  high_water[i] = std::max(high_water[i], used[i]);
}

bool TierManager::Impl::NvmeValid(const Block& b) const { return NvmeValidSlot(b) >= 0; }

int TierManager::Impl::NvmeValidSlot(const Block& b) const {
  if (b.home != Tier::kNvme) return -1;
  const tiering::NvmeCopy& n = b.nvme;
  if (n.tentative >= 0 && n.tentative_version == b.version && !n.writing[static_cast<size_t>(n.tentative)])
    return n.tentative;
  if (n.committed_version == b.version && !n.writing[static_cast<size_t>(n.committed)]) return n.committed;
  return -1;
}

bool TierManager::Impl::HasOtherValid(const Block& b, Tier t) const {
  for (int u = 0; u < 2; ++u) {
    if (u != TierIndex(t) && IsValid(b, b.copies[static_cast<size_t>(u)])) return true;
  }
  return t != Tier::kNvme && NvmeValid(b);
}

bool TierManager::Impl::CanEvict(const Block& b, Tier t) const {
  size_t i = static_cast<size_t>(TierIndex(t));
  const Copy& c = b.copies[i];
  if (!IsValid(b, c) || c.readers != 0 || b.pins[i] != 0) return false;
  // A host copy held for a device prefetch may go (the prefetch is cancelled); one held
  // for a device acquisition may not.
  if (b.holds[i] != 0 && !(t == Tier::kHost && b.want[0] == kPrefetch)) return false;
  if (t == b.home) return false;
  return true;
}

uint64_t TierManager::Impl::Unevictable(Tier t) const {
  size_t i = static_cast<size_t>(TierIndex(t));
  uint64_t sum = 0;
  for (const auto& [id, b] : blocks) {
    const Copy& c = b.copies[i];
    bool present = c.state != Copy::State::kAbsent;
    if (b.pins[i] > 0 || (present && b.home == t)) sum += b.alloc;
  }
  return sum;
}

bool TierManager::Impl::TierBusy(Tier t) const {
  size_t i = static_cast<size_t>(TierIndex(t));
  if (leaving[i] > 0) return true;
  for (const auto& [id, b] : blocks) {
    const Copy& c = b.copies[i];
    if (c.state == Copy::State::kLoading || c.readers > 0 || b.holds[i] > 0) return true;
  }
  return false;
}

bool TierManager::Impl::AllocateStorage(Tier t, uint64_t bytes, void** ptr, HostBlock* host) {
  if (t == Tier::kDevice) {
    auto& cache = device_cache[0][bytes];
    if (!cache.empty()) {
      *ptr = cache.back();
      cache.pop_back();
      return true;
    }
    for (int attempt = 0; attempt < 2; ++attempt) {
      Result<void*> r = options.device->Allocate(bytes);
      if (r.ok()) {
        *ptr = *r;
        return true;
      }
      // Cached buffers of other sizes may be what is in the way.
      for (auto& [size, list] : device_cache[0]) {
        for (void* p : list) options.device->Free(p);
        list.clear();
      }
    }
    return false;
  }
  auto& cache = host_cache[bytes];
  if (!cache.empty()) {
    *host = cache.back();
    cache.pop_back();
    *ptr = host->data;
    return true;
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    Result<HostBlock> r = options.host_arena->Allocate(bytes);
    if (r.ok()) {
      *host = *r;
      *ptr = host->data;
      return true;
    }
    for (auto& [size, list] : host_cache) {
      for (const HostBlock& hb : list) options.host_arena->Free(hb);
      list.clear();
    }
  }
  return false;
}

void TierManager::Impl::FreeStorage(Tier t, Copy& c, uint64_t bytes) {
  if (c.ptr == nullptr) return;
  if (t == Tier::kDevice) {
    device_cache[0][bytes].push_back(c.ptr);
  } else {
    host_cache[bytes].push_back(c.host);
  }
  c.ptr = nullptr;
  c.host = HostBlock{};
}

void TierManager::Impl::FreeCopy(Block& b, Tier t) {
  size_t i = static_cast<size_t>(TierIndex(t));
  Copy& c = b.copies[i];
  if (c.state == Copy::State::kAbsent) return;
  if (t == Tier::kHost && b.want_hold[0] && b.want[0] == kPrefetch) {
    DropWant(b, Tier::kDevice);  // the device prefetch it was held for is cancelled
    tele.prefetches_skipped++;
  }
  if (c.state == Copy::State::kLeaving) leaving[i] -= b.alloc;
  FreeStorage(t, c, b.alloc);
  used[i] -= b.alloc;
  uint64_t last_use = c.last_use;
  c = Copy{};
  c.last_use = last_use;
}

void TierManager::Impl::StartWriteback(Block& b, Tier from) {
  size_t i = static_cast<size_t>(TierIndex(from));
  b.copies[i].state = Copy::State::kLeaving;
  leaving[i] += b.alloc;
  tele.evictions++;
  tele.writebacks++;
  pending.push_back(Pending{Pending::Kind::kWriteback, b.id, from});
}

bool TierManager::Impl::Reserve(Tier t, uint64_t bytes, bool prefetch, uint64_t priority,
                                void** ptr, HostBlock* host, bool* no_victim) {
  *no_victim = false;
  size_t ti = static_cast<size_t>(TierIndex(t));
  const uint64_t budget = options.budgets[t];
  if (bytes > budget) {
    *no_victim = true;
    return false;
  }
  for (int attempt = 0; attempt < 4; ++attempt) {
    uint64_t need;
    if (used[ti] + bytes <= budget) {
      if (AllocateStorage(t, bytes, ptr, host)) {
        used[ti] += bytes;
        UpdateHighWater(t);
        return true;
      }
      need = bytes;  // fragmented: free a block's worth more
    } else {
      need = used[ti] + bytes - budget;
    }
    if (leaving[ti] >= need) return false;  // enough is on its way out already
    need -= leaving[ti];

    // Device victims that must be written down need room on host: free, on its way
    // out, or evictable now (else the write-back could not start and we would spin).
    int host_room = -1;
    struct Candidate {
      uint64_t priority;
      Block* block;
    };
    std::vector<Candidate> candidates;
    for (auto& [id, b] : blocks) {
      if (!CanEvict(b, t)) continue;
      bool duplicate = t == Tier::kHost && IsValid(b, b.copies[0]);
      uint64_t p = policy->EvictionPriority(id, b.copies[ti].last_use, duplicate);
      if (prefetch && p <= priority) continue;
      if (!HasOtherValid(b, t) && t == Tier::kDevice) {
        if (options.budgets.host < b.alloc) continue;
        if (host_room < 0) host_room = CanMakeRoom(Tier::kHost, b.alloc, 0) ? 1 : 0;
        if (host_room == 0) continue;
      }
      candidates.push_back(Candidate{p, &b});
    }
    if (candidates.empty()) {
      *no_victim = leaving[ti] == 0;
      return false;
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.priority > b.priority; });
    bool dropped = false;
    for (const Candidate& cand : candidates) {
      if (need == 0) break;
      Block& v = *cand.block;
      if (HasOtherValid(v, t)) {
        FreeCopy(v, t);
        tele.evictions++;
        tele.clean_drops++;
        dropped = true;
      } else {
        StartWriteback(v, t);
      }
      need = v.alloc >= need ? 0 : need - v.alloc;
    }
    if (!dropped) return false;
  }
  return false;
}

bool TierManager::Impl::CanMakeRoom(Tier t, uint64_t bytes, uint64_t priority) const {
  size_t ti = static_cast<size_t>(TierIndex(t));
  const uint64_t budget = options.budgets[t];
  uint64_t room = budget > used[ti] ? budget - used[ti] : 0;
  room += leaving[ti];
  if (room >= bytes) return true;
  for (const auto& [id, b] : blocks) {
    if (!CanEvict(b, t)) continue;
    bool duplicate = t == Tier::kHost && IsValid(b, b.copies[0]);
    if (policy->EvictionPriority(id, b.copies[ti].last_use, duplicate) <= priority) continue;
    room += b.alloc;
    if (room >= bytes) return true;
  }
  return false;
}

void TierManager::Impl::Want(Block& b, Tier t, bool prefetch) {
  size_t i = static_cast<size_t>(TierIndex(t));
  int level = prefetch ? kPrefetch : kDemand;
  if (b.want[i] == 0) pending.push_back(Pending{Pending::Kind::kLoad, b.id, t});
  b.want[i] = std::max(b.want[i], level);
}

void TierManager::Impl::DropWant(Block& b, Tier t) {
  size_t i = static_cast<size_t>(TierIndex(t));
  b.want[i] = 0;
  if (t == Tier::kDevice && b.want_hold[0]) {
    b.want_hold[0] = false;
    b.holds[1]--;
  }
}

bool TierManager::Impl::Advance(const Pending& p) {
  Block* b = Find(p.block);
  if (b == nullptr) return true;
  if (p.kind == Pending::Kind::kWriteback) return AdvanceWriteback(*b, p.tier);
  return AdvanceLoad(*b, p.tier);
}

bool TierManager::Impl::AdvanceWriteback(Block& b, Tier from) {
  size_t fi = static_cast<size_t>(TierIndex(from));
  Copy& c = b.copies[fi];
  if (c.state != Copy::State::kLeaving) return true;
  // No write is needed when a copy appeared elsewhere meanwhile, or when the block was
  // written elsewhere since this copy was chosen: its bytes are no version worth keeping
  // (and the write would record them as the current one).
  const bool stale = c.version != b.version && c.readers == 0;
  if (stale || HasOtherValid(b, from)) {
    FreeCopy(b, from);
    tele.writebacks--;
    if (!stale) tele.clean_drops++;
    return true;
  }
  if (from == Tier::kHost) {
    tiering::NvmeCopy& n = b.nvme;
    int target = n.nslots == 2 ? 1 - n.committed : n.committed;
    size_t ts = static_cast<size_t>(target);
    if (n.readers[ts] > 0 || n.writing[ts]) return false;
    if (n.tentative == target) n.tentative = -1;
    if (n.nslots == 1) n.committed_version = 0;  // overwritten in place: not valid until done
    Move m;
    m.kind = Move::Kind::kNvmeWrite;
    m.block = b.id;
    m.src = Tier::kHost;
    m.dst = Tier::kNvme;
    m.version = c.version;
    m.writeback = true;
    m.slot = target;
    m.src_ptr = c.ptr;
    m.slots = n.slots[ts];
    m.bytes = b.alloc;
    c.readers++;
    n.writing[ts] = true;
    Launch(std::move(m));
    return true;
  }
  // device -> host
  Copy& h = b.copies[1];
  if (h.state != Copy::State::kAbsent) return false;  // loading or a stale copy draining
  void* ptr = nullptr;
  HostBlock hb;
  bool no_victim = false;
  if (!Reserve(Tier::kHost, b.alloc, false, UINT64_MAX, &ptr, &hb, &no_victim)) {
    if (no_victim) {
      // Host cannot take it after all: keep the copy where it is.
      c.state = Copy::State::kValid;
      leaving[fi] -= b.alloc;
      tele.evictions--;
      tele.writebacks--;
      b.evict_error[fi] = OutOfBudget(Tier::kHost, b.alloc, b);
      return true;
    }
    return false;
  }
  h.state = Copy::State::kLoading;
  h.version = b.version;
  h.ptr = ptr;
  h.host = hb;
  h.last_use = ++clock;
  Move m;
  m.kind = Move::Kind::kD2H;
  m.block = b.id;
  m.src = Tier::kDevice;
  m.dst = Tier::kHost;
  m.version = b.version;
  m.writeback = true;
  m.src_ptr = c.ptr;
  m.dst_ptr = ptr;
  m.bytes = b.alloc;
  c.readers++;
  Launch(std::move(m));
  return true;
}

bool TierManager::Impl::AdvanceLoad(Block& b, Tier t) {
  size_t ti = static_cast<size_t>(TierIndex(t));
  Copy& c = b.copies[ti];
  const int w = b.want[ti];
  if (w == 0) return true;
  if (IsValid(b, c)) {
    DropWant(b, t);
    NotifyTickets(b);
    return true;
  }
  if (c.state == Copy::State::kLoading) {
    DropWant(b, t);  // its completion notifies, or re-wants when it turns out stale
    return true;
  }
  if (c.state == Copy::State::kLeaving) {
    // A copy written down while the block was written elsewhere is stale: taking it back
    // would drop this want with nothing left to load the new bytes. Its write-back's
    // completion frees it, and this want is retried then.
    if (c.version != b.version) return false;
    c.state = Copy::State::kValid;  // rescue: stop treating it as gone
    leaving[ti] -= b.alloc;
    c.last_use = ++clock;
    DropWant(b, t);
    NotifyTickets(b);
    return true;
  }
  if (c.state == Copy::State::kValid) return false;  // stale, waiting for its readers

  // Nothing to load when every waiter overwrites the block (and someone waits here:
  // a host copy wanted on the way to the device must be loaded).
  bool overwrite_only = false;
  if (w == kDemand) {
    int overwriters = 0, others = 0;
    for (const auto& tk : b.tickets) {
      if (tk->tier != t || tk->state != detail::AcquireTicket::State::kPending) continue;
      (tk->access == Access::kOverwrite ? overwriters : others)++;
    }
    overwrite_only = overwriters > 0 && others == 0 && !(t == Tier::kHost && b.want_hold[0]);
  }
  // Where the bytes come from. A copy pinned for writing is no source: its bytes keep
  // changing until it is released.
  enum class Src { kNone, kDevice, kHost, kNvme } src = Src::kNone;
  const size_t other = 1 - ti;
  if (!overwrite_only && b.write_pins[other] > 0 && IsValid(b, b.copies[other])) {
    if (w == kPrefetch) {
      DropWant(b, t);
      return true;
    }
    return false;
  }
  if (!overwrite_only) {
    if (t == Tier::kDevice) {
      Copy& h = b.copies[1];
      if (h.state == Copy::State::kLeaving && h.version == b.version) {
        h.state = Copy::State::kValid;  // rescue it as the source
        leaving[1] -= b.alloc;
      }
      if (IsValid(b, h)) {
        src = Src::kHost;
      } else if (h.state == Copy::State::kLoading) {
        if (!b.want_hold[0]) {
          b.want_hold[0] = true;
          b.holds[1]++;
        }
        return false;
      } else if (NvmeValid(b)) {
        if (h.state != Copy::State::kAbsent) return false;  // stale host copy draining
        if (options.budgets.host < b.alloc) {
          FailTickets(b, t, InvalidArgumentError(
                                "moving " + tiering::BlockName(options, b.id) +
                                " from nvme to device needs host room for one block (" +
                                FormatBytes(b.alloc) + "); raise strata.host_budget"));
          DropWant(b, t);
          return true;
        }
        // A prefetch that could not land on the device is not worth reading from NVMe.
        if (w == kPrefetch && !b.want_hold[0] &&
            !CanMakeRoom(Tier::kDevice, b.alloc, policy->PrefetchPriority(b.id, clock + 1))) {
          tele.prefetches_skipped++;
          DropWant(b, t);
          return true;
        }
        if (!b.want_hold[0]) {
          b.want_hold[0] = true;
          b.holds[1]++;
        }
        Want(b, Tier::kHost, w == kPrefetch);
        return false;
      } else {
        return false;  // the valid copy is moving; wait for it
      }
    } else {
      if (IsValid(b, b.copies[0])) {
        src = Src::kDevice;
      } else if (NvmeValid(b)) {
        src = Src::kNvme;
      } else {
        return false;
      }
    }
  }

  const bool prefetch = w == kPrefetch;
  uint64_t prio = prefetch ? policy->PrefetchPriority(b.id, clock + 1) : UINT64_MAX;
  void* ptr = nullptr;
  HostBlock hb;
  bool no_victim = false;
  if (!Reserve(t, b.alloc, prefetch, prio, &ptr, &hb, &no_victim)) {
    if (!no_victim) return false;
    if (prefetch) {
      tele.prefetches_skipped++;
      DropWant(b, t);
      if (t == Tier::kHost && b.want_hold[0] && b.want[0] == kPrefetch) DropWant(b, Tier::kDevice);
      return true;
    }
    // Moves in flight on t end, and what they hold becomes evictable: wait for them.
    if (Unevictable(t) <= options.budgets[t] && TierBusy(t)) return false;
    Status s = OutOfBudget(t, b.alloc, b);
    FailTickets(b, t, s);
    if (t == Tier::kHost && b.want_hold[0]) FailTickets(b, Tier::kDevice, s);
    return true;
  }

  c.state = Copy::State::kLoading;
  c.version = b.version;
  c.ptr = ptr;
  c.host = hb;
  c.last_use = ++clock;
  if (overwrite_only) {
    c.state = Copy::State::kValid;
    DropWant(b, t);
    NotifyTickets(b);  // marks it dirty
    return true;
  }
  Move m;
  m.block = b.id;
  m.dst = t;
  m.version = b.version;
  m.prefetch = prefetch;
  m.dst_ptr = ptr;
  m.bytes = b.alloc;
  if (src == Src::kHost) {
    m.kind = Move::Kind::kH2D;
    m.src = Tier::kHost;
    m.src_ptr = b.copies[1].ptr;
    b.copies[1].readers++;
  } else if (src == Src::kDevice) {
    m.kind = Move::Kind::kD2H;
    m.src = Tier::kDevice;
    m.src_ptr = b.copies[0].ptr;
    b.copies[0].readers++;
  } else {
    int slot = NvmeValidSlot(b);
    m.src = Tier::kNvme;
    m.slot = slot;
    if (b.nvme.zero && slot == b.nvme.committed) {
      m.kind = Move::Kind::kZeroFill;
    } else {
      m.kind = Move::Kind::kNvmeRead;
      m.slots = b.nvme.slots[static_cast<size_t>(slot)];
    }
    b.nvme.readers[static_cast<size_t>(slot)]++;
  }
  DropWant(b, t);  // also releases the host hold: the H2D now reads it
  if (prefetch) {
    prefetch_outstanding++;
    tele.prefetches_issued++;
  }
  Launch(std::move(m));
  return true;
}

void TierManager::Impl::Pump() {
  if (shutting_down) return;
  for (int round = 0; round < 16; ++round) {
    std::deque<Pending> work;
    work.swap(pending);
    bool changed = false;
    std::vector<bool> done(work.size(), false);
    // Write-backs first (they make room), then demand loads, then prefetches.
    for (int phase = 0; phase < 3; ++phase) {
      for (size_t i = 0; i < work.size(); ++i) {
        if (done[i]) continue;
        const Pending& p = work[i];
        int ph;
        if (p.kind == Pending::Kind::kWriteback) {
          ph = 0;
        } else {
          const Block* b = Find(p.block);
          ph = (b != nullptr && b->want[static_cast<size_t>(TierIndex(p.tier))] == kDemand) ? 1 : 2;
        }
        if (ph != phase) continue;
        if (Advance(p)) {
          done[i] = true;
          changed = true;
        }
      }
    }
    std::deque<Pending> fresh;
    fresh.swap(pending);
    for (size_t i = 0; i < work.size(); ++i) {
      if (!done[i]) pending.push_back(work[i]);
    }
    for (const Pending& p : fresh) pending.push_back(p);
    if (!changed && fresh.empty()) break;
  }
  if (options.synchronous && !draining) {
    draining = true;
    while (!sync_queue.empty()) {
      Move m = std::move(sync_queue.front());
      sync_queue.pop_front();
      RunMove(m, true);  // its completion pumps (without draining) and may queue more
    }
    draining = false;
  }
  CheckNoStrandedTickets();
  cv.notify_all();
}

void TierManager::Impl::CheckNoStrandedTickets() const {
#ifndef NDEBUG
  for (const auto& [id, b] : blocks) {
    for (const auto& tk : b.tickets) {
      if (tk->state != detail::AcquireTicket::State::kPending) continue;
      size_t ti = static_cast<size_t>(TierIndex(tk->tier));
      const Copy& c = b.copies[ti];
      // A queued want is advanced by a later Pump; a load or any other move of the block
      // ends in OnMoveDone, which notifies.
      if (b.want[ti] != 0 || c.state == Copy::State::kLoading || b.moves > 0) continue;
      std::string who = tk->label.empty() ? "" : "'" + tk->label + "' ";
      CheckFailed(__FILE__, __LINE__, "a pending acquisition will be woken",
                  "pending acquisition " + who + "of " + tiering::BlockName(options, id) + " on " +
                      std::string(TierName(tk->tier)) + " has no want, load or move left to make it ready (copy state " +
                      std::to_string(static_cast<int>(c.state)) + ", copy version " + std::to_string(c.version) +
                      ", block version " + std::to_string(b.version) + ")");
    }
  }
#endif
}

void TierManager::Impl::TracePrefetch() {
  if (!policy->following()) return;
  int outstanding = prefetch_outstanding;
  for (const Pending& p : pending) {
    const Block* b = Find(p.block);
    if (p.kind == Pending::Kind::kLoad && b != nullptr &&
        b->want[static_cast<size_t>(TierIndex(p.tier))] == kPrefetch)
      outstanding++;
  }
  const int limit = std::max(1, options.max_prefetch_moves);
  if (outstanding >= limit) return;
  for (const PrefetchRequest& r : policy->Lookahead(4096)) {
    if (outstanding >= limit) break;
    Block* b = Find(r.block);
    if (b == nullptr || r.tier == Tier::kNvme) continue;
    size_t ti = static_cast<size_t>(TierIndex(r.tier));
    if (b->copies[ti].state != Copy::State::kAbsent || b->want[ti] != 0) continue;
    if (TierIndex(r.tier) > TierIndex(b->home)) continue;
    uint64_t skipped = tele.prefetches_skipped;
    Want(*b, r.tier, true);
    outstanding++;
    Pump();
    if (tele.prefetches_skipped != skipped) break;  // the budgets allow no further
  }
}

}  // namespace strata
