// The library adapter of model::Gemm: oneDNN's dnnl_sgemm, or nothing (STRATA_BLAS=none).
//
// The library always runs single-threaded here, on whichever oneTBB worker calls;
// gemm.cc cuts a product into tiles (gemm_tiles.h) and runs them in parallel, so oneTBB is
// the only thread pool on the cores (a library pool beside it would spin on the cores the
// Adam step uses) and the bits cannot depend on a thread count. oneDNN (Debian builds it
// on OpenMP) sizes its team from the calling thread's OpenMP setting, which every thread
// has on its own: each call sets it to one for its duration and puts it back.
#include "model/gemm_blas.h"

#include <algorithm>
#include <string>
#include <vector>

#if defined(STRATA_BLAS_ONEDNN)
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

#include "strata/status.h"

namespace strata::model::blas {

#if defined(STRATA_BLAS_ONEDNN)

namespace {

// The widest instructions oneDNN's kernels may use on this CPU (its JIT picks per CPU).
std::string IsaName() {
  const unsigned isa = dnnl_get_effective_cpu_isa();
  auto has = [isa](dnnl_cpu_isa_t x) { return (isa & x) == static_cast<unsigned>(x); };
  return has(dnnl_cpu_isa_avx512_core) ? "AVX-512" : has(dnnl_cpu_isa_avx2) ? "AVX2" : "pre-AVX2";
}

// oneDNN 2.6's sgemm gives an element the same bits whatever the shape of the call and
// wherever the element lies in it (checked on random shapes and sub-products, with and
// without beta = 1, on its AVX-512 kernels), with two exceptions: a one-row or one-column
// product takes a matrix-vector path that sums in another order, and with k > 768 and
// large m and n it cuts k at points that depend on m and n. So k is cut here at fixed
// points and vector products are padded to two rows or columns: an element's bits then
// depend only on its row of A, its column of B, k and its old value. A Linear's row alone
// gets the bits it has in a batch, and Gemm's tile grid does not change any bit.
constexpr int64_t kKChunk = 512;

// One dnnl_sgemm, on the calling thread alone. The caller's OpenMP team size is put back
// afterwards, so that OpenMP code sharing the thread (PyTorch beside the Python module,
// say) keeps its own.
void SgemmCall(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc, bool accumulate) {
  const int caller_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const dnnl_status_t s =
      dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
  omp_set_num_threads(caller_threads);
  STRATA_CHECK_MSG(s == dnnl_success, "Gemm: dnnl_sgemm failed");
}

// c (=|+=) a b with k cut at multiples of kKChunk; each piece adds onto c.
void SgemmChunked(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc, bool accumulate) {
  for (int64_t p0 = 0; p0 < k; p0 += kKChunk) {
    SgemmCall(m, n, std::min(kKChunk, k - p0), a + p0, lda, b + p0 * ldb, ldb, c, ldc, accumulate || p0 > 0);
  }
}

// m == 1 or n == 1: the product padded with a zero row of A / zero column of B, through
// scratch, so that it takes the matrix-matrix path.
void SgemmPadded(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate) {
  const int64_t mp = std::max<int64_t>(m, 2), np = std::max<int64_t>(n, 2);
  thread_local std::vector<float> scratch;
  scratch.assign(static_cast<size_t>((m == 1 ? 2 * k : 0) + (n == 1 ? 2 * k : 0) + mp * np), 0.0f);
  float* next = scratch.data();
  const float* ap = a;
  int64_t ldap = lda;
  if (m == 1) {
    std::copy(a, a + k, next);
    ap = next, ldap = k, next += 2 * k;
  }
  const float* bp = b;
  int64_t ldbp = ldb;
  if (n == 1) {
    for (int64_t p = 0; p < k; ++p) next[2 * p] = b[p * ldb];
    bp = next, ldbp = 2, next += 2 * k;
  }
  float* cp = next;
  if (accumulate) {
    for (int64_t i = 0; i < m; ++i) std::copy(c + i * ldc, c + i * ldc + n, cp + i * np);
  }
  SgemmChunked(mp, np, k, ap, ldap, bp, ldbp, cp, np, accumulate);
  for (int64_t i = 0; i < m; ++i) std::copy(cp + i * np, cp + i * np + n, c + i * ldc);
}

}  // namespace

bool Linked() { return true; }

const char* Name() {
  static const std::string name = [] {
    const dnnl_version_t* v = dnnl_version();
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + " (" + IsaName() + " kernels)";
  }();
  return name.c_str();
}

void Sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
           float* c, int64_t ldc, bool accumulate) {
  if (m == 1 || n == 1) {
    SgemmPadded(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  } else {
    SgemmChunked(m, n, k, a, lda, b, ldb, c, ldc, accumulate);
  }
}

#else  // STRATA_BLAS=none

bool Linked() { return false; }
const char* Name() { return "none"; }
void Sgemm(int64_t, int64_t, int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, bool) {
  STRATA_CHECK_MSG(false, "Gemm: no BLAS linked (STRATA_BLAS=none)");
}

#endif

}  // namespace strata::model::blas
