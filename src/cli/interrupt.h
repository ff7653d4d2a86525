// SIGINT and SIGTERM during `strata train`: an orderly stop that says what it did,
// leaves no swap files behind (unless asked to keep them) and exits with the shell's
// conventional status, 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).
//
// The signals are blocked in every thread and taken by a watcher thread (sigtimedwait),
// so no code runs in a signal handler. On the first signal the watcher removes this
// process's swap and lock files at once (the open stores keep their descriptors, and a
// launcher such as mpirun may follow SIGTERM with SIGKILL within moments), tells the
// training thread to stop (Check() turns into Aborted at the next module hook) and
// gives it `grace_s` to unwind. A run that cannot unwind in time (blocked in a
// collective or a long optimizer step) or a second signal ends at once. With
// keep_swap it ends at once and keeps the files, naming them.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "strata/status.h"
#include "strata/swap_files.h"

namespace strata::cli {

class InterruptGuard {
 public:
  struct Options {
    bool keep_swap = false;
    double grace_s = 1.0;
  };
  // Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it starts
  // later: call before MPI, oneTBB or the I/O engine start theirs. Main thread.
  explicit InterruptGuard(Options options);
  ~InterruptGuard();  // stops the watcher; the signals stay blocked
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;

  // Where this rank's swap files live and how to name it in messages; until set, an
  // interrupt has no files to clean. Any thread.
  void SetSwap(std::vector<std::string> dirs, int rank, int world_size);
  // The pids of this job's ranks on this node (-1 for the ranks elsewhere), so that a
  // stop can name a peer that vanished. Any thread.
  void SetPeers(std::vector<int> pids);
  // "rank 1 (pid 5880) has died (killed or crashed)" for each peer on this node whose
  // process is gone or a zombie; empty when none is. Any thread.
  std::string LostPeers() const;
  // The training thread's poll: Aborted naming the signal once one has come.
  Status Check() const;
  // 0 until a signal came, then its number.
  int signal() const { return signal_.load(std::memory_order_acquire); }
  // The training thread has unwound after Check() failed (the engine is gone): the
  // watcher stands down. Returns the message to print and the exit status to use.
  std::string FinishUnwind(int* exit_code);

 private:
  void Watch();
  void OnSignal(int sig);
  [[noreturn]] void EndNow(int sig, const char* why);
  // This process's swap files in the swap directories, removed first when `remove`.
  std::vector<SwapFileInfo> TakeOwnFiles(bool remove);
  // "removed its swap files (...)" for what TakeOwnFiles removed so far.
  std::string Removed() const;
  std::string Prefix() const;

  Options options_;
  std::atomic<int> signal_{0};
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable unwound_cv_;
  bool unwound_ = false;
  std::vector<std::string> dirs_;
  int rank_ = 0, world_size_ = 1;
  std::vector<int> peer_pids_;
  std::vector<SwapFileInfo> removed_;  // this process's files, removed as the signal came
  std::thread watcher_;
};

}  // namespace strata::cli
