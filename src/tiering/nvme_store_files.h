// Internal to NvmeStore: swap directory ownership (lock files with flock and the owner's
// pid), stale-file cleanup after a crash, and preallocation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::detail {

// Ownership of `<dir>/<name>.lock` in every directory; swap files are
// `<dir>/<name>.swap`.
class SwapDirs {
 public:
  SwapDirs() = default;
  ~SwapDirs();  // Release(), keeping nothing
  SwapDirs(const SwapDirs&) = delete;
  SwapDirs& operator=(const SwapDirs&) = delete;

  // Creates missing directories, takes every lock (FailedPrecondition naming the owner
  // pid when a live process holds one) and removes stale swap files of a crashed run.
  Status Acquire(const std::vector<std::string>& dirs, const std::string& name);
  // Removes the swap files and lock files and drops the locks. Idempotent.
  Status Release();

  const std::vector<std::string>& swap_files() const { return swap_files_; }

 private:
  std::vector<std::string> swap_files_;
  std::vector<std::string> lock_files_;
  std::vector<int> lock_fds_;
};

// Reserves `size` bytes for an open file with fallocate. A file system without room is
// ResourceExhausted naming the path, the size needed and the space free.
Status PreallocateSwap(int fd, const std::string& path, uint64_t size);

}  // namespace strata::detail
