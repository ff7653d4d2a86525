// The swap files that NvmeStore leaves in a swap directory, seen from outside a store:
// for a start-up sweep of files that crashed runs left behind, and for an interrupted
// run that must say which of its files it removed (or kept).
//
// A store named `<stem>-r<rank>` owns `<dir>/<stem>-r<rank>.swap` and `.lock`; the lock
// file holds the owner's pid under flock(LOCK_EX) while the store is open (nvme_store.h).
// A file whose lock no process holds is stale: its run ended without closing it.
//
// Threads: every function is thread-safe and async-signal-unsafe (they allocate); call
// them from ordinary threads, e.g. a signal-watching thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata {

struct SwapFileInfo {
  std::string swap_path;  // <dir>/<stem>-r<rank>.swap ("" when only the lock is left)
  std::string lock_path;  // <dir>/<stem>-r<rank>.lock ("" when there is none)
  std::string stem;       // "strata-optim"
  int rank = -1;
  uint64_t bytes = 0;  // the swap file's allocated size on disk
  int owner_pid = 0;   // the pid written in the lock file; 0: none readable
};

// The strata swap files in `dir` (names strata-*-r<N>.swap/.lock), sorted by path. A
// missing directory has none.
std::vector<SwapFileInfo> ListSwapFiles(const std::string& dir);

// Removes the files of `dir` whose rank is >= `first_rank` and whose lock no process
// holds (taking the lock first, so a store that opens meanwhile is never cut away).
// Returns what was removed; `in_use` (optional) receives those that a live process
// holds. IoError naming the path when a stale file cannot be removed.
Result<std::vector<SwapFileInfo>> RemoveStaleSwapFiles(const std::string& dir, int first_rank,
                                                       std::vector<SwapFileInfo>* in_use = nullptr);

// The files of `dir` that this process's open stores own (their lock names getpid()).
std::vector<SwapFileInfo> OwnSwapFiles(const std::string& dir);

// "440 MiB in 2 files: /d/strata-optim-r1.swap, /d/strata-param-r1.swap".
std::string DescribeSwapFiles(const std::vector<SwapFileInfo>& files);

}  // namespace strata
