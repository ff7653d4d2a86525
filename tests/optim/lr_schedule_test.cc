// LearningRateAt against values derived by hand from DeepSpeed's schedules
// (deepspeed/runtime/lr_schedules.py, deepspeedai/DeepSpeed 22779f2c): the rate of the
// optimizer step taken after n applied steps is get_lr() at last_batch_iteration
// it = n - 1, and at n = 0 the rate the constructor sets (get_lr() at -1). With
// W = max(2, warmup_num_steps), T = total_num_steps:
//   warmup fraction g(it) = ln(it + 1) / ln(W) (log) or it / W (linear), for it < W;
//   WarmupLR:       min + (max - min) * (it < W ? g(it) : 1); min at it = -1;
//   WarmupDecayLR:  as WarmupLR but after the warmup max(0, (T - it) / max(1, T - W));
//   WarmupCosineLR: base * ratio; ratio 0 at it = -1; wmr + g(it) * (1 - wmr) in the
//                   warmup; after it, with p = min(1, (it - W + 1) / max(1, T - W)),
//                   max(0, cmr + (1 - cmr) * (1 + cos(pi p)) / 2).
// The expected values below are those formulas worked through per case, written with
// log10 / simple fractions so that they do not repeat the implementation's arithmetic.
#include "strata/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace strata {
namespace {

constexpr double kTol = 1e-15;  // relative; the formulas are a few double operations

void ExpectRate(const LrSchedule& s, int64_t step, double base_lr, double expected) {
  EXPECT_NEAR(LearningRateAt(s, step, base_lr), expected, kTol * std::max(1e-12, std::fabs(expected)))
      << LrScheduleTypeName(s.type) << " " << WarmupTypeName(s.warmup_type) << " at step " << step;
}

LrSchedule Schedule(LrScheduleType type, WarmupType warmup, int64_t warmup_steps) {
  LrSchedule s;
  s.type = type;
  s.warmup_type = warmup;
  s.warmup_num_steps = warmup_steps;
  return s;
}

TEST(LrSchedule, ConstantIsTheBaseRate) {
  const LrSchedule s;
  for (int64_t step : {0, 1, 1000, 1'000'000}) ExpectRate(s, step, 3e-4, 3e-4);
}

// W = 10, min 1e-5, max 1e-3 (delta 9.9e-4).
TEST(LrSchedule, WarmupLogRisesAsTheLogOfTheStep) {
  LrSchedule s = Schedule(LrScheduleType::kWarmupLR, WarmupType::kLog, 10);
  s.warmup_min_lr = 1e-5;
  s.warmup_max_lr = 1e-3;
  ExpectRate(s, 0, 0.5, 1e-5);                             // the constructor's rate: min
  ExpectRate(s, 1, 0.5, 1e-5);                             // it 0: ln 1 = 0
  ExpectRate(s, 2, 0.5, 1e-5 + std::log10(2.0) * 9.9e-4);  // it 1: ln 2 / ln 10
  ExpectRate(s, 5, 0.5, 1e-5 + std::log10(5.0) * 9.9e-4);  // it 4
  ExpectRate(s, 10, 0.5, 1e-3);                            // step == W: it 9, ln 10 / ln 10
  ExpectRate(s, 11, 0.5, 1e-3);                            // past the warmup: max
  ExpectRate(s, 1'000'000, 0.5, 1e-3);
}

// W = 10, min 0, max 2e-3: at step == warmup_num_steps the linear warmup is at 9/10.
TEST(LrSchedule, WarmupLinearRisesByOneTenthPerStep) {
  LrSchedule s = Schedule(LrScheduleType::kWarmupLR, WarmupType::kLinear, 10);
  s.warmup_max_lr = 2e-3;
  ExpectRate(s, 0, 0.5, 0.0);
  ExpectRate(s, 1, 0.5, 0.0);
  ExpectRate(s, 2, 0.5, 2e-4);  // it 1: 1/10
  ExpectRate(s, 5, 0.5, 8e-4);  // it 4: 4/10
  ExpectRate(s, 10, 0.5, 1.8e-3);
  ExpectRate(s, 11, 0.5, 2e-3);
  ExpectRate(s, 500, 0.5, 2e-3);
}

// Without warmup_max_lr WarmupLR climbs to the optimizer's rate; warmup_num_steps 1
// warms up over W = 2 steps, as DeepSpeed's max(2, n) does.
TEST(LrSchedule, WarmupLRDefaultsToTheBaseRateAndTwoSteps) {
  const LrSchedule s = Schedule(LrScheduleType::kWarmupLR, WarmupType::kLinear, 1);
  ExpectRate(s, 0, 4e-4, 0.0);
  ExpectRate(s, 1, 4e-4, 0.0);
  ExpectRate(s, 2, 4e-4, 2e-4);  // it 1: 1/2
  ExpectRate(s, 3, 4e-4, 4e-4);
  const LrSchedule log_default = Schedule(LrScheduleType::kWarmupLR, WarmupType::kLog, 1000);
  ExpectRate(log_default, 100, 4e-4, 4e-4 * std::log10(100.0) / 3);  // it 99: ln 100 / ln 1000
}

// W = 4, T = 10, max 1e-3: up over 4 steps, then down by 1/6 per step to 0 at it = T.
TEST(LrSchedule, WarmupDecayFallsLinearlyToZeroAtTotalSteps) {
  LrSchedule s = Schedule(LrScheduleType::kWarmupDecayLR, WarmupType::kLinear, 4);
  s.total_num_steps = 10;
  s.warmup_max_lr = 1e-3;
  ExpectRate(s, 0, 0.5, 0.0);
  ExpectRate(s, 3, 0.5, 5e-4);       // it 2: 2/4
  ExpectRate(s, 4, 0.5, 7.5e-4);     // step == W: it 3, 3/4
  ExpectRate(s, 5, 0.5, 1e-3);       // it 4 = W: (10 - 4) / 6
  ExpectRate(s, 8, 0.5, 5e-4);       // it 7: 3/6
  ExpectRate(s, 10, 0.5, 1e-3 / 6);  // it 9: 1/6
  ExpectRate(s, 11, 0.5, 0.0);       // it 10 = T
  ExpectRate(s, 40, 0.5, 0.0);       // past T: held at min
  s.warmup_min_lr = 1e-4;
  ExpectRate(s, 8, 0.5, 1e-4 + 0.5 * 9e-4);
  ExpectRate(s, 40, 0.5, 1e-4);
}

// WarmupDecayLR's own default maximum is 0.001, whatever the optimizer's rate.
TEST(LrSchedule, WarmupDecayDefaultMaximumIsDeepSpeeds) {
  LrSchedule s = Schedule(LrScheduleType::kWarmupDecayLR, WarmupType::kLog, 10);
  s.total_num_steps = 100;
  ExpectRate(s, 11, 0.5, 1e-3 * 90 / 90);  // it 10 = W: (100 - 10) / 90
  ExpectRate(s, 56, 0.5, 1e-3 * 45 / 90);  // it 55
  ExpectRate(s, 2, 0.5, 1e-3 * std::log10(2.0));
}

// total_num_steps below the warmup: no decay window, so the rate drops to min after it.
TEST(LrSchedule, WarmupDecayWithTotalInsideTheWarmup) {
  LrSchedule s = Schedule(LrScheduleType::kWarmupDecayLR, WarmupType::kLinear, 4);
  s.total_num_steps = 3;
  s.warmup_max_lr = 1e-3;
  ExpectRate(s, 4, 0.5, 7.5e-4);  // it 3: still warming up
  ExpectRate(s, 5, 0.5, 0.0);     // it 4: (3 - 4) / max(1, -1) < 0, clamped
}

// W = 5 (linear), T = 25, base 2e-3, warmup_min_ratio 0.1, cos_min_ratio 0.01. The first
// step's rate is 0 (the constructor's ratio), and the peak ratio 1 is never reached:
// the cosine starts one step in, at p = 1/20.
TEST(LrSchedule, WarmupCosineWarmsUpThenFollowsAHalfCosine) {
  LrSchedule s = Schedule(LrScheduleType::kWarmupCosineLR, WarmupType::kLinear, 5);
  s.total_num_steps = 25;
  s.warmup_min_ratio = 0.1;
  s.cos_min_ratio = 0.01;
  const double base = 2e-3;
  auto cosine = [](double p) { return 0.01 + 0.99 * (1 + std::cos(std::numbers::pi * p)) / 2; };
  ExpectRate(s, 0, base, 0.0);
  ExpectRate(s, 1, base, base * 0.1);           // it 0
  ExpectRate(s, 3, base, base * 0.46);          // it 2: 0.1 + 2/5 x 0.9
  ExpectRate(s, 5, base, base * 0.82);          // step == W: it 4, 0.1 + 4/5 x 0.9
  ExpectRate(s, 6, base, base * cosine(0.05));  // it 5 = W: p = 1/20
  ExpectRate(s, 15, base, base * 0.505);        // it 14: p = 1/2, cos = 0
  ExpectRate(s, 16, base, base * cosine(0.55));
  ExpectRate(s, 25, base, base * 0.01);   // it 24: p = 1, the floor
  ExpectRate(s, 26, base, base * 0.01);   // it 25: p would be 21/20, held at 1
  ExpectRate(s, 900, base, base * 0.01);  // past T
}

// Log warmup with DeepSpeed's defaults for the ratios (warmup_min_ratio 0, cos_min_ratio
// 1e-4): W = 8, so it 3 is at ln 4 / ln 8 = 2/3.
TEST(LrSchedule, WarmupCosineLogWarmupAndDefaultRatios) {
  LrSchedule s = Schedule(LrScheduleType::kWarmupCosineLR, WarmupType::kLog, 8);
  s.total_num_steps = 8;       // no decay window: max(1, T - W) = 1
  ExpectRate(s, 1, 1.0, 0.0);  // it 0: ratio wmr = 0
  ExpectRate(s, 4, 1.0, 2.0 / 3);
  ExpectRate(s, 8, 1.0, 1.0);   // it 7: ln 8 / ln 8
  ExpectRate(s, 9, 1.0, 1e-4);  // it 8: p = 1
  ExpectRate(s, 50, 1.0, 1e-4);
}

}  // namespace
}  // namespace strata
