#include "zero/write_behind.h"

namespace strata::zero {

Status WriteBehind::Wait(const Write& w) {
  Status st = w.handle.Wait().WithContext(w.what);
  if (!st.ok() && w.chunk >= 0 && on_failure_) on_failure_(w);
  return st;
}

Result<void*> WriteBehind::ReuseOldest() {
  STRATA_RETURN_IF_ERROR(Wait(writes_.front()));
  void* buf = writes_.front().buf;
  writes_.pop_front();
  return buf;
}

Result<void*> WriteBehind::TakeFreeOrOldest() {
  if (void* p = pool_->TryTake()) return p;
  if (writes_.empty()) return static_cast<void*>(nullptr);
  return ReuseOldest();
}

Status WriteBehind::WaitSlot(SlotId slot) {
  for (const Write& w : writes_) {
    if (w.slot == slot) STRATA_RETURN_IF_ERROR(Wait(w));
  }
  return OkStatus();
}

Status WriteBehind::SettleBefore(int64_t epoch) {
  while (!writes_.empty() && writes_.front().epoch < epoch) {
    STRATA_RETURN_IF_ERROR(Wait(writes_.front()));
    pool_->Give(writes_.front().buf);
    writes_.pop_front();
  }
  return OkStatus();
}

void WriteBehind::Reclaim() {
  while (!writes_.empty() && writes_.front().handle.Poll()) {
    // A failed one is kept for whoever reports it (Wait there undoes its step).
    if (!writes_.front().handle.Wait().ok()) return;
    pool_->Give(writes_.front().buf);
    writes_.pop_front();
  }
}

Status WriteBehind::Drain(bool report, const std::function<void(void*)>& lost) {
  Status first;
  while (!writes_.empty()) {
    Status st = Wait(writes_.front());
    if (first.ok() && !st.ok() && report) first = st;
    if (!st.ok() && lost) lost(writes_.front().buf);
    pool_->Give(writes_.front().buf);
    writes_.pop_front();
  }
  return first;
}

}  // namespace strata::zero
