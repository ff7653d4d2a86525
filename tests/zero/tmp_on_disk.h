// GPU tests with NVMe swaps or checkpoints need a file system with O_DIRECT, and a GPU
// machine's /tmp may be tmpfs: then TMPDIR (where swap folders and checkpoints go) is set
// to the working directory, which ctest makes the build folder.
#pragma once

#include <sys/vfs.h>

#include <cstdlib>
#include <filesystem>

namespace strata::testing {

// Call once, before any test runs (a namespace-scope initialiser). Returns true.
inline bool MoveTmpOffTmpfs() {
  constexpr long kTmpfsMagic = 0x01021994;
  struct statfs fs;
  if (std::getenv("TMPDIR") == nullptr && statfs("/tmp", &fs) == 0 &&
      static_cast<long>(fs.f_type) == kTmpfsMagic) {
    setenv("TMPDIR", std::filesystem::current_path().c_str(), 1);
  }
  return true;
}

}  // namespace strata::testing
