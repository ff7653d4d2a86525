// Conversions and the fp32-accumulating reduction (blocked so that GCC vectorizes the
// inner loops; fp16 uses F16C where the CPU has it).
#include "comm/dtype.h"

#include <immintrin.h>

#include <algorithm>

#include "strata/status.h"

namespace strata {

std::string_view ReduceOpName(ReduceOp op) { return op == ReduceOp::kSum ? "sum" : "avg"; }

namespace comm {

float F16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      ++e;
      man <<= 1;
    } while ((man & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x1ffu);  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity (>= 65520)
  if (a < 0x38800000u) {                        // below the smallest normal (2^-14)
    if (a < 0x33000000u) return sign;           // below half the smallest subnormal
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    int shift = 126 - static_cast<int>(a >> 23);  // 14..24 for this range
    uint32_t half = 1u << (shift - 1);
    uint32_t rest = man & ((1u << shift) - 1);
    uint32_t q = man >> shift;
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return sign | static_cast<uint16_t>(r >> 13);
}

namespace {

constexpr size_t kBlock = 512;

template <typename Load>
void SumBlock(int n_in, const void* const* in, size_t base, size_t n, float* acc, Load load) {
  load(in[0], base, n, acc, /*add=*/false);
  for (int k = 1; k < n_in; ++k) load(in[k], base, n, acc, /*add=*/true);
}

// Explicit SSE (baseline x86-64): at -O2 GCC 12 leaves `acc[i] += s[i]` scalar (it
// would need a runtime alias check), which made the fp32 reduce-scatter compute-bound.
// `acc` is 64-byte aligned and blocks are multiples of 8 elements but for the last.
void LoadF32(const void* p, size_t base, size_t n, float* acc, bool add) {
  const float* s = static_cast<const float*>(p) + base;
  if (!add) {
    std::memcpy(acc, s, n * sizeof(float));
    return;
  }
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_store_ps(acc + i, _mm_add_ps(_mm_load_ps(acc + i), _mm_loadu_ps(s + i)));
    _mm_store_ps(acc + i + 4, _mm_add_ps(_mm_load_ps(acc + i + 4), _mm_loadu_ps(s + i + 4)));
  }
  for (; i < n; ++i) acc[i] += s[i];
}

void LoadBf16(const void* p, size_t base, size_t n, float* acc, bool add) {
  const uint16_t* s = static_cast<const uint16_t*>(p) + base;
  if (add) {
    for (size_t i = 0; i < n; ++i) acc[i] += Bf16ToF32(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = Bf16ToF32(s[i]);
  }
}

void LoadF16Scalar(const void* p, size_t base, size_t n, float* acc, bool add) {
  const uint16_t* s = static_cast<const uint16_t*>(p) + base;
  if (add) {
    for (size_t i = 0; i < n; ++i) acc[i] += F16ToF32(s[i]);
  } else {
    for (size_t i = 0; i < n; ++i) acc[i] = F16ToF32(s[i]);
  }
}

void StoreF16Scalar(const float* acc, size_t n, uint16_t* d) {
  for (size_t i = 0; i < n; ++i) d[i] = F32ToF16(acc[i]);
}

__attribute__((target("avx,f16c"))) void LoadF16Fast(const void* p, size_t base, size_t n, float* acc,
                                                     bool add) {
  const uint16_t* s = static_cast<const uint16_t*>(p) + base;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(acc + i));
    _mm256_storeu_ps(acc + i, v);
  }
  LoadF16Scalar(s + i, 0, n - i, acc + i, add);
}

__attribute__((target("avx,f16c"))) void StoreF16Fast(const float* acc, size_t n, uint16_t* d) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(acc + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  StoreF16Scalar(acc + i, n - i, d + i);
}

bool HaveF16c() {
  static const bool have = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return have;
}

}  // namespace

void ReduceInto(DType dtype, int n_in, const void* const* in, void* out, size_t count, int divisor) {
  STRATA_CHECK(n_in >= 1);
  alignas(64) float acc[kBlock];
  const float div_f = static_cast<float>(divisor);
  const bool fast16 = HaveF16c();
  for (size_t base = 0; base < count; base += kBlock) {
    size_t n = std::min(kBlock, count - base);
    switch (dtype) {
      case DType::kF32: SumBlock(n_in, in, base, n, acc, LoadF32); break;
      case DType::kBf16: SumBlock(n_in, in, base, n, acc, LoadBf16); break;
      case DType::kFp16: SumBlock(n_in, in, base, n, acc, fast16 ? LoadF16Fast : LoadF16Scalar); break;
    }
    if (divisor > 1) {
      for (size_t i = 0; i < n; ++i) acc[i] /= div_f;
    }
    switch (dtype) {
      case DType::kF32: std::memcpy(static_cast<float*>(out) + base, acc, n * 4); break;
      case DType::kBf16: {
        uint16_t* d = static_cast<uint16_t*>(out) + base;
        for (size_t i = 0; i < n; ++i) d[i] = F32ToBf16(acc[i]);
        break;
      }
      case DType::kFp16:
        if (fast16) {
          StoreF16Fast(acc, n, static_cast<uint16_t*>(out) + base);
        } else {
          StoreF16Scalar(acc, n, static_cast<uint16_t*>(out) + base);
        }
        break;
    }
  }
}

}  // namespace comm
}  // namespace strata
