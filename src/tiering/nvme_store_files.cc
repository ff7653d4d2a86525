#include "tiering/nvme_store_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "strata/log.h"
#include "strata/units.h"

namespace strata::detail {
namespace {

std::string ReadOwnerPid(int fd) {
  char buf[32] = {};
  ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "unknown";
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.empty() ? "unknown" : s;
}

}  // namespace

SwapDirs::~SwapDirs() {
  Status s = Release();
  if (!s.ok()) {
    STRATA_LOG(kWarn, "nvme") << s.ToString();
  }
}

Status SwapDirs::Acquire(const std::vector<std::string>& dirs, const std::string& name) {
  for (const std::string& dir : dirs) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return IoError("creating swap directory " + dir + ": " + ec.message());
    const std::string lock = dir + "/" + name + ".lock";
    const std::string swap = dir + "/" + name + ".swap";
    int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      int err = errno;
      Status s = ErrnoError(err, "opening swap lock file " + lock);
      Release().IgnoreError();  // undo the locks taken so far; s is the error to report
      return s;
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int err = errno;
      std::string owner = ReadOwnerPid(fd);
      ::close(fd);
      Release().IgnoreError();  // undo the locks taken so far
      if (err == EWOULDBLOCK) {
        return FailedPreconditionError("swap files " + swap + " are in use by a live process (pid " + owner +
                                       "); stop it, or give this run another swap path or name");
      }
      return ErrnoError(err, "locking " + lock);
    }
    // Locked: whatever swap file is here was left by a run that died without cleaning up.
    if (std::filesystem::exists(swap, ec)) {
      STRATA_LOG(kWarn, "nvme") << "removing stale swap file " << swap << " left by a crashed run (pid "
                                << ReadOwnerPid(fd) << ")";
      if (::unlink(swap.c_str()) != 0) {
        int err = errno;
        ::close(fd);
        Release().IgnoreError();
        return ErrnoError(err, "removing stale swap file " + swap);
      }
    }
    std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
      int err = errno;
      ::close(fd);
      Release().IgnoreError();
      return ErrnoError(err, "writing pid to " + lock);
    }
    lock_fds_.push_back(fd);
    lock_files_.push_back(lock);
    swap_files_.push_back(swap);
  }
  return OkStatus();
}

Status SwapDirs::Release() {
  Status first;
  for (size_t i = 0; i < lock_fds_.size(); ++i) {
    if (::unlink(swap_files_[i].c_str()) != 0 && errno != ENOENT && first.ok()) {
      first = ErrnoError(errno, "removing swap file " + swap_files_[i]);
    }
    // Unlink the lock while still holding it, so no one locks a file we then delete.
    if (::unlink(lock_files_[i].c_str()) != 0 && errno != ENOENT && first.ok()) {
      first = ErrnoError(errno, "removing lock file " + lock_files_[i]);
    }
    ::close(lock_fds_[i]);
  }
  lock_fds_.clear();
  lock_files_.clear();
  swap_files_.clear();
  return first;
}

Status PreallocateSwap(int fd, const std::string& path, uint64_t size) {
  struct statvfs vfs {};
  uint64_t free_bytes = 0;
  if (::fstatvfs(fd, &vfs) == 0) free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
  auto too_small = [&] {
    return ResourceExhaustedError("swap file " + path + " needs " + FormatBytes(size) + " but its file system has " +
                                  FormatBytes(free_bytes) +
                                  " free; free space, lower the NVMe budget, or add swap paths");
  };
  if (free_bytes != 0 && free_bytes < size) return too_small();
  if (::fallocate(fd, 0, 0, static_cast<off_t>(size)) != 0) {
    int err = errno;
    if (err == ENOSPC || err == EDQUOT) return too_small();
    if (err == EOPNOTSUPP) {
      STRATA_LOG(kWarn, "nvme") << path << ": fallocate not supported; space is not reserved up front";
      if (::ftruncate(fd, static_cast<off_t>(size)) != 0) return ErrnoError(errno, "ftruncate " + path);
      return OkStatus();
    }
    return ErrnoError(err, "fallocate " + FormatBytes(size) + " for " + path);
  }
  return OkStatus();
}

}  // namespace strata::detail
