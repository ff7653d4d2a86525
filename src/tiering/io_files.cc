#include "tiering/io_files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace strata::detail {

FileTable::FileTable() {
  for (auto& f : fds_) f.store(-1);
}

FileTable::~FileTable() {
  for (auto& e : entries_) {
    if (e.fd >= 0 && e.owned) ::close(e.fd);
  }
}

Result<int> FileTable::Open(const std::string& path, bool create, int* fd_out) {
  int flags = O_RDWR | O_DIRECT | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = ::open(path.c_str(), flags, 0600);
  if (fd < 0) {
    int err = errno;
    if (err == EINVAL) {
      return UnavailableError("open " + path +
                              " with O_DIRECT: the file system does not support direct I/O; "
                              "put the file on a local disk (not tmpfs)");
    }
    return ErrnoError(err, "open " + path + " (O_DIRECT)");
  }
  Result<int> id = Take(fd, path, true);
  if (!id.ok()) {
    ::close(fd);
    return id;
  }
  *fd_out = fd;
  return id;
}

Result<int> FileTable::Adopt(int fd, const std::string& name) {
  if (fd < 0) return InvalidArgumentError("RegisterFd: invalid fd " + std::to_string(fd) + " for " + name);
  return Take(fd, name, false);
}

Result<int> FileTable::Take(int fd, const std::string& name, bool owned) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < kMaxFiles; ++i) {
    if (entries_[i].fd < 0) {
      entries_[i] = Entry{fd, owned, name};
      inflight_[i].store(0);
      fds_[i].store(fd, std::memory_order_release);
      return i;
    }
  }
  return ResourceExhaustedError("IoEngine: more than " + std::to_string(kMaxFiles) +
                                " files registered; unregister some before registering " + name);
}

Status FileTable::Release(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= kMaxFiles || entries_[id].fd < 0) {
    return InvalidArgumentError("IoEngine: unknown file id " + std::to_string(id));
  }
  if (inflight_[id].load() != 0) {
    return FailedPreconditionError("IoEngine: cannot unregister " + entries_[id].name + " with " +
                                   std::to_string(inflight_[id].load()) +
                                   " requests in flight; wait for them first");
  }
  if (entries_[id].owned) ::close(entries_[id].fd);
  entries_[id] = Entry{};
  fds_[id].store(-1, std::memory_order_release);
  return OkStatus();
}

int FileTable::fd(int id) const {
  if (id < 0 || id >= kMaxFiles) return -1;
  return fds_[id].load(std::memory_order_acquire);
}

std::string FileTable::name(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id < 0 || id >= kMaxFiles || entries_[id].fd < 0) return {};
  return entries_[id].name;
}

std::atomic<int>* FileTable::inflight(int id) {
  if (fd(id) < 0) return nullptr;
  return &inflight_[id];
}

}  // namespace strata::detail
