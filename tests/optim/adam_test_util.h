// Test helpers for the Adam kernels: random state, per-element tolerances derived from
// fp32 precision, and comparison of a fast path's results with the double reference.
//
// Tolerance derivation (one step from the same state). Each fp32 operation rounds with
// relative error at most u = 2^-24. The fast paths evaluate
//   g' = g*scale (+ l2*p);  m' = b1*m + (1-b1)*g';  v' = b2*v + (1-b2)*g'^2;
//   d = sqrt(v')*c2 + eps;  p' = p*decay - s*(m'/d)
// with at most 3 roundings per quantity before it is stored, so, with magnitudes
//   G = |g*scale| + |l2*p|,  M = b1|m| + (1-b1)G,  V = b2 v + (1-b2)G^2,  U = s*M/d_ref:
//   |m' - m_ref| <= K u M,   |v' - v_ref| <= K u V,
//   |p' - p_ref| <= K u (|p| + U)   (the update's error: m' (K u M), sqrt/d/div a few u)
// where the reference is exact to fp32 rounding (it computes in double and rounds once).
// K = 8 covers the at most ~6 roundings of the longest chain with margin. Cancellation
// (b1 m = -(1-b1) g') is why the bounds use M, the sum of magnitudes, not |m'|.
// Subnormal results lose absolute precision 2^-150 per rounding: a floor of
// 8 * denorm_min is added to m and v, and s * that / d to p.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "strata/adam.h"
#include "strata/half.h"

