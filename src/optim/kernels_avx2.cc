// AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c; see src/CMakeLists.txt).
// 8 floats per vector; a tail shorter than 8 goes through the same vector code on
// stack copies, so every element gets bit-identical arithmetic. Only intrinsics and this
// file's internal functions are called (no shared inline helpers the linker could swap
// for a copy compiled without AVX2).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "optim/kernels.h"

namespace strata::optim {
namespace {

template <DType G>
inline __m256 LoadGrad8(const void* g, size_t i) {
  if constexpr (G == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(g) + i);
  } else if constexpr (G == DType::kBf16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(g) + i)));
  }
}

// fp32 -> bf16, round to nearest even, NaN -> quiet NaN (half.h's FloatToBf16).
inline __m128i ToBf16x8(__m256 p) {
  const __m256i x = _mm256_castps_si256(p);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  r = _mm256_blendv_epi8(r, qnan, nan);
  const __m256i packed = _mm256_packus_epi32(r, r);  // per 128-bit lane
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// O: 0 none, 1 bf16, 2 fp16.
template <DType G, int O, bool L2, bool W>
inline void Step8(const AdamConsts& c, float* p, float* m, float* v, const void* g, void* out, size_t i) {
  __m256 gi = _mm256_mul_ps(LoadGrad8<G>(g, i), _mm256_set1_ps(c.grad_scale));
  __m256 pi = _mm256_loadu_ps(p + i);
  if constexpr (L2) gi = _mm256_fmadd_ps(_mm256_set1_ps(c.l2), pi, gi);
  const __m256 mi = _mm256_fmadd_ps(_mm256_set1_ps(c.beta1), _mm256_loadu_ps(m + i),
                                    _mm256_mul_ps(_mm256_set1_ps(c.one_minus_beta1), gi));
  const __m256 vi = _mm256_fmadd_ps(_mm256_set1_ps(c.beta2), _mm256_loadu_ps(v + i),
                                    _mm256_mul_ps(_mm256_set1_ps(c.one_minus_beta2), _mm256_mul_ps(gi, gi)));
  const __m256 denom =
      _mm256_fmadd_ps(_mm256_sqrt_ps(vi), _mm256_set1_ps(c.inv_sqrt_bc2), _mm256_set1_ps(c.eps));
  if constexpr (W) pi = _mm256_mul_ps(pi, _mm256_set1_ps(c.decay));
  pi = _mm256_fnmadd_ps(_mm256_set1_ps(c.step_size), _mm256_div_ps(mi, denom), pi);
  _mm256_storeu_ps(m + i, mi);
  _mm256_storeu_ps(v + i, vi);
  _mm256_storeu_ps(p + i, pi);
  if constexpr (O == 1) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i), ToBf16x8(pi));
  } else if constexpr (O == 2) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + i),
                     _mm256_cvtps_ph(pi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

template <DType G, int O, bool L2, bool W>
void AdamLoop(const AdamConsts& consts, float* p, float* m, float* v, const void* g, void* out, size_t b,
              size_t e) {
  // A local copy: the stores through p, m, v could alias the caller's AdamConsts, which
  // would make the compiler reload (and re-broadcast) every constant after each store.
  const AdamConsts c = consts;
  size_t i = b;
  for (; i + 8 <= e; i += 8) Step8<G, O, L2, W>(c, p, m, v, g, out, i);
  const size_t r = e - i;
  if (r == 0) return;
  constexpr size_t gs = DTypeSize(G);
  alignas(32) float tp[8] = {}, tm[8] = {}, tv[8] = {};
  alignas(32) unsigned char tg[32] = {}, to[16] = {};
  std::memcpy(tp, p + i, r * 4);
  std::memcpy(tm, m + i, r * 4);
  std::memcpy(tv, v + i, r * 4);
  std::memcpy(tg, static_cast<const unsigned char*>(g) + i * gs, r * gs);
  Step8<G, O, L2, W>(c, tp, tm, tv, tg, to, 0);
  std::memcpy(p + i, tp, r * 4);
  std::memcpy(m + i, tm, r * 4);
  std::memcpy(v + i, tv, r * 4);
  if constexpr (O != 0) std::memcpy(static_cast<unsigned char*>(out) + i * 2, to, r * 2);
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

void AdamAvx2(const AdamConsts& c, float* p, float* m, float* v, GradView g, Copy16 out, size_t b, size_t e) {
  switch (g.type) {
    case DType::kF32: return AdamDispatchOut<DType::kF32>(c, p, m, v, g.data, out, b, e);
    case DType::kBf16: return AdamDispatchOut<DType::kBf16>(c, p, m, v, g.data, out, b, e);
    case DType::kFp16: return AdamDispatchOut<DType::kFp16>(c, p, m, v, g.data, out, b, e);
  }
}

inline double HorizontalSum(__m256d a) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

template <DType G>
void StatsLoop(const void* g, size_t b, size_t e, double* sum_sq, bool* bad) {
  __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
  __m256i nonfinite = _mm256_setzero_si256();
  const __m256i exp_mask = _mm256_set1_epi32(0x7f800000);
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 x = LoadGrad8<G>(g, i);
    const __m256i xe = _mm256_and_si256(_mm256_castps_si256(x), exp_mask);
    nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpeq_epi32(xe, exp_mask));
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc0 = _mm256_fmadd_pd(lo, lo, acc0);
    acc1 = _mm256_fmadd_pd(hi, hi, acc1);
  }
  if (i < e) {  // tail through the same vector code on a zero-padded copy
    alignas(32) unsigned char t[32] = {};
    constexpr size_t gs = DTypeSize(G);
    std::memcpy(t, static_cast<const unsigned char*>(g) + i * gs, (e - i) * gs);
    const __m256 x = LoadGrad8<G>(t, 0);
    const __m256i xe = _mm256_and_si256(_mm256_castps_si256(x), exp_mask);
    nonfinite = _mm256_or_si256(nonfinite, _mm256_cmpeq_epi32(xe, exp_mask));
    const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    acc0 = _mm256_fmadd_pd(lo, lo, acc0);
    acc1 = _mm256_fmadd_pd(hi, hi, acc1);
  }
  const double s = HorizontalSum(_mm256_add_pd(acc0, acc1));
  const bool nf = !_mm256_testz_si256(nonfinite, nonfinite);
  *sum_sq += s;
  *bad = *bad || nf;
}

