// fp32 GEMM: oneDNN (STRATA_BLAS=onednn, the default; gemm_blas.cc) single-threaded on a
// fixed oneTBB tile grid (gemm_tiles.h), or the built-in cache-blocked kernel below
// (STRATA_BLAS=none, and GemmBuiltin always). With either, an element's bits depend only
// on its row of A, its column of B, k and its old value. docs/benchmarks.md has the
// figures of the choice ("CPU matrix products: the BLAS choice").
//
// The built-in kernel's shape: C is cut into fixed tiles (kMc x kNc) that are the unit
// of parallel work, and every element of C is accumulated by one thread in ascending k
// order, so the result does not depend on the number of threads or how oneTBB schedules
// tiles. Inside a tile, a kKc x kNc block of B is packed (zero-padded to whole 16-column
// panels, so that every column goes through the same micro-kernel and has the same
// rounding) and reused by all row blocks; the micro-kernel keeps a 6 x 16 block of C in
// registers (12 accumulators, enough independent FMA chains to cover the FMA latency).
#include <immintrin.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "model/gemm_blas.h"
#include "model/gemm_tiles.h"
#include "strata/mlp_kernels.h"

namespace strata::model {

namespace {

constexpr int64_t kMr = 6, kNr = 16;
constexpr int64_t kMc = 96, kNc = 256, kKc = 256;

std::atomic<bool> force_generic{false};

bool HaveAvx2() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have && !force_generic.load(std::memory_order_relaxed);
}

// c[r, 0:16] = (load ? c : 0) + sum_p a[r, p] * bp[p, 0:16], fused multiply-add.
template <int R>
__attribute__((target("avx2,fma"))) void MicroAvx2(int64_t kc, const float* a, int64_t lda, const float* bp,
                                                   float* c, int64_t ldc, bool load) {
  __m256 acc[R][2];
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    acc[r][0] = load ? _mm256_loadu_ps(c + r * ldc) : _mm256_setzero_ps();
    acc[r][1] = load ? _mm256_loadu_ps(c + r * ldc + 8) : _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_loadu_ps(bp + p * kNr);
    const __m256 b1 = _mm256_loadu_ps(bp + p * kNr + 8);
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      const __m256 av = _mm256_set1_ps(a[r * lda + p]);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    _mm256_storeu_ps(c + r * ldc, acc[r][0]);
    _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
  }
}

// The same without AVX2: separate multiply and add (no FMA assumed).
template <int R>
void MicroGeneric(int64_t kc, const float* a, int64_t lda, const float* bp, float* c, int64_t ldc,
                  bool load) {
  float acc[R][kNr];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kNr; ++j) acc[r][j] = load ? c[r * ldc + j] : 0.0f;
  }
  for (int64_t p = 0; p < kc; ++p) {
    for (int r = 0; r < R; ++r) {
      const float av = a[r * lda + p];
      for (int j = 0; j < kNr; ++j) acc[r][j] += av * bp[p * kNr + j];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kNr; ++j) c[r * ldc + j] = acc[r][j];
  }
}

using MicroFn = void (*)(int64_t, const float*, int64_t, const float*, float*, int64_t, bool);

MicroFn Micro(int rows, bool avx2) {
  switch (rows) {
    case 1: return avx2 ? MicroAvx2<1> : MicroGeneric<1>;
    case 2: return avx2 ? MicroAvx2<2> : MicroGeneric<2>;
    case 3: return avx2 ? MicroAvx2<3> : MicroGeneric<3>;
    case 4: return avx2 ? MicroAvx2<4> : MicroGeneric<4>;
    case 5: return avx2 ? MicroAvx2<5> : MicroGeneric<5>;
    default: return avx2 ? MicroAvx2<6> : MicroGeneric<6>;
  }
}

