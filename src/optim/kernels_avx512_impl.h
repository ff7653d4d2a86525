// AVX-512 kernel bodies, included by kernels_avx512.cc and kernels_avx512bf16.cc, which
// are compiled with different flags. Only intrinsics and functions of this header are
// called here (no out-of-line helpers shared with other translation units, which the
// linker could replace by a copy compiled for another ISA). STRATA_AVX512_BF16_INSN selects VCVTNEPS2BF16 for
// the bf16 copy. 16 floats per vector; tails use masked loads and stores.
#pragma once

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*() and trip a false
// -Wmaybe-uninitialized after inlining (GCC bug 105593); only these kernel files are affected.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstdint>

#include "optim/kernels.h"

// Distinct namespaces for the two translation units: their inline functions are
// compiled with different flags and must never be merged by the linker.
#ifdef STRATA_AVX512_BF16_INSN
#define STRATA_AVX512_NS avx512bf16
#else
#define STRATA_AVX512_NS avx512
#endif

namespace strata::optim::STRATA_AVX512_NS {

template <DType G>
inline __m512 LoadGrad16(const void* g, size_t i, __mmask16 k) {
  if constexpr (G == DType::kF32) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(g) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const uint16_t*>(g) + i);
    if constexpr (G == DType::kBf16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// fp32 -> bf16 with integer arithmetic: round to nearest even, NaN -> quiet NaN.
inline __m256i ToBf16x16Int(__m512 p) {
  const __m512i x = _mm512_castps_si512(p);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i r =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i abs = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
  const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, qnan));
}

inline __m256i ToBf16x16(__m512 p) {
#ifdef STRATA_AVX512_BF16_INSN
  // VCVTNEPS2BF16 rounds to nearest even and quiets NaNs exactly like FloatToBf16, but
  // flushes subnormal inputs to zero; those lanes (rare) take the integer path.
  __m256i r = reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(p));
  const __m512i x = _mm512_castps_si512(p);
  const __mmask16 zero_exp = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7f800000));
  const __mmask16 subnormal = _mm512_mask_test_epi32_mask(zero_exp, x, _mm512_set1_epi32(0x007fffff));
  if (subnormal != 0) r = _mm256_mask_blend_epi16(subnormal, r, ToBf16x16Int(p));
  return r;
#else
  return ToBf16x16Int(p);
#endif
}

