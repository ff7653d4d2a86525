#include "zero/save_gate.h"

#include <chrono>

namespace strata::zero {

void SaveGate::Hold(const std::vector<uint64_t>& keys) {
  std::lock_guard lock(mu_);
  held_.insert(keys.begin(), keys.end());
}

void SaveGate::Release(uint64_t key) {
  {
    std::lock_guard lock(mu_);
    if (held_.erase(key) == 0) return;
  }
  cv_.notify_all();
}

void SaveGate::ReleaseAll() {
  {
    std::lock_guard lock(mu_);
    held_.clear();
  }
  cv_.notify_all();
}

void SaveGate::WaitFree(uint64_t key) {
  std::unique_lock lock(mu_);
  if (!held_.count(key)) return;
  const auto start = std::chrono::steady_clock::now();
  cv_.wait(lock, [&] { return !held_.count(key); });
  waited_ns_ +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
}

int64_t SaveGate::TakeWaited() {
  std::lock_guard lock(mu_);
  const int64_t w = waited_ns_;
  waited_ns_ = 0;
  return w;
}

}  // namespace strata::zero
