// The library under model::Gemm (STRATA_BLAS, cmake/StrataBlas.cmake: oneDNN or none).
// Only gemm_blas.cc includes the library's headers.
#pragma once

#include <cstdint>

namespace strata::model::blas {

// Whether a library is linked (false with STRATA_BLAS=none: Gemm keeps its built-in kernel).
bool Linked();

// The library and its kernels, e.g. "oneDNN 2.6.3 (AVX-512 kernels)"; "none" if none.
const char* Name();

// c [m, n] = (accumulate ? c : 0) + a [m, k] b [k, n], row-major, single-threaded on the
// calling thread. An element's bits depend only on its row of a, its column of b, k and
// its old value (see gemm_blas.cc). Only when Linked().
void Sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
           float* c, int64_t ldc, bool accumulate);

}  // namespace strata::model::blas