// One tile of C: rows [i0, i1), columns [j0, j1).
void Tile(int64_t i0, int64_t i1, int64_t j0, int64_t j1, int64_t k, const float* a, int64_t lda,
          const float* b, int64_t ldb, float* c, int64_t ldc, bool accumulate, bool avx2) {
  thread_local std::vector<float> packed;
  const int64_t panels = (j1 - j0 + kNr - 1) / kNr;
  packed.resize(static_cast<size_t>(panels * kNr * kKc));
  float edge[kMr * kNr];
  for (int64_t p0 = 0; p0 < k; p0 += kKc) {
    const int64_t kc = std::min(kKc, k - p0);
    for (int64_t q = 0; q < panels; ++q) {
      const int64_t jj = j0 + q * kNr, width = std::min(kNr, j1 - jj);
      float* dst = packed.data() + q * kNr * kKc;
      for (int64_t p = 0; p < kc; ++p) {
        const float* src = b + (p0 + p) * ldb + jj;
        std::memcpy(dst + p * kNr, src, width * sizeof(float));
        std::fill(dst + p * kNr + width, dst + (p + 1) * kNr, 0.0f);
      }
    }
    const bool load = accumulate || p0 > 0;
    for (int64_t q = 0; q < panels; ++q) {
      const int64_t jj = j0 + q * kNr, width = std::min(kNr, j1 - jj);
      const float* bp = packed.data() + q * kNr * kKc;
      for (int64_t i = i0; i < i1; i += kMr) {
        const int rows = static_cast<int>(std::min(kMr, i1 - i));
        const MicroFn fn = Micro(rows, avx2);
        const float* ap = a + i * lda + p0;
        float* cp = c + i * ldc + jj;
        if (width == kNr) {
          fn(kc, ap, lda, bp, cp, ldc, load);
        } else {
          // Partial panel: run through a 16-wide scratch block so rounding is unchanged.
          for (int r = 0; r < rows; ++r) {
            for (int64_t j = 0; j < kNr; ++j)
              edge[r * kNr + j] = (load && j < width) ? cp[r * ldc + j] : 0.0f;
          }
          fn(kc, ap, lda, bp, edge, kNr, load);
          for (int r = 0; r < rows; ++r) std::memcpy(cp + r * ldc, edge + r * kNr, width * sizeof(float));
        }
      }
    }
  }
}

}  // namespace

bool GemmUsesAvx2() { return HaveAvx2(); }

void ForceGenericGemmForTesting(bool generic) { force_generic.store(generic, std::memory_order_relaxed); }

const char* GemmLibrary() {
  return blas::Linked() && !force_generic.load(std::memory_order_relaxed) ? blas::Name() : "built-in";
}

void GemmBuiltin(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return;
  }
  const bool avx2 = HaveAvx2();
  const int64_t mt = (m + kMc - 1) / kMc, nt = (n + kNc - 1) / kNc;
  auto run = [&](int64_t t) {
    const int64_t ti = t / nt, tj = t % nt;
    Tile(ti * kMc, std::min(m, (ti + 1) * kMc), tj * kNc, std::min(n, (tj + 1) * kNc), k, a, lda, b, ldb, c,
         ldc, accumulate, avx2);
  };
  if (mt * nt == 1) {
    run(0);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, mt * nt, 1), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t t = r.begin(); t < r.end(); ++t) run(t);
  });
}

void Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  if (!blas::Linked() || force_generic.load(std::memory_order_relaxed) || m <= 0 || n <= 0 || k <= 0) {
    GemmBuiltin(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
    return;
  }
  ForEachGemmTile(m, n, PlanGemmTiles(m, n, k), [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    blas::Sgemm(i1 - i0, j1 - j0, k, a + i0 * lda, lda, b + j0, ldb, c + i0 * ldc + j0, ldc, accumulate);
  });
}

void WarmMatrixProducts() {
  // k = 1100 crosses gemm_blas.cc's k chunk twice; 1 x n and m x 1 take its padded path.
  constexpr int64_t kRows = 96, kCols = 96, kDepth = 1100;
  std::vector<float> a(kRows * kDepth, 0.5f), b(kDepth * kCols, 0.25f), c(kRows * kCols, 0.0f);
  for (const bool accumulate : {false, true}) {
    Gemm(kRows, kCols, kDepth, a.data(), kDepth, b.data(), kCols, c.data(), kCols, accumulate);
    Gemm(1, kCols, kDepth, a.data(), kDepth, b.data(), kCols, c.data(), kCols, accumulate);
    Gemm(kRows, 1, kDepth, a.data(), kDepth, b.data(), kCols, c.data(), kCols, accumulate);
    Gemm(8, 8, 8, a.data(), 8, b.data(), 8, c.data(), 8, accumulate);
  }
}

}  // namespace strata::model