// O: 0 none, 1 bf16, 2 fp16. L2: Adam decay; W: AdamW decay.
template <DType G, int O, bool L2, bool W>
inline void Step16(const AdamConsts& c, float* p, float* m, float* v, const void* g, void* out, size_t i,
                   __mmask16 k) {
  __m512 gi = _mm512_mul_ps(LoadGrad16<G>(g, i, k), _mm512_set1_ps(c.grad_scale));
  __m512 pi = _mm512_maskz_loadu_ps(k, p + i);
  if constexpr (L2) gi = _mm512_fmadd_ps(_mm512_set1_ps(c.l2), pi, gi);
  const __m512 mi = _mm512_fmadd_ps(_mm512_set1_ps(c.beta1), _mm512_maskz_loadu_ps(k, m + i),
                                    _mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta1), gi));
  const __m512 vi = _mm512_fmadd_ps(_mm512_set1_ps(c.beta2), _mm512_maskz_loadu_ps(k, v + i),
                                    _mm512_mul_ps(_mm512_set1_ps(c.one_minus_beta2), _mm512_mul_ps(gi, gi)));
  const __m512 denom =
      _mm512_fmadd_ps(_mm512_sqrt_ps(vi), _mm512_set1_ps(c.inv_sqrt_bc2), _mm512_set1_ps(c.eps));
  if constexpr (W) pi = _mm512_mul_ps(pi, _mm512_set1_ps(c.decay));
  pi = _mm512_fnmadd_ps(_mm512_set1_ps(c.step_size), _mm512_div_ps(mi, denom), pi);
  _mm512_mask_storeu_ps(m + i, k, mi);
  _mm512_mask_storeu_ps(v + i, k, vi);
  _mm512_mask_storeu_ps(p + i, k, pi);
  if constexpr (O == 1) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + i, k, ToBf16x16(pi));
  } else if constexpr (O == 2) {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(out) + i, k,
                             _mm512_cvtps_ph(pi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <DType G, int O, bool L2, bool W>
void AdamLoop(const AdamConsts& consts, float* p, float* m, float* v, const void* g, void* out, size_t b,
              size_t e) {
  // A local copy: the stores through p, m, v could alias the caller's AdamConsts, which
  // would make the compiler reload (and re-broadcast) every constant after each store.
  const AdamConsts c = consts;
  size_t i = b;
  for (; i + 16 <= e; i += 16) Step16<G, O, L2, W>(c, p, m, v, g, out, i, 0xffff);
  if (i < e) Step16<G, O, L2, W>(c, p, m, v, g, out, i, static_cast<__mmask16>((1u << (e - i)) - 1));
}

template <DType G, int O>
void AdamDispatchMode(const AdamConsts& c, float* p, float* m, float* v, const void* g, void* out, size_t b,
                      size_t e) {
  if (c.l2 != 0.0f) {
    AdamLoop<G, O, true, false>(c, p, m, v, g, out, b, e);
  } else if (c.decay != 1.0f) {
    AdamLoop<G, O, false, true>(c, p, m, v, g, out, b, e);
  } else {
    AdamLoop<G, O, false, false>(c, p, m, v, g, out, b, e);
  }
}

template <DType G>
void AdamDispatchOut(const AdamConsts& c, float* p, float* m, float* v, const void* g, Copy16 out, size_t b,
                     size_t e) {
  if (out.data == nullptr) {
    AdamDispatchMode<G, 0>(c, p, m, v, g, nullptr, b, e);
  } else if (out.type == DType::kBf16) {
    AdamDispatchMode<G, 1>(c, p, m, v, g, out.data, b, e);
  } else {
    AdamDispatchMode<G, 2>(c, p, m, v, g, out.data, b, e);
  }
}

inline void Adam(const AdamConsts& c, float* p, float* m, float* v, GradView g, Copy16 out, size_t b,
                 size_t e) {
  switch (g.type) {
    case DType::kF32: return AdamDispatchOut<DType::kF32>(c, p, m, v, g.data, out, b, e);
    case DType::kBf16: return AdamDispatchOut<DType::kBf16>(c, p, m, v, g.data, out, b, e);
    case DType::kFp16: return AdamDispatchOut<DType::kFp16>(c, p, m, v, g.data, out, b, e);
  }
}

template <DType G>
void StatsLoop(const void* g, size_t b, size_t e, double* sum_sq, bool* bad) {
  __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
  __mmask16 nonfinite = 0;
  const __m512i exp_mask = _mm512_set1_epi32(0x7f800000);
  for (size_t i = b; i < e; i += 16) {
    const __mmask16 k = e - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (e - i)) - 1);
    const __m512 x = LoadGrad16<G>(g, i, k);  // masked-off lanes are 0: finite, adds nothing
    const __m512i xe = _mm512_and_si512(_mm512_castps_si512(x), exp_mask);
    nonfinite |= _mm512_cmpeq_epi32_mask(xe, exp_mask);
    const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    acc0 = _mm512_fmadd_pd(lo, lo, acc0);
    acc1 = _mm512_fmadd_pd(hi, hi, acc1);
  }
  *sum_sq += _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
  *bad = *bad || nonfinite != 0;
}

inline void Stats(GradView g, size_t b, size_t e, double* sum_sq, bool* bad) {
  switch (g.type) {
    case DType::kF32: return StatsLoop<DType::kF32>(g.data, b, e, sum_sq, bad);
    case DType::kBf16: return StatsLoop<DType::kBf16>(g.data, b, e, sum_sq, bad);
    case DType::kFp16: return StatsLoop<DType::kFp16>(g.data, b, e, sum_sq, bad);
  }
}

inline void Traffic(float* p, float* m, float* v, const float* g, void* out16, size_t b, size_t e) {
  auto* o = static_cast<uint16_t*>(out16);
  for (size_t i = b; i < e; i += 16) {
    const __mmask16 k = e - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (e - i)) - 1);
    __m512 a = _mm512_maskz_loadu_ps(k, p + i), bm = _mm512_maskz_loadu_ps(k, m + i);
    __m512 cv = _mm512_maskz_loadu_ps(k, v + i), d = _mm512_maskz_loadu_ps(k, g + i);
    asm volatile("" : "+v"(a), "+v"(bm), "+v"(cv), "+v"(d));  // stores must not be elided
    _mm512_mask_storeu_ps(p + i, k, a);
    _mm512_mask_storeu_ps(m + i, k, bm);
    _mm512_mask_storeu_ps(v + i, k, cv);
    if (o != nullptr) _mm256_mask_storeu_epi16(o + i, k, _mm512_cvtepi32_epi16(_mm512_castps_si512(d)));
  }
}

}  // namespace strata::optim::STRATA_AVX512_NS
