// Acquire, release, dirty, prefetch, evict and wait: the calls an engine makes per chunk.
#include <chrono>

#include "strata/log.h"
#include "strata/units.h"
#include "tiering/tier_internal.h"

namespace strata {

using detail::AcquireTicket;
using tiering::Block;
using tiering::Copy;
using tiering::TierIndex;

namespace {
bool Writes(Access a) { return a != Access::kRead; }
}  // namespace

// ---------------------------------------------------------------------------------------
// BlockHandle

BlockHandle::~BlockHandle() { Release(); }

BlockHandle::BlockHandle(BlockHandle&& other) noexcept : ticket_(std::move(other.ticket_)) {}

BlockHandle& BlockHandle::operator=(BlockHandle&& other) noexcept {
  if (this != &other) {
    Release();
    ticket_ = std::move(other.ticket_);
  }
  return *this;
}

BlockId BlockHandle::block() const { return ticket_ ? ticket_->block : BlockId{}; }
Tier BlockHandle::tier() const { return ticket_ ? ticket_->tier : Tier::kHost; }
Access BlockHandle::access() const { return ticket_ ? ticket_->access : Access::kRead; }
uint64_t BlockHandle::bytes() const { return ticket_ ? ticket_->bytes : 0; }

bool BlockHandle::Ready() const {
  if (!ticket_) return false;
  std::lock_guard<std::mutex> lock(ticket_->impl->mu);
  return ticket_->state != AcquireTicket::State::kPending;
}

Status BlockHandle::Wait() {
  if (!ticket_) return FailedPreconditionError("BlockHandle::Wait on an empty or released handle");
  TierManager::Impl& m = *ticket_->impl;
  std::unique_lock<std::mutex> lock(m.mu);
  if (ticket_->state == AcquireTicket::State::kPending) {
    auto begin = std::chrono::steady_clock::now();
    m.cv.wait(lock, [&] { return ticket_->state != AcquireTicket::State::kPending; });
    m.tele.stalls++;
    m.tele.stall_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  }
  switch (ticket_->state) {
    case AcquireTicket::State::kReady: return OkStatus();
    case AcquireTicket::State::kFailed: return ticket_->status;
    default: return FailedPreconditionError("BlockHandle::Wait on a released handle");
  }
}

void* BlockHandle::data() const {
  if (!ticket_) return nullptr;
  std::lock_guard<std::mutex> lock(ticket_->impl->mu);
  return ticket_->state == AcquireTicket::State::kReady ? ticket_->data : nullptr;
}

Status BlockHandle::MarkDirty() {
  if (!ticket_) return FailedPreconditionError("MarkDirty on an empty handle");
  return ticket_->impl->MarkDirtyTicket(ticket_);
}

void BlockHandle::Release() {
  if (!ticket_) return;
  ticket_->impl->ReleaseTicket(ticket_);
  ticket_.reset();
}

// ---------------------------------------------------------------------------------------
// Tickets (lock held)

namespace {
void Unpin(Block& b, AcquireTicket& tk) {
  size_t ti = static_cast<size_t>(TierIndex(tk.tier));
  b.pins[ti]--;
  if (Writes(tk.access)) b.write_pins[ti]--;
}
void Forget(Block& b, const AcquireTicket* tk) {
  for (size_t i = 0; i < b.tickets.size(); ++i) {
    if (b.tickets[i].get() == tk) {
      b.tickets.erase(b.tickets.begin() + static_cast<std::ptrdiff_t>(i));
      return;
    }
  }
}
}  // namespace

void TierManager::Impl::NotifyTickets(Block& b) {
  for (const auto& tk : b.tickets) {
    if (tk->state != AcquireTicket::State::kPending) continue;
    Copy& c = b.copies[static_cast<size_t>(TierIndex(tk->tier))];
    if (c.state != Copy::State::kValid || c.version != b.version) continue;
    if (Writes(tk->access) && c.readers != 0) continue;  // a move still reads the old bytes
    tk->state = AcquireTicket::State::kReady;
    tk->data = c.ptr;
    c.last_use = ++clock;
    if (Writes(tk->access)) MarkDirtyLocked(b, tk->tier);
  }
  cv.notify_all();
}

void TierManager::Impl::FailTickets(Block& b, Tier t, const Status& status) {
  std::vector<std::shared_ptr<AcquireTicket>> keep;
  for (const auto& tk : b.tickets) {
    if (tk->tier == t && tk->state == AcquireTicket::State::kPending) {
      tk->state = AcquireTicket::State::kFailed;
      tk->status = status;
      Unpin(b, *tk);
    } else {
      keep.push_back(tk);
    }
  }
  b.tickets = std::move(keep);
  if (b.pins[static_cast<size_t>(TierIndex(t))] == 0) DropWant(b, t);
  cv.notify_all();
}

void TierManager::Impl::MarkDirtyLocked(Block& b, Tier t) {
  b.version++;
  b.copies[static_cast<size_t>(TierIndex(t))].version = b.version;
  for (int u = 0; u < 2; ++u) {
    if (u == TierIndex(t)) continue;
    Copy& o = b.copies[static_cast<size_t>(u)];
    if (o.state == Copy::State::kValid && o.readers == 0) FreeCopy(b, tiering::TierAt(u));
    // Copies being read or loaded are stale now; their moves' completions free them.
  }
}

void TierManager::Impl::ReleaseTicket(const std::shared_ptr<AcquireTicket>& tk) {
  std::lock_guard<std::mutex> lock(mu);
  Block* b = Find(tk->block);
  if (b != nullptr && (tk->state == AcquireTicket::State::kPending || tk->state == AcquireTicket::State::kReady)) {
    size_t ti = static_cast<size_t>(TierIndex(tk->tier));
    if (tk->state == AcquireTicket::State::kReady) {
      b->copies[ti].last_use = ++clock;
      // The writer's bytes are final only now: whatever was copied from them before is stale.
      if (Writes(tk->access)) MarkDirtyLocked(*b, tk->tier);
    }
    Unpin(*b, *tk);
    Forget(*b, tk.get());
    // A load nobody waits for any more goes on as a prefetch.
    if (b->pins[ti] == 0 && b->want[ti] == 2) b->want[ti] = 1;
  }
  tk->state = AcquireTicket::State::kReleased;
  tk->data = nullptr;
  Pump();
}

Status TierManager::Impl::MarkDirtyTicket(const std::shared_ptr<AcquireTicket>& tk) {
  std::unique_lock<std::mutex> lock(mu);
  if (tk->state != AcquireTicket::State::kReady)
    return FailedPreconditionError("MarkDirty of " + tiering::BlockName(options, tk->block) +
                                   ": the handle is not ready (call Wait() first)");
  Block* b = Find(tk->block);
  STRATA_CHECK(b != nullptr);
  size_t ti = static_cast<size_t>(TierIndex(tk->tier));
  size_t ui = 1 - ti;
  if (b->pins[ui] > 0)
    return FailedPreconditionError("MarkDirty of " + tiering::BlockName(options, tk->block) + " on " +
                                   std::string(TierName(tk->tier)) + ": its " +
                                   std::string(TierName(tiering::TierAt(static_cast<int>(ui)))) +
                                   " copy is pinned too (" + DescribePinnedLocked(tiering::TierAt(static_cast<int>(ui))) +
                                   ")");
  cv.wait(lock, [&] { return b->copies[ti].readers == 0; });
  if (!Writes(tk->access)) {
    tk->access = Access::kReadWrite;
    b->write_pins[ti]++;
  }
  MarkDirtyLocked(*b, tk->tier);
  return OkStatus();
}

// ---------------------------------------------------------------------------------------
// TierManager calls

Result<BlockHandle> TierManager::Impl::AcquireImpl(BlockId id, Tier tier, Access access, std::string_view label,
                                                   bool record) {
  std::lock_guard<std::mutex> lock(mu);
  Block* b = Find(id);
  std::string name = tiering::BlockName(options, id);
  if (b == nullptr) return InvalidArgumentError("acquire " + name + ": not registered");
  if (tier == Tier::kNvme)
    return InvalidArgumentError("acquire " + name + " on nvme: NVMe blocks are acquired on host or device");
  if (TierIndex(tier) > TierIndex(b->home))
    return InvalidArgumentError("acquire " + name + " on " + std::string(TierName(tier)) + ": below its home tier " +
                                std::string(TierName(b->home)));
  if (options.budgets[tier] == 0)
    return InvalidArgumentError("acquire " + name + ": the " + std::string(TierName(tier)) + " tier has no budget");
  if (!b->pending_error.ok()) {
    Status s = b->pending_error;
    b->pending_error = OkStatus();
    return s.WithContext("an earlier prefetch of " + name + " failed");
  }
  size_t ti = static_cast<size_t>(TierIndex(tier));
  size_t ui = 1 - ti;
  if ((Writes(access) && b->pins[ui] > 0) || b->write_pins[ui] > 0)
    return FailedPreconditionError("acquire " + name + " on " + std::string(TierName(tier)) +
                                   ": its copy on the other tier is pinned (" +
                                   DescribePinnedLocked(tiering::TierAt(static_cast<int>(ui))) +
                                   ") and one of the two writes; release it first");
  if (record) {
    if (policy->OnAcquire(id, tier)) tele.trace_divergences++;
    tele.acquires++;
  }
  const Copy& c = b->copies[ti];
  bool present = c.state != Copy::State::kAbsent && c.version == b->version;
  if (!present && Unevictable(tier) + b->alloc > options.budgets[tier]) return OutOfBudget(tier, b->alloc, *b);
  if (present && record) tele.acquire_hits++;
  b->pins[ti]++;
  if (Writes(access)) b->write_pins[ti]++;
  auto tk = std::make_shared<AcquireTicket>();
  tk->impl = this;
  tk->block = id;
  tk->tier = tier;
  tk->access = access;
  tk->label = std::string(label);
  tk->bytes = b->bytes;
  b->tickets.push_back(tk);
  NotifyTickets(*b);
  if (tk->state == AcquireTicket::State::kPending) Want(*b, tier, false);
  Pump();
  if (record) TracePrefetch();
  return BlockHandle(std::move(tk));
}

Result<BlockHandle> TierManager::Acquire(BlockId block, Tier tier, Access access, std::string_view label) {
  return impl_->AcquireImpl(block, tier, access, label, true);
}

void TierManager::Release(BlockHandle& handle) { handle.Release(); }

Status TierManager::MarkDirty(BlockHandle& handle) { return handle.MarkDirty(); }

Status TierManager::Prefetch(std::span<const PrefetchRequest> requests) {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  for (const PrefetchRequest& r : requests) {
    const Block* b = m.Find(r.block);
    if (b == nullptr)
      return InvalidArgumentError("prefetch " + tiering::BlockName(m.options, r.block) + ": not registered");
    if (r.tier == Tier::kNvme || TierIndex(r.tier) > TierIndex(b->home) || m.options.budgets[r.tier] == 0)
      return InvalidArgumentError("prefetch " + tiering::BlockName(m.options, r.block) + " to " +
                                  std::string(TierName(r.tier)) + ": not a tier it can be acquired on");
  }
  for (const PrefetchRequest& r : requests) {
    Block& b = *m.Find(r.block);
    size_t ti = static_cast<size_t>(TierIndex(r.tier));
    if ((b.copies[ti].state != Copy::State::kAbsent && b.copies[ti].version == b.version) || b.want[ti] != 0)
      continue;
    uint64_t skipped = m.tele.prefetches_skipped;
    m.Want(b, r.tier, true);
    m.Pump();
    if (m.tele.prefetches_skipped != skipped) break;
  }
  return OkStatus();
}

Status TierManager::Evict(BlockId block, Tier from) {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  std::string name = tiering::BlockName(m.options, block);
  if (from == Tier::kNvme) return InvalidArgumentError("evict " + name + " from nvme: NVMe is the bottom tier");
  size_t ti = static_cast<size_t>(TierIndex(from));
  for (;;) {
    Block* b = m.Find(block);
    if (b == nullptr) return NotFoundError("evict " + name + ": not registered");
    if (b->pins[ti] > 0)
      return FailedPreconditionError("evict " + name + " from " + std::string(TierName(from)) + ": pinned (" +
                                     m.DescribePinnedLocked(from) + ")");
    Copy& c = b->copies[ti];
    if (c.state == Copy::State::kAbsent) return OkStatus();
    if (from == b->home)
      return FailedPreconditionError("evict " + name + " from " + std::string(TierName(from)) + ": its home tier");
    bool settled = c.state == Copy::State::kValid && c.readers == 0 && b->holds[ti] == 0 && c.version == b->version;
    if (!settled) {
      m.cv.wait(lock);
      continue;
    }
    if (m.HasOtherValid(*b, from)) {
      m.FreeCopy(*b, from);
      m.tele.evictions++;
      m.tele.clean_drops++;
      m.Pump();
      return OkStatus();
    }
    if (from == Tier::kDevice &&
        (m.options.budgets.host < b->alloc || m.Unevictable(Tier::kHost) + b->alloc > m.options.budgets.host))
      return m.OutOfBudget(Tier::kHost, b->alloc, *b).WithContext("evicting " + name + " from device");
    b->evict_error[ti] = OkStatus();
    m.StartWriteback(*b, from);
    m.Pump();
    m.cv.wait(lock, [&] {
      Block* x = m.Find(block);
      return x == nullptr || x->copies[ti].state != Copy::State::kLeaving;
    });
    // The copy may be back already (an acquisition raced with this call and loaded or
    // took it back): that is not a failure of the eviction, which only the write-back's
    // own outcome tells.
    b = m.Find(block);
    if (b == nullptr || b->evict_error[ti].ok()) return OkStatus();
    return b->evict_error[ti].WithContext("evict " + name + " from " + std::string(TierName(from)));
  }
}

Status TierManager::WaitAll() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  for (;;) {
    m.cv.wait(lock, [&] { return m.in_flight == 0; });
    m.Pump();
    if (m.in_flight == 0) break;
  }
  Status s = m.async_error;
  m.async_error = OkStatus();
  return s;
}

void TierManager::BeginStep() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  m.policy->BeginStep();
  m.TracePrefetch();
}

void TierManager::Impl::WaitBlockIdle(std::unique_lock<std::mutex>& lock, BlockId id) {
  cv.wait(lock, [&] {
    const Block* b = Find(id);
    if (b == nullptr) return true;
    bool leaving_copy = b->copies[0].state == Copy::State::kLeaving || b->copies[1].state == Copy::State::kLeaving;
    return b->moves == 0 && !leaving_copy && b->want[0] == 0 && b->want[1] == 0;
  });
}

}  // namespace strata
