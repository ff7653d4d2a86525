// The process's base for the memory account (tools/process_memory.h): the BLAS's kernels
// are in it once WarmMatrixProducts has run, and the executable's code not yet run is
// counted on top.
#include "tools/process_memory.h"

#include <gtest/gtest.h>

#include <vector>

#include "strata/mlp_kernels.h"

namespace strata::tools {
namespace {

// The GPT's products at two widths, both ways a Linear runs them (forward, and the
// backward's two products, which accumulate), after the warm-up: no library code or
// generated kernel is added beyond a few pages of slack.
TEST(ProcessMemory, TheWarmUpHoldsTheProductsCode) {
  model::WarmMatrixProducts();
  const uint64_t before = ReadCodeResidency().other_resident;
  ASSERT_GT(before, 0u) << "no /proc/self/smaps";
  for (const int64_t c : {64, 384}) {
    const int64_t rows = 128, out = 4 * c;
    std::vector<float> x(rows * c, 0.5f), w(c * out, 0.25f), y(rows * out, 0.0f);
    model::Gemm(rows, out, c, x.data(), c, w.data(), out, y.data(), out, false);
    model::Gemm(c, out, rows, x.data(), rows, y.data(), out, w.data(), out, true);
    model::Gemm(rows, c, out, y.data(), out, w.data(), c, x.data(), c, false);
    model::Gemm(1, out, c, x.data(), c, w.data(), out, y.data(), out, false);
  }
  const uint64_t after = ReadCodeResidency().other_resident;
  EXPECT_LE(after, before + 64 * 1024)
      << "the products paged in " << (after - before) / 1024 << " KiB of code after the warm-up";
}

TEST(ProcessMemory, TheBaseCountsTheCodeNotYetRun) {
  const uint64_t untouched = ReadCodeResidency().own_untouched();
  // A test binary runs a small part of its code; what it has not run is counted.
  EXPECT_GT(untouched, 64u * 1024);
  const uint64_t rss = CurrentRssBytes();
  const uint64_t base = MeasureProcessBase();
  EXPECT_GE(base, rss + ReadCodeResidency().own_untouched() / 2);
  EXPECT_LE(base, CurrentRssBytes() + untouched + 4096);
}

}  // namespace
}  // namespace strata::tools
