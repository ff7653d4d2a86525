#include "model/vector_tanh.h"

#include <immintrin.h>

#include <cmath>

// glibc's vector variants (x86_64 vector function ABI: 'e' AVX-512, 'd' AVX2).
extern "C" __m512 _ZGVeN16v_tanhf(__m512);
extern "C" __m256 _ZGVdN8v_tanhf(__m256);

namespace strata::model {
namespace {

__attribute__((target("avx512f"))) int64_t TanhAvx512(float* t, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(t + i, _ZGVeN16v_tanhf(_mm512_loadu_ps(t + i)));
  return i;
}

__attribute__((target("avx2"))) int64_t TanhAvx2(float* t, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(t + i, _ZGVdN8v_tanhf(_mm256_loadu_ps(t + i)));
  return i;
}

// The widest the CPU and the OS support, decided once.
enum class Width { kScalar, kAvx2, kAvx512 };
Width Widest() {
  static const Width w = __builtin_cpu_supports("avx512f") ? Width::kAvx512
                         : __builtin_cpu_supports("avx2")  ? Width::kAvx2
                                                           : Width::kScalar;
  return w;
}

}  // namespace

void TanhInPlace(float* t, int64_t n) {
  int64_t done = 0;
  switch (Widest()) {
    case Width::kAvx512: done = TanhAvx512(t, n); break;
    case Width::kAvx2: done = TanhAvx2(t, n); break;
    case Width::kScalar: break;
  }
  for (int64_t i = done; i < n; ++i) t[i] = std::tanh(t[i]);
}

}  // namespace strata::model