void StatsAvx2(GradView g, size_t b, size_t e, double* sum_sq, bool* bad) {
  switch (g.type) {
    case DType::kF32: return StatsLoop<DType::kF32>(g.data, b, e, sum_sq, bad);
    case DType::kBf16: return StatsLoop<DType::kBf16>(g.data, b, e, sum_sq, bad);
    case DType::kFp16: return StatsLoop<DType::kFp16>(g.data, b, e, sum_sq, bad);
  }
}

void TrafficAvx2(float* p, float* m, float* v, const float* g, void* out16, size_t b, size_t e) {
  auto* o = static_cast<uint16_t*>(out16);
  size_t i = b;
  for (; i + 8 <= e; i += 8) {
    __m256 a = _mm256_loadu_ps(p + i), bm = _mm256_loadu_ps(m + i), cv = _mm256_loadu_ps(v + i);
    __m256 d = _mm256_loadu_ps(g + i);
    asm volatile("" : "+x"(a), "+x"(bm), "+x"(cv), "+x"(d));  // stores must not be elided
    _mm256_storeu_ps(p + i, a);
    _mm256_storeu_ps(m + i, bm);
    _mm256_storeu_ps(v + i, cv);
    if (o != nullptr) {
      const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(d), 16),
                                                 _mm256_srli_epi32(_mm256_castps_si256(d), 16));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                       _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08)));
    }
  }
  for (; i < e; ++i) {  // tail: same traffic, scalar
    uint32_t x[4];
    std::memcpy(&x[0], &p[i], 4);
    std::memcpy(&x[1], &m[i], 4);
    std::memcpy(&x[2], &v[i], 4);
    std::memcpy(&x[3], &g[i], 4);
    asm volatile("" : "+r"(x[0]), "+r"(x[1]), "+r"(x[2]), "+r"(x[3]));
    std::memcpy(&p[i], &x[0], 4);
    std::memcpy(&m[i], &x[1], 4);
    std::memcpy(&v[i], &x[2], 4);
    if (o != nullptr) o[i] = static_cast<uint16_t>(x[3] >> 16);
  }
}

}  // namespace

const Kernels& Avx2Kernels() {
  static const Kernels k{&AdamAvx2, &StatsAvx2, &TrafficAvx2};
  return k;
}

}  // namespace strata::optim
