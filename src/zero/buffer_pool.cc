#include "zero/buffer_pool.h"

namespace strata::zero {

void* BufferPool::Take() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty(); });
  void* p = free_.back();
  free_.pop_back();
  return p;
}

void* BufferPool::TryTake() {
  std::lock_guard lock(mu_);
  if (free_.empty()) return nullptr;
  void* p = free_.back();
  free_.pop_back();
  return p;
}

void BufferPool::Give(void* p) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(p);
  }
  cv_.notify_one();
}

size_t BufferPool::FreeCount() {
  std::lock_guard lock(mu_);
  return free_.size();
}

}  // namespace strata::zero
