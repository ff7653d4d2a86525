// Portable kernels: plain C++ in fp32, the fallback on CPUs without AVX2 and the
// "scalar" ISA of STRATA_ADAM_ISA. (The compiler may still use SSE2 for them.)
#include <cmath>
#include <cstdint>
#include <cstring>

#include "optim/kernels.h"

namespace strata::optim {
namespace {

template <DType G>
inline float LoadGrad(const void* g, size_t i) {
  if constexpr (G == DType::kF32) {
    return static_cast<const float*>(g)[i];
  } else if constexpr (G == DType::kBf16) {
    return Bf16ToFloat(static_cast<const Bf16*>(g)[i]);
  } else {
    return Fp16ToFloat(static_cast<const Fp16*>(g)[i]);
  }
}

// O: 0 none, 1 bf16, 2 fp16.
template <DType G, int O, bool L2>
void AdamLoop(const AdamConsts& c, float* __restrict p, float* __restrict m, float* __restrict v,
              const void* g, void* out, size_t begin, size_t end) {
  for (size_t i = begin; i < end; ++i) {
    float gi = LoadGrad<G>(g, i) * c.grad_scale;
    if constexpr (L2) gi = gi + c.l2 * p[i];
    const float mi = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * (gi * gi);
    const float denom = std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps;
    const float pi = p[i] * c.decay - c.step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if constexpr (O == 1) static_cast<Bf16*>(out)[i] = FloatToBf16(pi);
    if constexpr (O == 2) static_cast<Fp16*>(out)[i] = FloatToFp16(pi);
  }
}

template <DType G, int O>
void AdamDispatchL2(const AdamConsts& c, float* p, float* m, float* v, const void* g, void* out, size_t b,
                    size_t e) {
  if (c.l2 != 0.0f) {
    AdamLoop<G, O, true>(c, p, m, v, g, out, b, e);
  } else {
    AdamLoop<G, O, false>(c, p, m, v, g, out, b, e);
  }
}

template <DType G>
void AdamDispatchOut(const AdamConsts& c, float* p, float* m, float* v, const void* g, Copy16 out, size_t b,
                     size_t e) {
  if (out.data == nullptr) {
    AdamDispatchL2<G, 0>(c, p, m, v, g, nullptr, b, e);
  } else if (out.type == DType::kBf16) {
    AdamDispatchL2<G, 1>(c, p, m, v, g, out.data, b, e);
  } else {
    AdamDispatchL2<G, 2>(c, p, m, v, g, out.data, b, e);
  }
}

void AdamScalar(const AdamConsts& c, float* p, float* m, float* v, GradView g, Copy16 out, size_t b,
                size_t e) {
  switch (g.type) {
    case DType::kF32: return AdamDispatchOut<DType::kF32>(c, p, m, v, g.data, out, b, e);
    case DType::kBf16: return AdamDispatchOut<DType::kBf16>(c, p, m, v, g.data, out, b, e);
    case DType::kFp16: return AdamDispatchOut<DType::kFp16>(c, p, m, v, g.data, out, b, e);
  }
}

template <DType G>
void StatsLoop(const void* g, size_t b, size_t e, double* sum_sq, bool* bad) {
  double s = 0;
  bool nonfinite = false;
  for (size_t i = b; i < e; ++i) {
    const float x = LoadGrad<G>(g, i);
    nonfinite |= !std::isfinite(x);
    s += static_cast<double>(x) * x;
  }
  *sum_sq += s;
  *bad = *bad || nonfinite;
}

void StatsScalar(GradView g, size_t b, size_t e, double* sum_sq, bool* bad) {
  switch (g.type) {
    case DType::kF32: return StatsLoop<DType::kF32>(g.data, b, e, sum_sq, bad);
    case DType::kBf16: return StatsLoop<DType::kBf16>(g.data, b, e, sum_sq, bad);
    case DType::kFp16: return StatsLoop<DType::kFp16>(g.data, b, e, sum_sq, bad);
  }
}

void TrafficScalar(float* p, float* m, float* v, const float* g, void* out16, size_t b, size_t e) {
  auto* o = static_cast<uint16_t*>(out16);
  for (size_t i = b; i < e; ++i) {
    uint32_t x[4];
    std::memcpy(&x[0], &p[i], 4);
    std::memcpy(&x[1], &m[i], 4);
    std::memcpy(&x[2], &v[i], 4);
    std::memcpy(&x[3], &g[i], 4);
    // Keeps the compiler from dropping the stores of unchanged values.
    asm volatile("" : "+r"(x[0]), "+r"(x[1]), "+r"(x[2]), "+r"(x[3]));
    std::memcpy(&p[i], &x[0], 4);
    std::memcpy(&m[i], &x[1], 4);
    std::memcpy(&v[i], &x[2], 4);
    if (o != nullptr) o[i] = static_cast<uint16_t>(x[3]);
  }
}

}  // namespace

const Kernels& ScalarKernels() {
  static const Kernels k{&AdamScalar, &StatsScalar, &TrafficScalar};
  return k;
}

}  // namespace strata::optim
