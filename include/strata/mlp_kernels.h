// CPU kernels of the MLP: Linear, GELU, losses. Plain C++ on oneTBB threads.
//
// Contract:
//  - Layout: row-major. x [batch, in], weight [out, in], bias [out], y [batch, out].
//  - Parameters (weight, bias) are fp32 or 16-bit (bf16 / fp16, raw uint16 bits) as given
//    by `dtype`; 16-bit values are converted to fp32 on load and all arithmetic accumulates
//    in fp32. Activations and gradients are fp32.
//  - Determinism: every output element is computed by one thread with a fixed summation
//    order (ascending along the reduced dimension, or oneDNN's order for Gemm's products),
//    so results are bit-identical for any thread count and any oneTBB partitioning. They
//    may differ between machines and builds (oneDNN, and the built-in kernel's AVX2 + FMA
//    path, pick their kernels per CPU).
//  - GELU is the tanh approximation (PyTorch's approximate="tanh"):
//        gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
//    The CUDA kernels use the same formula.
//  - Losses are sums over the batch divided by `normaliser` (pass the global batch size,
//    so that gradients of a split batch add up to the gradient of the whole batch):
//        MSE: sum_{b,j} (y - t)^2 / (normaliser * out)
//        CE:  sum_b (logsumexp(y_b) - y_b[label_b]) / normaliser
//  - Threads: any thread may call; calls are independent. The kernels may use the calling
//    thread's scratch buffer (thread_local), so they are reentrant across threads.
//  - Broken preconditions (null pointers, bad labels) abort through STRATA_CHECK.
#pragma once

#include <cstdint>

#include "strata/model.h"

namespace strata::model {

// y = x W^T + b.
void LinearForward(const float* x, int64_t batch, int64_t in, int64_t out, const void* weight,
                   const void* bias, DType dtype, float* y);

// From dy [batch, out]: dx [batch, in] = dy W (skipped when dx is null), dW [out, in] =
// dy^T x, db [out] = sum_b dy. With accumulate, dW and db are added to (dW_old + sum), else
// overwritten. dx is always overwritten.
void LinearBackward(const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                    const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                    bool accumulate);

// GELU's tanh: kScalar is the C library's tanhf, one value at a time (the MLP's, whose
// results the engine's golden tests pin); kVector is glibc's vector tanhf, within 2 ulp of
// it and about 20x faster where the CPU has AVX2 or AVX-512 (the GPT's).
enum class GeluTanh { kScalar, kVector };

void GeluForward(const float* x, int64_t n, float* y, GeluTanh tanh = GeluTanh::kScalar);
// dx = dy * gelu'(x); dx may alias dy.
void GeluBackward(const float* x, const float* dy, int64_t n, float* dx, GeluTanh tanh = GeluTanh::kScalar);

// Returns the loss of this batch (already divided by the normaliser, summed in double in
// sample order) and writes d loss / d y into dy (may be null for evaluation only).
// `targets` [batch, out] for MSE, `labels` [batch] in [0, out) for CE.
double LossForwardBackward(LossKind kind, const float* y, const float* targets, const int32_t* labels,
                           int64_t batch, int64_t out, double normaliser, float* dy);

// C [m, n] (=|+=) A [m, k] B [k, n], all fp32 row-major with leading dimensions lda, ldb,
// ldc; c[i, j] = (accumulate ? c_old : 0) + sum_p a[i, p] b[p, j]. The building block of
// the Linear kernels, exposed for tests and benchmarks.
// It runs on the library chosen at configure time (STRATA_BLAS=onednn, the default;
// GemmLibrary names it), single-threaded on each tile of a grid fixed by the shape, the
// tiles in parallel on oneTBB; with STRATA_BLAS=none, on GemmBuiltin. Either way an
// element's bits depend only on its row of A, its column of B, k and its old value: not
// on the thread count, m, n or where it lies (a row alone gets the bits it has in a
// batch; for oneDNN this is measured on its kernels, which tests/model/gemm_blas_test.cc
// checks). The two sum in different orders, so their bits differ from each other.
void Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate);

// The built-in kernel, whatever Gemm uses: c[i, j] = (accumulate ? c_old : 0) + sum over
// p ascending of a[i, p] b[p, j] (one FMA chain per element on the AVX2 + FMA path), so
// an element's bits depend only on its row of A, its column of B and k.
void GemmBuiltin(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                 float* c, int64_t ldc, bool accumulate);

// What Gemm runs on now, e.g. "oneDNN 2.6.3 (AVX-512 kernels)", or "built-in".
const char* GemmLibrary();

// Runs Gemm once on each of its paths (a matrix product, a one-row and a one-column one,
// k past a chunk; overwrite and accumulate) on small scratch it frees, so that the
// library has generated its kernels (oneDNN's JIT) and paged in its code: what a
// process measures after this is what a training step's products will hold. Any thread.
void WarmMatrixProducts();

// Whether GemmBuiltin uses the AVX2 + FMA micro-kernel on this machine.
bool GemmUsesAvx2();
// For tests: Gemm runs on GemmBuiltin with its plain (non-AVX2) micro-kernel from now on,
// bypassing any BLAS (false: back to automatic). Not for use while kernels run on other
// threads.
void ForceGenericGemmForTesting(bool generic);

// Converts `n` parameters of `dtype` to fp32 (round trip exact for 16-bit values).
void ToFloat(const void* src, DType dtype, int64_t n, float* dst);
// Rounds fp32 to 16-bit, round to nearest even (NaN stays NaN); dtype must be 16-bit.
void FromFloat(const float* src, int64_t n, DType dtype, void* dst);

}  // namespace strata::model
