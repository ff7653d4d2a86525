// LossScaler: DeepSpeed's LossScaler / DynamicLossScaler update rule (see loss_scaler.h).
#include "strata/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "strata/log.h"

namespace strata {

LossScalerOptions LossScalerOptions::FromConfig(const Config& config) {
  LossScalerOptions o;
  if (!config.fp16.enabled) {  // bf16 / fp32: a static scaler at 1 (CreateLossScaler)
    o.dynamic = false;
    o.init_scale = 1.0;
    return o;
  }
  if (config.fp16.loss_scale > 0) {
    o.dynamic = false;
    o.init_scale = config.fp16.loss_scale;
    return o;
  }
  o.dynamic = true;
  o.init_scale = std::ldexp(1.0, config.fp16.initial_scale_power);
  o.scale_window = config.fp16.loss_scale_window;
  o.delayed_shift = config.fp16.hysteresis;
  o.min_scale = config.fp16.min_loss_scale;
  return o;
}

Result<LossScaler> LossScaler::Create(const LossScalerOptions& o) {
  auto positive = [](double x) { return std::isfinite(x) && x > 0; };
  if (!positive(o.init_scale)) {
    return InvalidArgumentError("loss scaler: initial scale must be finite and > 0, got " +
                                std::to_string(o.init_scale));
  }
  if (o.dynamic) {
    if (!positive(o.min_scale)) {
      return InvalidArgumentError("loss scaler: fp16.min_loss_scale must be finite and > 0, got " +
                                  std::to_string(o.min_scale));
    }
    if (o.scale_window < 1) {
      return InvalidArgumentError("loss scaler: fp16.loss_scale_window must be >= 1, got " +
                                  std::to_string(o.scale_window));
    }
    if (o.delayed_shift < 1) {
      return InvalidArgumentError("loss scaler: fp16.hysteresis must be >= 1, got " +
                                  std::to_string(o.delayed_shift));
    }
    if (!(o.scale_factor > 1) || !std::isfinite(o.scale_factor)) {
      return InvalidArgumentError("loss scaler: scale factor must be finite and > 1");
    }
  }
  return LossScaler(o);
}

Status LossScaler::Update(bool overflow) {
  if (!options_.dynamic) {
    ++iter_;  // a static scale never changes; the caller still skips overflowing steps
    return OkStatus();
  }
  if (overflow) {
    if (options_.delayed_shift == 1 || hysteresis_ == 1) {
      if (scale_ == options_.min_scale && options_.raise_error_at_min_scale) {
        return FailedPreconditionError(
            "loss scaler: gradients overflowed with the loss scale already at its minimum (" +
            std::to_string(scale_) +
            "); the run cannot continue in fp16 (lower fp16.min_loss_scale, or train in bf16)");
      }
      const double next = std::max(scale_ / options_.scale_factor, options_.min_scale);
      STRATA_LOG(kInfo, "loss_scaler") << "overflow: skipping step, loss scale " << scale_ << " -> " << next;
      scale_ = next;
    } else {
      STRATA_LOG(kInfo, "loss_scaler") << "overflow: skipping step, loss scale " << scale_
                                       << " kept, hysteresis " << hysteresis_ << " -> " << hysteresis_ - 1;
      --hysteresis_;
    }
    last_overflow_iter_ = iter_;
  } else {
    if (options_.consecutive_hysteresis) hysteresis_ = options_.delayed_shift;
    bool grow;
    if (options_.legacy_window_rule) {
      grow = (iter_ - last_overflow_iter_) % options_.scale_window == 0;
    } else {
      const int64_t stable = iter_ - last_overflow_iter_ - 1;
      grow = stable > 0 && stable % options_.scale_window == 0;
    }
    if (grow) {
      if (!options_.consecutive_hysteresis) hysteresis_ = options_.delayed_shift;
      scale_ *= options_.scale_factor;
    }
  }
  ++iter_;
  return OkStatus();
}

}  // namespace strata
