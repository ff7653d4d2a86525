// Helpers shared by the IoEngine and NvmeStore tests: a scratch directory on the work
// disk (O_DIRECT needs a real file system, not tmpfs), aligned buffers, patterns.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "strata/io.h"

namespace strata::testing_io {

inline std::string ScratchDir(const std::string& tag) {
  const char* base = std::getenv("STRATA_TEST_IO_DIR");
  std::filesystem::path dir = base ? base : "/tmp";
  dir /= "strata-" + tag + "-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir.string();
}

struct FreeDeleter {
  void operator()(char* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<char, FreeDeleter>;
inline AlignedBuf Alloc(uint64_t bytes, uint64_t align = 4096) {
  return AlignedBuf(static_cast<char*>(std::aligned_alloc(align, (bytes + align - 1) / align * align)));
}

// A pattern that identifies (seed, position) so misplaced data is detected.
inline void Fill(char* p, uint64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, std::min<uint64_t>(8, n - i));
  }
}

inline std::string BackendParamName(const ::testing::TestParamInfo<IoBackendKind>& info) {
  return info.param == IoBackendKind::kPsync ? "psync" : "io_uring";
}

inline bool SkipIfUnavailable(IoBackendKind kind) {
  if (kind != IoBackendKind::kIoUring) return false;
  return !ProbeIoUring().usable;
}

}  // namespace strata::testing_io
