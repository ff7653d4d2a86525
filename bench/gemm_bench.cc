// Google Benchmark of fp32 matrix products on the GPT's shapes: strata's built-in kernel
// beside the BLAS libraries Debian packages, the figures behind model::Gemm's library
// (docs/benchmarks.md, "CPU matrix products: the BLAS choice").
//
// One source, one executable per library (bench/CMakeLists.txt), because OpenBLAS and
// BLIS both define cblas_sgemm and so cannot share a process:
//   gemm_bench                 builtin: src/model/gemm.cc's kernel; Gemm: model::Gemm as
//                              configured (STRATA_BLAS); both on oneTBB threads
//   gemm_bench_<library>       lib: one call on the library's own threads; tiles: the
//                              library single-threaded on model::Gemm's oneTBB tile grid
//                              (src/model/gemm_tiles.h), the way strata would run it
// The products are the ones Gemm sees, in its row-major C = A B form (LinearForward and
// LinearBackward transpose x, dy or W first): for each Linear (in -> out) over `rows`
// token rows: fwd [rows, in] x [in, out], dx [rows, out] x [out, in], dW [out, rows] x
// [rows, in]; attention runs every (sequence, head) of the micro-batch in parallel, each
// head's 64-row blocks in series, as src/model/gpt_kernels.cc does.
#include <benchmark/benchmark.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "model/gemm_tiles.h"

#if defined(GEMM_BENCH_CBLAS)
#include <cblas.h>
#if defined(GEMM_BENCH_BLIS)
#include <blis.h>
#else
extern "C" void openblas_set_num_threads(int);
#endif
#elif defined(GEMM_BENCH_DNNL)
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#else
#include <immintrin.h>

#include "strata/mlp_kernels.h"
#endif

