// MpiCommunicator's record of one issued collective: what it is, how it runs, and its
// completion, which the caller's handle waits on. Included by mpi_communicator.cc only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "comm/mpi_communicator.h"
#include "comm/mpi_util.h"
#include "comm/op_text.h"

namespace strata::comm {

class MpiCommunicator::Op final : public comm_internal::PendingOp {
 public:
  Op(MpiCommunicator* owner, OpDesc desc, std::string label, std::function<Status(MpiContext&)> fn)
      : desc(desc), label(std::move(label)), fn(std::move(fn)), owner_(owner) {}
  Status Wait() override {
    // A finished op never touches its communicator, which may be gone by now (its
    // destructor drains the queue, so every op of a destroyed communicator is done).
    if (!done_.load(std::memory_order_acquire) && !owner_->RunInline(this, /*waiting=*/true)) {
      // Another thread runs it. Poll before sleeping: waking a sleeping caller preempts
      // that runner (2 cores, 2 ranks) before it gives up the runner role, so the
      // caller's next collective queues behind it and the caller sleeps again (in one
      // `strata bench comm` run, 445 1 MiB collectives in a row went that way).
      const double until = NowS() + kSpinS;
      while (!done_.load(std::memory_order_acquire) && NowS() < until) std::this_thread::yield();
    }
    // status_ is written once, before done_ is set, so a thread that saw done_ reads it
    // without the mutex (after an inline run, the caller's usual case).
    if (done_.load(std::memory_order_acquire)) return status_;
    std::unique_lock<std::mutex> lock(mu_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    cv_.wait(lock, [&] { return done_.load(std::memory_order_acquire); });
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return status_;
  }
  Result<bool> Test() override {
    if (!done_.load(std::memory_order_acquire)) {
      // A caller that polls needs the worker: it may have been left asleep.
      owner_->RunInline(this, /*waiting=*/false);
      return false;
    }
    if (!status_.ok()) return status_;
    return true;
  }
  bool done() const { return done_.load(std::memory_order_acquire); }
  // Makes a finished op that nothing refers to any more a new one (under the
  // communicator's mu_).
  void Reuse(const OpDesc& d, std::string l, std::function<Status(MpiContext&)> f) {
    desc = d;
    label = std::move(l);
    fn = std::move(f);
    looked_at = false;
    status_ = OkStatus();
    done_.store(false, std::memory_order_relaxed);
  }
  void Complete(Status s) {
    status_ = std::move(s);
    // Locking and notifying only for a sleeper saves two atomic operations on a line
    // the 1 MiB copy has evicted, after every collective the caller ran itself. Both
    // sides are seq_cst: either the sleeper's count is seen here, or done_ is seen by
    // the sleeper under the mutex before it blocks.
    done_.store(true, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }
  uint64_t seq = 0;        // set under the communicator's mu_ at Submit
  double submitted_s = 0;  // steady-clock seconds, set with seq
  // The label names an op without a typed description (Barrier, Split, RunInOrder).
  std::string_view Text(OpTextBuffer& buf) const { return label.empty() ? FormatOp(desc, buf) : label; }
  std::string What() const {
    OpTextBuffer buf;
    return std::string(Text(buf));
  }
  OpDesc desc;
  std::string label;
  std::function<Status(MpiContext&)> fn;
  mutable bool looked_at = false;  // guarded by the communicator's mu_

 private:
  MpiCommunicator* const owner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> done_{false};
  std::atomic<int> sleepers_{0};  // threads blocked (or about to block) on cv_
  Status status_;
};

}  // namespace strata::comm
