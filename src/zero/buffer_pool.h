// A pool of equal buffers that threads take and give back: pinned staging sets, gradient
// buffers. It owns none of them (the engine allocated them); it only says which are free.
//
// Threads: any; Take blocks until a buffer is free.
#pragma once

#include <condition_variable>
#include <mutex>
#include <vector>

namespace strata::zero {

class BufferPool {
 public:
  // Adds a buffer, free (set-up, before any Take).
  void Add(void* p) { free_.push_back(p); }
  // A free buffer; waits for a Give when none is.
  void* Take();
  void* TryTake();  // nullptr when none is free
  void Give(void* p);
  // Free buffers now (a snapshot: other threads may take or give at once).
  size_t FreeCount();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<void*> free_;
};

}  // namespace strata::zero
