// Learning-rate schedules: DeepSpeed's `scheduler` block (WarmupLR, WarmupDecayLR and
// WarmupCosineLR of deepspeed/runtime/lr_schedules.py, same formulas and defaults) as a
// plain description, and the rate it gives each optimizer step.
//
// Contract:
//  - LrSchedule is a value (thread-safe to read); ParseConfig fills Config::scheduler and
//    refuses what is not valid, so a parsed schedule always evaluates.
//  - LearningRateAt(schedule, step, base_lr) is pure. `step` counts the optimizer steps
//    applied before the one being taken (0 for the first), as DeepSpeed's engine advances
//    its scheduler: once after every applied step, not after one skipped for an fp16
//    overflow (StepResult::skipped). The result is DeepSpeed's get_lr() at
//    last_batch_iteration = step - 1; at step 0 that is the rate the scheduler's
//    constructor puts in the optimizer (warmup_min_lr; 0 for WarmupCosineLR).
//  - base_lr is optimizer.params.lr: the constant rate when there is no schedule,
//    WarmupCosineLR's peak (its rates are ratios of it), and WarmupLR's warmup_max_lr when
//    that key is absent. WarmupDecayLR's absent warmup_max_lr is 0.001, as in DeepSpeed.
//  - Apply the result with Engine::SetLearningRate between Step() and the next micro-batch.
//  - Library: LearningRateAt is in strata_optim; the description is plain data, so the
//    config (strata_core) holds it without linking the optimizer.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class LrScheduleType { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType { kLog, kLinear };

// "constant" (no scheduler block), or DeepSpeed's type name ("WarmupLR", ...).
inline std::string_view LrScheduleTypeName(LrScheduleType t) {
  switch (t) {
    case LrScheduleType::kConstant: return "constant";
    case LrScheduleType::kWarmupLR: return "WarmupLR";
    case LrScheduleType::kWarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleType::kWarmupCosineLR: return "WarmupCosineLR";
  }
  return "?";
}
inline std::string_view WarmupTypeName(WarmupType t) { return t == WarmupType::kLinear ? "linear" : "log"; }

// WarmupDecayLR's warmup_max_lr when the key is absent (DeepSpeed's signature default).
inline constexpr double kWarmupDecayDefaultMaxLr = 0.001;

// scheduler.params, DeepSpeed's names and defaults. Which keys a type reads:
//   WarmupLR:       warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type
//   WarmupDecayLR:  those and total_num_steps
//   WarmupCosineLR: total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio,
//                   warmup_type
struct LrSchedule {
  LrScheduleType type = LrScheduleType::kConstant;
  WarmupType warmup_type = WarmupType::kLog;
  // At least 1; DeepSpeed warms up over max(2, warmup_num_steps) steps.
  int64_t warmup_num_steps = 1000;
  double warmup_min_lr = 0;
  // Unset: base_lr for WarmupLR, kWarmupDecayDefaultMaxLr for WarmupDecayLR.
  std::optional<double> warmup_max_lr;
  int64_t total_num_steps = 0;  // required (>= 1) by WarmupDecayLR and WarmupCosineLR
  double warmup_min_ratio = 0;  // WarmupCosineLR: the warmup starts at this x base_lr
  double cos_min_ratio = 1e-4;  // WarmupCosineLR: the cosine ends at this x base_lr
};

// The learning rate of the optimizer step taken after `step` (>= 0) applied steps.
// Aborts (STRATA_CHECK) on a schedule ParseConfig would have refused.
double LearningRateAt(const LrSchedule& schedule, int64_t step, double base_lr);

}  // namespace strata
