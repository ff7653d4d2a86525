// The blocks of optimizer state an asynchronous checkpoint save has not read yet, and a
// wait for the optimizer before it overwrites one of them.
//
// A save captures the state of one step: each chunk's master | m | v in memory, or each
// piece's committed NVMe slot. Training goes on while the save reads them, and the
// optimizer overwrites such a block only in a later step (the next step's speculation
// writes spare buffers and the other NVMe slot) or, stepping in place, in the next one;
// before any such write it waits here until the save has read the block. A block is
// named by a key: its memory address, or its NVMe slot (SlotKey).
//
// Threads: Hold on the training thread; Release from the saver; WaitFree from any.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

namespace strata::zero {

class SaveGate {
 public:
  static uint64_t MemoryKey(const void* p) { return reinterpret_cast<uintptr_t>(p); }
  // Slot keys have the top bit set, which no user-space address has.
  static uint64_t SlotKey(uint32_t slot) { return (1ull << 63) | slot; }

  // Starts holding `keys` (replacing nothing: call once the previous save released all).
  void Hold(const std::vector<uint64_t>& keys);
  // The save has read the block (or gave up on it).
  void Release(uint64_t key);
  void ReleaseAll();
  // Returns at once when `key` is not held, else once it is released; the nanoseconds it
  // waited are added to waited_ns().
  void WaitFree(uint64_t key);
  // Nanoseconds writers waited since the last TakeWaited(); resets the count.
  int64_t TakeWaited();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_set<uint64_t> held_;
  int64_t waited_ns_ = 0;
};

}  // namespace strata::zero
