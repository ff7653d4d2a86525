// The plain reference Adam: one thread, double precision throughout, one rounding to
// fp32 per stored value. Every fast path is tested against it.
#include <cmath>

#include "strata/adam.h"

namespace strata {

Status AdamStepReference(const AdamParams& p, float* master, float* m, float* v, GradView grad, size_t n,
                         Copy16 out) {
  STRATA_RETURN_IF_ERROR(ValidateAdam(p, master, m, v, grad, n, out));
  const double t = static_cast<double>(p.step);
  const double b1 = p.beta1, b2 = p.beta2;
  const double bc1 = p.bias_correction ? 1.0 - std::pow(b1, t) : 1.0;
  const double bc2 = p.bias_correction ? 1.0 - std::pow(b2, t) : 1.0;
  const double lr = p.lr, wd = p.weight_decay, eps = p.eps;
  for (size_t i = 0; i < n; ++i) {
    double g;
    switch (grad.type) {
      case DType::kF32: g = static_cast<const float*>(grad.data)[i]; break;
      case DType::kBf16: g = Bf16ToFloat(static_cast<const Bf16*>(grad.data)[i]); break;
      default: g = Fp16ToFloat(static_cast<const Fp16*>(grad.data)[i]); break;
    }
    g *= static_cast<double>(p.grad_scale);
    double param = master[i];
    if (!p.adamw) g += wd * param;
    const double mi = b1 * m[i] + (1.0 - b1) * g;
    const double vi = b2 * v[i] + (1.0 - b2) * g * g;
    if (p.adamw) param *= 1.0 - lr * wd;
    param -= (lr / bc1) * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    master[i] = static_cast<float>(param);
    if (out.data != nullptr) {
      if (out.type == DType::kBf16) {
        static_cast<Bf16*>(out.data)[i] = FloatToBf16(master[i]);
      } else {
        static_cast<Fp16*>(out.data)[i] = FloatToFp16(master[i]);
      }
    }
  }
  return OkStatus();
}

}  // namespace strata
