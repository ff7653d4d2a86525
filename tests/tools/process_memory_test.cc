// The process's base for the memory account (tools/process_memory.h): the BLAS's kernels
// are in it once WarmMatrixProducts has run, and the executable's code not yet run is
// counted on top.
#include "tools/process_memory.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "strata/mlp_kernels.h"

namespace strata::tools {
namespace {

// Resident bytes of the mappings that hold code outside this executable: the libraries'
// text and anonymous executable memory (a JIT's kernels).
uint64_t ForeignCodeRss() {
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  const std::string self(exe, len > 0 ? static_cast<size_t>(len) : 0);
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (f == nullptr) return 0;
  char line[4352];
  bool code = false;
  unsigned long long v = 0, kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    char perms[8] = {}, path[4097] = {};
    if (std::sscanf(line, "%*[0-9a-f]-%*[0-9a-f] %7s %*s %*s %*s %4096s", perms, path) >= 1 &&
        std::strlen(perms) == 4) {
      code = perms[2] == 'x' && self != path;
    } else if (code && std::sscanf(line, "Rss: %llu kB", &v) == 1) {
      kib += v;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

// The GPT's products at two widths, both ways a Linear runs them (forward, and the
// backward's two products, which accumulate), after the warm-up: no library code or
// generated kernel is added beyond a few pages of slack.
TEST(ProcessMemory, TheWarmUpHoldsTheProductsCode) {
  model::WarmMatrixProducts();
  const uint64_t before = ForeignCodeRss();
  ASSERT_GT(before, 0u) << "no /proc/self/smaps";
  for (const int64_t c : {64, 384}) {
    const int64_t rows = 128, out = 4 * c;
    std::vector<float> x(rows * c, 0.5f), w(c * out, 0.25f), y(rows * out, 0.0f);
    model::Gemm(rows, out, c, x.data(), c, w.data(), out, y.data(), out, false);
    model::Gemm(c, out, rows, x.data(), rows, y.data(), out, w.data(), out, true);
    model::Gemm(rows, c, out, y.data(), out, w.data(), c, x.data(), c, false);
    model::Gemm(1, out, c, x.data(), c, w.data(), out, y.data(), out, false);
  }
  const uint64_t after = ForeignCodeRss();
  EXPECT_LE(after, before + 64 * 1024)
      << "the products paged in " << (after - before) / 1024 << " KiB of code after the warm-up";
}

TEST(ProcessMemory, TheBaseCountsTheCodeNotYetRun) {
  const uint64_t untouched = UntouchedOwnCodeBytes();
  // A test binary runs a small part of its code; what it has not run is counted.
  EXPECT_GT(untouched, 64u * 1024);
  const uint64_t rss = CurrentRssBytes();
  const uint64_t base = MeasureProcessBase();
  EXPECT_GE(base, rss + UntouchedOwnCodeBytes() / 2);
  EXPECT_LE(base, CurrentRssBytes() + untouched + 4096);
}

}  // namespace
}  // namespace strata::tools
