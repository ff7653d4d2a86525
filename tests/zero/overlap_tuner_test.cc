// strata.overlap "auto": the trial schedule and the decision, hand-worked.
#include "zero/overlap_tuner.h"

#include <gtest/gtest.h>

namespace strata::zero {
namespace {

TEST(OverlapTuner, AnExplicitModeNeverChanges) {
  for (bool fixed : {true, false}) {
    OverlapTuner t(/*enabled=*/false, fixed);
    for (int w = 0; w < 20; ++w) {
      EXPECT_EQ(t.ModeFor(w), fixed) << w;
      EXPECT_FALSE(t.Record(w, w % 2 ? 1.0 : 0.1));
    }
    EXPECT_FALSE(t.decided());
  }
}

TEST(OverlapTuner, AlternatesFromTheSecondStepAndKeepsTheFaster) {
  OverlapTuner t(true, true);
  const bool want[] = {true, true, false, true, false};
  for (int w = 0; w < 5; ++w) EXPECT_EQ(t.ModeFor(w), want[w]) << w;
  EXPECT_FALSE(t.Record(0, 9.0)) << "the first step is not timed";
  EXPECT_FALSE(t.Record(1, 0.120));
  EXPECT_FALSE(t.Record(2, 0.090));
  EXPECT_FALSE(t.Record(3, 0.110));
  EXPECT_TRUE(t.Record(4, 0.095));
  EXPECT_TRUE(t.decided());
  for (int w = 5; w < 40; ++w) EXPECT_FALSE(t.ModeFor(w)) << w;
  EXPECT_NE(t.reason().find("overlapped 0.110 s, serial 0.090 s"), std::string::npos) << t.reason();
  EXPECT_NE(t.reason().find("overlap off"), std::string::npos) << t.reason();
  EXPECT_FALSE(t.Record(6, 0.001)) << "decided once";
}

TEST(OverlapTuner, EachModeIsJudgedByItsBestStepAndTiesKeepOverlap) {
  OverlapTuner spike(true, true);
  spike.Record(1, 0.100);
  spike.Record(2, 0.105);
  spike.Record(3, 0.900);  // a step disturbed by something else
  spike.Record(4, 0.105);
  ASSERT_TRUE(spike.decided());
  EXPECT_TRUE(spike.ModeFor(5));
  OverlapTuner tie(true, true);
  for (int w = 1; w <= 4; ++w) tie.Record(w, 0.1);
  ASSERT_TRUE(tie.decided());
  EXPECT_TRUE(tie.ModeFor(5));
}

TEST(OverlapTuner, WindowsNotTimedAreMadeUpLaterAndAtWorstOverlapStays) {
  // Windows 2 and 3 held an evaluation (not recorded): 5 and 6 stand in for them.
  OverlapTuner t(true, true);
  t.Record(1, 0.2);
  t.Record(4, 0.1);
  EXPECT_FALSE(t.decided());
  EXPECT_TRUE(t.ModeFor(5));
  EXPECT_FALSE(t.ModeFor(6));
  t.Record(5, 0.2);
  EXPECT_TRUE(t.Record(6, 0.1));
  EXPECT_FALSE(t.ModeFor(7));
  // Nothing timed at all: the trial ends and overlap stays on.
  OverlapTuner never(true, true);
  EXPECT_FALSE(never.ModeFor(16));
  for (int w = 17; w < 30; ++w) EXPECT_TRUE(never.ModeFor(w)) << w;
  EXPECT_FALSE(never.Record(20, 0.1));
}

}  // namespace
}  // namespace strata::zero
