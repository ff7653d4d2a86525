// Loss scaling for fp16 mixed precision, with DeepSpeed's semantics
// (deepspeed/runtime/fp16/loss_scaler.py: LossScaler, DynamicLossScaler, CreateLossScaler;
// checked against deepspeedai/DeepSpeed at commit 18fd4c97).
//
// Use, once per optimizer step:
//   loss * scaler.scale() -> backward -> global inf/NaN check over all ranks' grads
//   (grad_stats.h) -> if overflow: skip the step (optimizer state untouched);
//   else: step with AdamParams::grad_scale = scaler.grad_scale() * clip_factor;
//   then scaler.Update(overflow) in both cases.
//
// Dynamic rule (DynamicLossScaler.update_scale):
//   overflow:   if delayed_shift == 1 or hysteresis == 1: scale = max(scale / 2, min_scale)
//               (Update fails instead if scale == min_scale and raise_error_at_min_scale);
//               else hysteresis -= 1. last_overflow_iter = iter.
//   no overflow: if consecutive_hysteresis: hysteresis = delayed_shift.
//               stable = iter - last_overflow_iter - 1; if stable > 0 and stable % window == 0:
//               scale *= 2 (and hysteresis = delayed_shift unless consecutive_hysteresis).
//   iter += 1.
// So the scale doubles after window+1 overflow-free steps (DeepSpeed before 2025 used
// (iter - last_overflow_iter) % window == 0, i.e. after `window` steps; set
// legacy_window_rule to get that).
// Static (fp16.loss_scale > 0, or bf16/fp32 training with scale 1): the scale never changes;
// an overflow still means the step must be skipped.
//
// Thread-safety: a value type; one owner (the engine's step thread).
#pragma once

#include <cstdint>

#include "strata/config.h"
#include "strata/status.h"

namespace strata {

struct LossScalerOptions {
  bool dynamic = true;
  double init_scale = 65536.0;  // 2^initial_scale_power; the fixed scale when !dynamic
  int64_t scale_window = 1000;  // loss_scale_window
  double min_scale = 1.0;       // min_loss_scale
  int delayed_shift = 2;        // hysteresis
  bool consecutive_hysteresis = false;
  bool raise_error_at_min_scale = true;
  bool legacy_window_rule = false;
  double scale_factor = 2.0;

  // DeepSpeed's CreateLossScaler: fp16 enabled with loss_scale 0 -> dynamic from
  // initial_scale_power, loss_scale_window, hysteresis, min_loss_scale; fp16 with
  // loss_scale > 0 -> static at that value; fp16 disabled -> static 1.
  static LossScalerOptions FromConfig(const Config& config);
};

class LossScaler {
 public:
  // Validates options: scales positive and finite, window >= 1, delayed_shift >= 1.
  static Result<LossScaler> Create(const LossScalerOptions& options);

  double scale() const { return scale_; }
  // 1 / scale(), the factor that unscales gradients (AdamParams::grad_scale).
  float grad_scale() const { return static_cast<float>(1.0 / scale_); }
  bool dynamic() const { return options_.dynamic; }

  // Records one step's global overflow verdict and adjusts the scale. Returns
  // FailedPrecondition (state unchanged) when an overflow would push a dynamic scale below
  // min_scale and raise_error_at_min_scale is set (DeepSpeed raises there).
  Status Update(bool overflow);

  // State for checkpoints (DeepSpeed keeps the same fields).
  struct State {
    double scale = 1;
    int64_t iter = 0;
    int64_t last_overflow_iter = -1;
    int hysteresis = 1;
  };
  State state() const { return {scale_, iter_, last_overflow_iter_, hysteresis_}; }
  void Restore(const State& s) {
    scale_ = s.scale;
    iter_ = s.iter;
    last_overflow_iter_ = s.last_overflow_iter;
    hysteresis_ = s.hysteresis;
  }

 private:
  explicit LossScaler(const LossScalerOptions& o)
      : options_(o), scale_(o.init_scale), hysteresis_(o.delayed_shift) {}
  LossScalerOptions options_;
  double scale_;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int hysteresis_;
};

}  // namespace strata
