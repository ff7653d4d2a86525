// Internal to the IoEngine backends: the table of registered files (id -> fd, name,
// in-flight counter) and the backend factories.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "strata/io.h"

namespace strata::detail {

class FileTable {
 public:
  static constexpr int kMaxFiles = 256;  // also the size of io_uring's sparse file table
  FileTable();
  ~FileTable();

  // Opens with O_DIRECT|O_RDWR (|O_CREAT) and takes a free id; the fd is owned.
  Result<int> Open(const std::string& path, bool create, int* fd_out);
  // Takes a free id for a caller-owned fd.
  Result<int> Adopt(int fd, const std::string& name);
  // Releases an id (closing an owned fd); FailedPrecondition with requests in flight.
  Status Release(int id);
  int fd(int id) const;  // -1 when unknown
  std::string name(int id) const;
  std::atomic<int>* inflight(int id);

 private:
  Result<int> Take(int fd, const std::string& name, bool owned);
  struct Entry {
    int fd = -1;
    bool owned = false;
    std::string name;
  };
  mutable std::mutex mu_;
  std::array<Entry, kMaxFiles> entries_;
  std::array<std::atomic<int>, kMaxFiles> inflight_{};
  std::array<std::atomic<int>, kMaxFiles> fds_{};  // lock-free fd lookup on I/O paths
};

Result<std::unique_ptr<IoEngine>> CreateUringEngine(const IoEngineOptions& options);
std::unique_ptr<IoEngine> CreatePsyncEngine(const IoEngineOptions& options);

}  // namespace strata::detail
