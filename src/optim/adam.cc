// AdamStep: validation, ISA dispatch and the tiling over oneTBB threads.
#include "strata/adam.h"

#include <oneapi/tbb/parallel_for.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "optim/kernels.h"
#include "optim/parallel.h"

namespace strata {
namespace {

bool FiniteNonNeg(float x) { return std::isfinite(x) && x >= 0.0f; }

Status CheckTensor(const AdamTensor& t, size_t index) {
  if (t.params == nullptr)
    return InvalidArgumentError("AdamStep: tensor " + std::to_string(index) + " has no params");
  Status s = ValidateAdam(*t.params, t.master, t.m, t.v, t.grad, t.n, t.out);
  if (!s.ok()) return s.WithContext("tensor " + std::to_string(index));
  return OkStatus();
}

}  // namespace

namespace optim {
AdamConsts MakeAdamConsts(const AdamParams& p) {
  const double t = static_cast<double>(p.step);
  const double bc1 = p.bias_correction ? 1.0 - std::pow(static_cast<double>(p.beta1), t) : 1.0;
  const double bc2 = p.bias_correction ? 1.0 - std::pow(static_cast<double>(p.beta2), t) : 1.0;
  AdamConsts c;
  c.beta1 = p.beta1;
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.beta2 = p.beta2;
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.eps = p.eps;
  c.step_size = static_cast<float>(p.lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  c.decay = p.adamw ? static_cast<float>(1.0 - static_cast<double>(p.lr) * p.weight_decay) : 1.0f;
  c.l2 = p.adamw ? 0.0f : p.weight_decay;
  c.grad_scale = p.grad_scale;
  return c;
}
}  // namespace optim

Status ValidateAdam(const AdamParams& p, const float* master, const float* m, const float* v, GradView grad,
                    size_t n, Copy16 out) {
  if (p.step < 1)
    return InvalidArgumentError("AdamStep: step must be >= 1 (counted from 1), got " +
                                std::to_string(p.step));
  if (!FiniteNonNeg(p.lr) || !FiniteNonNeg(p.weight_decay) || !FiniteNonNeg(p.eps) ||
      !std::isfinite(p.grad_scale)) {
    return InvalidArgumentError(
        "AdamStep: lr, eps, weight_decay must be finite and >= 0 and grad_scale finite");
  }
  if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f) || !(p.beta2 >= 0.0f && p.beta2 < 1.0f)) {
    return InvalidArgumentError("AdamStep: beta1 and beta2 must be in [0, 1), got " +
                                std::to_string(p.beta1) + ", " + std::to_string(p.beta2));
  }
  if (out.data != nullptr && out.type == DType::kF32) {
    return InvalidArgumentError("AdamStep: the 16-bit copy must be bf16 or fp16, not f32");
  }
  if (n > 0 && (master == nullptr || m == nullptr || v == nullptr || grad.data == nullptr)) {
    return InvalidArgumentError("AdamStep: null master/m/v/grad pointer with n = " + std::to_string(n));
  }
  return OkStatus();
}

Status AdamStepWithIsa(CpuIsa isa, const AdamParams& params, float* master, float* m, float* v, GradView grad,
                       size_t n, Copy16 out, tbb::task_arena* arena) {
  STRATA_RETURN_IF_ERROR(ValidateAdam(params, master, m, v, grad, n, out));
  if (!CpuSupports(isa)) {
    return UnavailableError("AdamStep: CPU instruction set " + std::string(CpuIsaName(isa)) +
                            " is not available on this CPU");
  }
  if (n == 0) return OkStatus();
  const optim::AdamConsts c = optim::MakeAdamConsts(params);
  const optim::AdamKernelFn kernel = optim::KernelsFor(isa).adam;
  optim::InArena(arena, [&] {
    optim::ParallelTiles(n, [&](size_t b, size_t e) { kernel(c, master, m, v, grad, out, b, e); });
  });
  return OkStatus();
}

Status AdamStep(const AdamParams& params, float* master, float* m, float* v, GradView grad, size_t n,
                Copy16 out, tbb::task_arena* arena) {
  STRATA_ASSIGN_OR_RETURN(const CpuIsa isa, ActiveCpuIsa());
  return AdamStepWithIsa(isa, params, master, m, v, grad, n, out, arena);
}

Status AdamStep(std::span<const AdamTensor> tensors, tbb::task_arena* arena) {
  for (size_t i = 0; i < tensors.size(); ++i) STRATA_RETURN_IF_ERROR(CheckTensor(tensors[i], i));
  STRATA_ASSIGN_OR_RETURN(const CpuIsa isa, ActiveCpuIsa());
  const optim::AdamKernelFn kernel = optim::KernelsFor(isa).adam;
  // Nested parallelism: tensors in parallel, each tensor's tiles in parallel; oneTBB's
  // work stealing balances small and large tensors without a precomputed tile table.
  optim::InArena(arena, [&] {
    tbb::parallel_for(size_t{0}, tensors.size(), [&](size_t i) {
      const AdamTensor& t = tensors[i];
      const optim::AdamConsts c = optim::MakeAdamConsts(*t.params);
      optim::ParallelTiles(t.n,
                           [&](size_t b, size_t e) { kernel(c, t.master, t.m, t.v, t.grad, t.out, b, e); });
    });
  });
  return OkStatus();
}

}  // namespace strata
