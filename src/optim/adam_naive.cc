// The naive AdamW baseline of `strata bench adam` (see bench_support.h). This file is
// compiled with -fmath-errno on purpose (src/CMakeLists.txt); keep it a plain loop.
#include <cmath>

#include "optim/bench_support.h"
#include "optim/parallel.h"

namespace strata::optim {

void AdamStepNaive(const AdamParams& p, float* master, float* m, float* v, const float* grad, Bf16* out,
                   size_t n, tbb::task_arena* arena) {
  const float bc1 = 1.0f - std::pow(p.beta1, static_cast<float>(p.step));
  const float bc2 = 1.0f - std::pow(p.beta2, static_cast<float>(p.step));
  InArena(arena, [&] {
    ParallelTiles(n, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) {
        const float g = grad[i] * p.grad_scale;
        m[i] = p.beta1 * m[i] + (1.0f - p.beta1) * g;
        v[i] = p.beta2 * v[i] + (1.0f - p.beta2) * g * g;
        master[i] -= p.lr * p.weight_decay * master[i];
        master[i] -= p.lr / bc1 * m[i] / (sqrtf(v[i] / bc2) + p.eps);
        if (out != nullptr) out[i] = FloatToBf16(master[i]);
      }
    });
  });
}

}  // namespace strata::optim