namespace strata::model {
namespace {

using GemmFn = std::function<void(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                                  const float* b, int64_t ldb, float* c, int64_t ldc)>;

// One way to run a product: `set_threads` is called (on the benchmark's thread) before
// timing; `tbb` says whether `gemm` runs on a oneTBB arena of that many threads.
struct Impl {
  std::string name;
  bool tbb;
  std::function<void(int)> set_threads;
  GemmFn gemm;
};

#if defined(GEMM_BENCH_CBLAS) || defined(GEMM_BENCH_DNNL)
void LibThreads(int threads) {
#if defined(GEMM_BENCH_BLIS)
  bli_thread_set_num_threads(threads);
#elif defined(GEMM_BENCH_CBLAS)
  openblas_set_num_threads(threads);
#else
  omp_set_num_threads(threads);  // oneDNN's Debian build runs on OpenMP
#endif
}

void LibGemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
             float* c, int64_t ldc) {
#if defined(GEMM_BENCH_CBLAS)
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
#else
  omp_set_num_threads(1);  // per thread: a oneTBB worker calling must not start a team
  dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
#endif
}

// One call on the library's own threads (set by LibThreads).
void OwnThreads(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                float* c, int64_t ldc) {
#if defined(GEMM_BENCH_CBLAS)
  LibGemm(m, n, k, a, lda, b, ldb, c, ldc);
#else
  // The team size is the calling thread's OpenMP setting (LibThreads).
  dnnl_sgemm('N', 'N', m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
#endif
}

std::vector<Impl> Impls() {
  auto tiled = [](int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
                  float* c, int64_t ldc) {
    ForEachGemmTile(m, n, PlanGemmTiles(m, n, k), [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
      LibGemm(i1 - i0, j1 - j0, k, a + i0 * lda, lda, b + j0, ldb, c + i0 * ldc + j0, ldc);
    });
  };
  return {{"lib", false, LibThreads, OwnThreads}, {"tiles", true, [](int) { LibThreads(1); }, tiled}};
}
#else
std::vector<Impl> Impls() {
  return {{"builtin", true, [](int) {},
           [](int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc) { GemmBuiltin(m, n, k, a, lda, b, ldb, c, ldc, false); }},
          {"Gemm", true, [](int) {},
           [](int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
              float* c, int64_t ldc) { Gemm(m, n, k, a, lda, b, ldb, c, ldc, false); }}};
}
#endif

std::vector<float> Values(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
  return v;
}

// Runs body() under `threads` threads of `impl` and reports GFLOP/s of `flops` per body().
void Run(benchmark::State& state, const Impl& impl, double flops, const std::function<void()>& body) {
  const int threads = static_cast<int>(state.range(0));
  impl.set_threads(threads);
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism, impl.tbb ? threads : 1);
  tbb::task_arena arena(impl.tbb ? threads : 1);
  arena.execute([&] {
    body();  // warm: first touch, the library's buffers
    for (auto _ : state) {
      body();
      benchmark::ClobberMemory();
    }
  });
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

struct Gpt {
  int64_t channels, heads, rows, seq, vocab;
  std::string Name() const { return "C" + std::to_string(channels) + "_R" + std::to_string(rows); }
};

// fwd, dx and dW of a Linear in -> out.
void RegisterLinear(const Gpt& g, const std::string& layer, int64_t in, int64_t out, const Impl& impl) {
  struct Product {
    const char* pass;
    int64_t m, n, k;
  };
  for (const Product& p :
       {Product{"fwd", g.rows, out, in}, Product{"dx", g.rows, in, out}, Product{"dW", out, in, g.rows}}) {
    const std::string name = layer + "." + p.pass + "/" + g.Name() + "/" + impl.name;
    benchmark::RegisterBenchmark(name.c_str(),
                                 [p, impl](benchmark::State& state) {
                                   const std::vector<float> a = Values(p.m * p.k, 1),
                                                            b = Values(p.k * p.n, 2);
                                   std::vector<float> c(static_cast<size_t>(p.m * p.n));
                                   Run(state, impl, 2.0 * p.m * p.n * p.k, [&] {
                                     impl.gemm(p.m, p.n, p.k, a.data(), p.k, b.data(), p.n, c.data(), p.n);
                                   });
                                 })
        ->Arg(1)
        ->Arg(2)
        ->ArgName("threads")
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
}

// The attention products of one head (gpt_kernels.cc's AttentionHead{Forward,Backward}
// without the softmax and transposes), q, k, v at leading dimension 3C; null `gemm` only
// counts. Forward per 64-row block: scores and att v; the backward: the same two forms
// (dscores, dq), then the two dv / dk products over the keys from the block on.
double AttentionHead(const Gpt& g, bool backward, const GemmFn& gemm, const float* q, const float* kt,
                     const float* v, float* att, float* out) {
  const int64_t t = g.seq, hs = g.channels / g.heads, ld = 3 * g.channels, c = g.channels, block = 64;
  double flops = 0;
  for (int64_t i0 = 0; i0 < t; i0 += block) {
    const int64_t i1 = std::min(t, i0 + block);
    flops += 2 * 2.0 * (i1 - i0) * i1 * hs;
    if (gemm) {
      gemm(i1 - i0, i1, hs, q + i0 * ld, ld, kt, t, att + i0 * t, t);
      gemm(i1 - i0, hs, i1, att + i0 * t, t, v, ld, out + i0 * c, c);
    }
    if (!backward) continue;
    flops += 2 * 2.0 * (i1 - i0) * hs * (t - i0);
    if (gemm) {
      for (int r = 0; r < 2; ++r)
        gemm(i1 - i0, hs, t - i0, att + i0 * t + i0, t, q + i0 * ld, ld, out + i0 * c, c);
    }
  }
  return flops;
}

void RegisterAttention(const Gpt& g, bool backward, const Impl& impl) {
  const std::string name = std::string(backward ? "attn.bwd" : "attn.fwd") + "/" + g.Name() + "/" + impl.name;
  benchmark::RegisterBenchmark(
      name.c_str(),
      [g, backward, impl](benchmark::State& state) {
        const int64_t batch = g.rows / g.seq, hs = g.channels / g.heads, t = g.seq;
        const std::vector<float> qkv = Values(g.rows * 3 * g.channels, 3), kt = Values(hs * t, 4);
        std::vector<float> att(static_cast<size_t>(batch * g.heads * t * t)), out(g.rows * g.channels);
        const double flops = batch * g.heads *
                             AttentionHead(g, backward, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr);
        Run(state, impl, flops, [&] {
          tbb::parallel_for(int64_t{0}, batch * g.heads, [&](int64_t bh) {
            const int64_t b = bh / g.heads, h = bh % g.heads;
            const float* q = qkv.data() + b * t * 3 * g.channels + h * hs;
            tbb::this_task_arena::isolate([&] {
              AttentionHead(g, backward, impl.gemm, q, kt.data(), q + 2 * g.channels, att.data() + bh * t * t,
                            out.data() + b * t * g.channels + h * hs);
            });
          });
        });
      })
      ->Arg(1)
      ->Arg(2)
      ->ArgName("threads")
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

#if !defined(GEMM_BENCH_CBLAS) && !defined(GEMM_BENCH_DNNL)
// The machine's peak: independent FMA chains in registers (12 accumulators cover the
// latency), per thread, on `threads` threads at once. 2 FLOP per lane per FMA.
__attribute__((target("avx2,fma"))) float FmaChains256(int64_t iters) {
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-7f);
  __m256 acc[12];
  for (__m256& v : acc) v = _mm256_set1_ps(1.0f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], x, y);
  }
  float out[8], sum = 0;
  for (__m256& v : acc) {
    _mm256_storeu_ps(out, v);
    sum += out[0];
  }
  return sum;
}

__attribute__((target("avx512f"))) float FmaChains512(int64_t iters) {
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-7f);
  __m512 acc[12];
  for (__m512& v : acc) v = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(acc[j], x, y);
  }
  float out[16], sum = 0;
  for (__m512& v : acc) {
    _mm512_storeu_ps(out, v);
    sum += out[0];
  }
  return sum;
}

