// The stage-3 prefetch depth derived from measured gather latency and module compute.
#include "zero/prefetch_depth.h"

#include <gtest/gtest.h>

namespace strata::zero {
namespace {

TEST(PrefetchDepth, CoversTheGatherLatencyWithComputePlusOne) {
  // 25 ms gathers behind 10 ms modules: three modules of compute cover one, plus one.
  EXPECT_EQ(PrefetchDepth(0.025, 0.010, 8), 4);
  // Gathers faster than compute: the next module, plus one.
  EXPECT_EQ(PrefetchDepth(0.002, 0.010, 8), 2);
  // Exactly one module's compute.
  EXPECT_EQ(PrefetchDepth(0.010, 0.010, 8), 2);
}

TEST(PrefetchDepth, StaysWithinWhatTheBuffersAllow) {
  EXPECT_EQ(PrefetchDepth(1.0, 0.001, 8), 8);  // disk-bound: as deep as the budget allows
  EXPECT_EQ(PrefetchDepth(0.002, 0.010, 1), 1);
  EXPECT_EQ(PrefetchDepth(0.002, 0.010, 0), 1);  // a bad bound still prefetches one
}

TEST(PrefetchDepth, WithoutAMeasurementGoesAsDeepAsAllowed) {
  EXPECT_EQ(PrefetchDepth(0, 0.010, 5), 5);
  EXPECT_EQ(PrefetchDepth(0.010, 0, 5), 5);
  EXPECT_EQ(PrefetchDepth(-1, -1, 3), 3);
}

}  // namespace
}  // namespace strata::zero