namespace strata::testing {

inline constexpr double kU = 1.0 / (1 << 24);
inline constexpr double kK = 8;
inline constexpr double kFloor = 8 * std::numeric_limits<float>::denorm_min();

enum class Magnitude { kNormal, kLarge, kTiny, kZero, kSubnormalParams };
inline const char* MagnitudeName(Magnitude m) {
  switch (m) {
    case Magnitude::kNormal: return "normal";
    case Magnitude::kLarge: return "large";
    case Magnitude::kTiny: return "tiny";
    case Magnitude::kZero: return "zero";
    case Magnitude::kSubnormalParams: return "subnormal_params";
  }
  return "?";
}

// State of one tensor, with an offset so that pointers can be misaligned on purpose.
struct AdamState {
  std::vector<float> p, m, v, g32;
  std::vector<uint16_t> g16, out16;
  size_t n = 0, off = 0;
  float* P() { return p.data() + off; }
  float* M() { return m.data() + off; }
  float* V() { return v.data() + off; }
  GradView Grad(DType t) const {
    return t == DType::kF32 ? GradView{g32.data() + off, t} : GradView{g16.data() + off, t};
  }
  Copy16 Out(bool on, DType t) { return on ? Copy16{out16.data() + off, t} : Copy16{}; }
};

// grad_scale for 16-bit grads: they are stored pre-multiplied by 1/scale (as a loss
// scale would) so fp16 stays in range; the kernels multiply back by `scale`.
inline AdamState MakeState(size_t n, size_t off, Magnitude mag, uint64_t seed) {
  AdamState s;
  s.n = n;
  s.off = off;
  const size_t len = n + off;
  s.p.assign(len, 0);
  s.m.assign(len, 0);
  s.v.assign(len, 0);
  s.g32.assign(len, 0);
  s.g16.assign(len, 0);
  s.out16.assign(len, 0xdead);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  float ps = 1, gs = 1, ms = 0.1f, vs = 0.01f;
  switch (mag) {
    case Magnitude::kNormal: break;
    case Magnitude::kLarge:
      ps = 1e30f;
      gs = 1e15f;
      ms = 1e14f;
      vs = 1e29f;
      break;
    case Magnitude::kTiny:
      ps = 1e-30f;
      gs = 1e-30f;
      ms = 1e-31f;
      vs = 1e-38f;
      break;
    case Magnitude::kZero: ps = gs = ms = vs = 0; break;
    case Magnitude::kSubnormalParams:
      ps = 1e-38f;
      gs = ms = vs = 0;
      break;  // p stays subnormal
  }
  for (size_t i = off; i < len; ++i) {
    s.p[i] = ps * u(rng);
    s.m[i] = ms * u(rng);
    s.v[i] = vs * std::fabs(u(rng));
    s.g32[i] = gs * u(rng);
  }
  return s;
}

// Fills g16 from g32 as `t` values of g32 * pre (pre = 1 / grad_scale).
inline void Make16BitGrads(AdamState& s, DType t, float pre) {
  for (size_t i = s.off; i < s.off + s.n; ++i) {
    const float x = s.g32[i] * pre;
    s.g16[i] = t == DType::kBf16 ? FloatToBf16(x).bits : FloatToFp16(x).bits;
  }
}

inline double GradValue(const AdamState& s, DType t, size_t i) {
  if (t == DType::kF32) return s.g32[s.off + i];
  if (t == DType::kBf16) return Bf16ToFloat(Bf16{s.g16[s.off + i]});
  return Fp16ToFloat(Fp16{s.g16[s.off + i]});
}

struct Tolerance {
  std::vector<double> m, v, p;
};

// One-step tolerances from the state before the step (see the header comment).
inline Tolerance StepTolerance(const AdamParams& a, const AdamState& before, DType gt) {
  Tolerance t;
  const size_t n = before.n;
  t.m.resize(n);
  t.v.resize(n);
  t.p.resize(n);
  const double bc1 = a.bias_correction ? 1 - std::pow(double(a.beta1), double(a.step)) : 1;
  const double bc2 = a.bias_correction ? 1 - std::pow(double(a.beta2), double(a.step)) : 1;
  const double s = a.lr / bc1;
  for (size_t i = 0; i < n; ++i) {
    const double p = before.p[before.off + i];
    const double G =
        std::fabs(GradValue(before, gt, i) * a.grad_scale) + (a.adamw ? 0 : a.weight_decay * std::fabs(p));
    const double M = a.beta1 * std::fabs(double(before.m[before.off + i])) + (1 - double(a.beta1)) * G;
    const double V = a.beta2 * double(before.v[before.off + i]) + (1 - double(a.beta2)) * G * G;
    // A lower bound of the denominator (v' >= b2 v), so U bounds the update from above.
    const double dmin = std::sqrt(a.beta2 * double(before.v[before.off + i])) / std::sqrt(bc2) + a.eps;
    const double U = s * M / dmin;
    t.m[i] = kK * kU * M + kFloor;
    t.v[i] = kK * kU * V + kFloor;
    t.p[i] = kK * kU * (std::fabs(p) + U) + s * kFloor / a.eps;
  }
  return t;
}

// Compares values; non-finite reference values must be matched exactly in class.
inline ::testing::AssertionResult Near(const char* what, const float* got, const float* want,
                                       const std::vector<double>& tol, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double a = got[i], b = want[i];
    if (!std::isfinite(b)) {
      if (std::isnan(b) ? std::isnan(a) : a == b) continue;
    } else if (std::fabs(a - b) <= tol[i]) {
      continue;
    }
    return ::testing::AssertionFailure() << what << "[" << i << "] = " << a << ", reference " << b
                                         << ", |diff| " << std::fabs(a - b) << " > tolerance " << tol[i];
  }
  return ::testing::AssertionSuccess();
}

// The 16-bit copy must be exactly the rounding of the fp32 result the same call wrote.
inline ::testing::AssertionResult CopyExact(const AdamState& s, DType t) {
  for (size_t i = 0; i < s.n; ++i) {
    const float p = s.p[s.off + i];
    const uint16_t want = t == DType::kBf16 ? FloatToBf16(p).bits : FloatToFp16(p).bits;
    if (s.out16[s.off + i] != want) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "0x%04x, want 0x%04x", s.out16[s.off + i], want);
      return ::testing::AssertionFailure()
             << DTypeName(t) << " copy[" << i << "] = " << buf << " for p = " << p;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace strata::testing