template <int kBits>
void BM_PeakFma(benchmark::State& state) {
  const bool ok = kBits == 512 ? __builtin_cpu_supports("avx512f") : __builtin_cpu_supports("fma");
  if (!ok) return state.SkipWithError("this CPU lacks the ISA");
  const int threads = static_cast<int>(state.range(0));
  const int64_t iters = 1 << 22;
  std::atomic<double> sink{0};
  for (auto _ : state) {
    std::vector<std::thread> pool;
    for (int i = 0; i < threads; ++i) {
      pool.emplace_back([&] { sink = sink + (kBits == 512 ? FmaChains512(iters) : FmaChains256(iters)); });
    }
    for (std::thread& th : pool) th.join();
  }
  benchmark::DoNotOptimize(sink.load());
  const double flops = 2.0 * (kBits / 32) * 12 * static_cast<double>(iters) * threads;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_PeakFma<256>)->Name("peak.fma/avx2")->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime();
BENCHMARK(BM_PeakFma<512>)->Name("peak.fma/avx512")->Arg(1)->Arg(2)->ArgName("threads")->UseRealTime();
#endif

// The default small GPT at both ends of its range (seq 256, vocab 256): n_embd 128 with
// micro-batch 8 (2048 token rows) and n_embd 384 with micro-batch 32 (8192 rows).
bool RegisterAll() {
  for (const Gpt& g : {Gpt{128, 4, 2048, 256, 256}, Gpt{384, 6, 8192, 256, 256}}) {
    const int64_t c = g.channels;
    for (const Impl& impl : Impls()) {
      RegisterLinear(g, "qkv", c, 3 * c, impl);
      RegisterLinear(g, "proj", c, c, impl);
      RegisterLinear(g, "fc", c, 4 * c, impl);
      RegisterLinear(g, "mlp_proj", 4 * c, c, impl);
      RegisterLinear(g, "head", c, g.vocab, impl);
      RegisterAttention(g, false, impl);
      RegisterAttention(g, true, impl);
    }
  }
  return true;
}
const bool registered = RegisterAll();

}  // namespace
}  // namespace strata::model
