#include "strata/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "strata/status.h"

namespace strata {
namespace {

// The evaluation order of each formula is DeepSpeed's, so the rates agree to the last bit
// where the arithmetic allows.

// The warmup fraction at iteration `it` in [0, warmup): log grows as ln(it + 1) / ln(warmup)
// (a reciprocal times a logarithm, as DeepSpeed computes it), linear as it / warmup.
// Both are 0 at it = 0.
double WarmupGamma(WarmupType type, int64_t it, int64_t warmup) {
  if (type == WarmupType::kLinear) return static_cast<double>(it) / static_cast<double>(warmup);
  const double inverse_log_warmup = 1.0 / std::log(static_cast<double>(warmup));
  return inverse_log_warmup * std::log(static_cast<double>(it + 1));
}

// WarmupLR and WarmupDecayLR: from warmup_min_lr to warmup_max_lr over the warmup, then
// constant (WarmupLR) or down linearly to 0 at total_num_steps (WarmupDecayLR).
double WarmupRate(const LrSchedule& s, int64_t it, double base_lr) {
  const bool decay = s.type == LrScheduleType::kWarmupDecayLR;
  const double min_lr = s.warmup_min_lr;
  const double max_lr = s.warmup_max_lr.value_or(decay ? kWarmupDecayDefaultMaxLr : base_lr);
  // Before the first scheduler step DeepSpeed's get_lr() returns the minimum.
  if (it < 0) return min_lr;
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  double gamma = 1.0;
  if (it < warmup) {
    gamma = WarmupGamma(s.warmup_type, it, warmup);
  } else if (decay) {
    gamma = std::max(0.0, static_cast<double>(s.total_num_steps - it) /
                              std::max(1.0, static_cast<double>(s.total_num_steps - warmup)));
  }
  return min_lr + (max_lr - min_lr) * gamma;
}

// WarmupCosineLR: ratios of base_lr, from warmup_min_ratio to 1 over the warmup, then a
// half cosine down to cos_min_ratio at total_num_steps, held there after.
double CosineRate(const LrSchedule& s, int64_t it, double base_lr) {
  // DeepSpeed's constructor puts ratio 0 in the optimizer: the first step's rate is 0.
  if (it < 0) return 0.0;
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  double ratio;
  if (it < warmup) {
    ratio = s.warmup_min_ratio + WarmupGamma(s.warmup_type, it, warmup) * (1.0 - s.warmup_min_ratio);
  } else {
    const double real_last_step = static_cast<double>(it - warmup + 1);
    const double real_total_steps = static_cast<double>(std::max<int64_t>(1, s.total_num_steps - warmup));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
  }
  return base_lr * ratio;
}

}  // namespace

double LearningRateAt(const LrSchedule& schedule, int64_t step, double base_lr) {
  STRATA_CHECK_MSG(step >= 0, "LearningRateAt: step counts applied optimizer steps, from 0");
  const LrScheduleType type = schedule.type;
  if (type == LrScheduleType::kConstant) return base_lr;
  STRATA_CHECK_MSG(schedule.warmup_num_steps >= 1, "LearningRateAt: warmup_num_steps must be at least 1");
  STRATA_CHECK_MSG(type == LrScheduleType::kWarmupLR || schedule.total_num_steps >= 1,
                   "LearningRateAt: WarmupDecayLR and WarmupCosineLR need total_num_steps >= 1");
  // DeepSpeed's last_batch_iteration for this step: -1 until the first step is applied.
  const int64_t it = step - 1;
  if (type == LrScheduleType::kWarmupCosineLR) return CosineRate(schedule, it, base_lr);
  return WarmupRate(schedule, it, base_lr);
}

}  // namespace strata
