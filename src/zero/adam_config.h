// The Adam hyper-parameters a config asks for (DeepSpeed's optimizer block), as the engine
// and every reference it is tested against read them.
#pragma once

#include "strata/adam.h"
#include "strata/config.h"

namespace strata::zero {

// lr, betas, eps, weight decay and AdamW from config.optimizer; step 1, grad_scale 1.
inline AdamParams AdamFromConfig(const Config& config) {
  AdamParams adam;
  adam.lr = static_cast<float>(config.optimizer.lr);
  adam.beta1 = static_cast<float>(config.optimizer.beta1);
  adam.beta2 = static_cast<float>(config.optimizer.beta2);
  adam.eps = static_cast<float>(config.optimizer.eps);
  adam.weight_decay = static_cast<float>(config.optimizer.weight_decay);
  adam.adamw = config.optimizer.type == OptimizerType::kAdamW;
  adam.step = 1;
  return adam;
}

}  // namespace strata::zero
