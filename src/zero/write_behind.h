// Writes to NVMe slots that no one waits for when they are issued, each with the pinned
// buffer it reads from. A buffer goes back to its pool only once its write is on disk.
// A write that fails is kept until someone reports it; for a write of a chunk's
// optimizer state, on_failure is told first, since the step it belongs to is lost.
//
// Threads: one at a time (the thread that steps: the optimizer worker during backward,
// the training thread in Step()). Writes are queued in the order they were issued.
#pragma once

#include <deque>
#include <functional>
#include <vector>

#include "strata/io.h"
#include "strata/nvme_store.h"
#include "strata/status.h"
#include "zero/buffer_pool.h"

namespace strata::zero {

class WriteBehind {
 public:
  struct Write {
    IoHandle handle;
    void* buf = nullptr;
    SlotId slot = 0;
    int chunk = -1;      // whose optimizer state it writes; -1: nothing to undo if it fails
    int64_t epoch = -1;  // the step (Step() call) it belongs to
    const char* what = "";
  };
  // pool: where the buffers go back. on_failure: called for a failed write of a chunk's
  // state before its error is returned.
  explicit WriteBehind(BufferPool* pool, std::function<void(const Write&)> on_failure = {})
      : pool_(pool), on_failure_(std::move(on_failure)) {}

  void Push(Write w) { writes_.push_back(std::move(w)); }
  bool empty() const { return writes_.empty(); }
  const std::deque<Write>& writes() const { return writes_; }

  // Waits for `w`; its error, with its context.
  Status Wait(const Write& w);
  // The oldest write's buffer once it is on disk, off the queue; its error if it failed
  // (it stays queued for Drain, which returns the buffer).
  Result<void*> ReuseOldest();
  // A free buffer of the pool, else ReuseOldest's; nullptr when the pool has none free and
  // nothing is being written (every buffer is held elsewhere). Never waits for a Give.
  Result<void*> TakeFreeOrOldest();
  // Waits for the writes still in flight to `slot` (a read or a new write of it must not
  // overtake them); the first error.
  Status WaitSlot(SlotId slot);
  // Waits for the writes of steps before `epoch`, and returns their buffers; the first
  // error (that write stays queued).
  Status SettleBefore(int64_t epoch);
  // Returns the buffers of completed writes, oldest first, up to the first one still in
  // flight or failed. Never blocks.
  void Reclaim();
  // Waits for every write and returns the buffers; the first error when `report`.
  // lost(buf) runs before a failed write's buffer goes back: what it held never reached
  // the disk.
  Status Drain(bool report, const std::function<void(void*)>& lost = {});

 private:
  BufferPool* pool_;
  std::function<void(const Write&)> on_failure_;
  std::deque<Write> writes_;
};

}  // namespace strata::zero
