// Google Benchmark microbenchmarks of the CPU optimizer kernels on one thread, L2- and
// DRAM-sized spans: each ISA path (fp32 / bf16 grads, with the bf16 copy), the naive
// -fmath-errno loop, the traffic-only limit pass, and the grad-stats pass. The
// user-facing, multi-threaded figures are `strata bench adam`.
#include <benchmark/benchmark.h>
#include <oneapi/tbb/task_arena.h>

#include <random>
#include <vector>

#include "optim/bench_support.h"
#include "strata/adam.h"
#include "strata/cpu_isa.h"
#include "strata/grad_stats.h"

namespace strata {
namespace {

struct Data {
  explicit Data(size_t n) : p(n), m(n), v(n), g(n), g16(n), out(n) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      p[i] = u(rng);
      m[i] = 0.01f * u(rng);
      v[i] = 1e-4f * (1 + u(rng));
      g[i] = u(rng);
      g16[i] = FloatToBf16(g[i]);
    }
  }
  std::vector<float> p, m, v, g;
  std::vector<Bf16> g16, out;
};

tbb::task_arena& OneThread() {
  static tbb::task_arena arena(1);
  return arena;
}

void SetCounters(benchmark::State& state, size_t n, double bytes_per_param) {
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * bytes_per_param));
}

void BM_Adam(benchmark::State& state, CpuIsa isa, DType grad) {
  if (!CpuSupports(isa)) {
    state.SkipWithError("this CPU lacks the ISA");
    return;
  }
  const size_t n = static_cast<size_t>(state.range(0));
  Data d(n);
  AdamParams a;
  a.weight_decay = 0.01f;
  const GradView g = grad == DType::kF32 ? GradView{d.g.data(), grad} : GradView{d.g16.data(), grad};
  for (auto _ : state) {
    Status s = AdamStepWithIsa(isa, a, d.p.data(), d.m.data(), d.v.data(), g, n, {d.out.data(), DType::kBf16},
                               &OneThread());
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  SetCounters(state, n, grad == DType::kF32 ? 30 : 28);
}

void BM_Naive(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  Data d(n);
  AdamParams a;
  a.weight_decay = 0.01f;
  for (auto _ : state) {
    optim::AdamStepNaive(a, d.p.data(), d.m.data(), d.v.data(), d.g.data(), d.out.data(), n, &OneThread());
    benchmark::ClobberMemory();
  }
  SetCounters(state, n, 30);
}

void BM_Limit(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  Data d(n);
  for (auto _ : state) {
    Status s = optim::AdamTrafficPass(BestCpuIsa(), d.p.data(), d.m.data(), d.v.data(), d.g.data(),
                                      d.out.data(), n, &OneThread());
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
    benchmark::ClobberMemory();
  }
  SetCounters(state, n, 30);
}

void BM_GradStats(benchmark::State& state, CpuIsa isa) {
  if (!CpuSupports(isa)) {
    state.SkipWithError("this CPU lacks the ISA");
    return;
  }
  const size_t n = static_cast<size_t>(state.range(0));
  Data d(n);
  for (auto _ : state) {
    Result<GradStats> r = ComputeGradStatsWithIsa(isa, {d.g.data(), DType::kF32}, n, &OneThread());
    benchmark::DoNotOptimize(r);
  }
  SetCounters(state, n, 4);
}

// 64Ki params (~2 MB of state: cache) and 16Mi params (~500 MB: DRAM).
// Wall time: the work runs on the arena's worker thread, not the benchmark thread.
#define STRATA_SIZES ->Arg(1 << 16)->Arg(1 << 24)->Unit(benchmark::kMillisecond)->UseRealTime()
BENCHMARK_CAPTURE(BM_Adam, scalar_f32, CpuIsa::kScalar, DType::kF32) STRATA_SIZES;
BENCHMARK_CAPTURE(BM_Adam, avx2_f32, CpuIsa::kAvx2, DType::kF32) STRATA_SIZES;
BENCHMARK_CAPTURE(BM_Adam, avx512_f32, CpuIsa::kAvx512, DType::kF32) STRATA_SIZES;
BENCHMARK_CAPTURE(BM_Adam, avx512bf16_f32, CpuIsa::kAvx512Bf16, DType::kF32) STRATA_SIZES;
BENCHMARK_CAPTURE(BM_Adam, avx512bf16_bf16, CpuIsa::kAvx512Bf16, DType::kBf16) STRATA_SIZES;
BENCHMARK(BM_Naive) STRATA_SIZES;
BENCHMARK(BM_Limit) STRATA_SIZES;
BENCHMARK_CAPTURE(BM_GradStats, scalar, CpuIsa::kScalar) STRATA_SIZES;
BENCHMARK_CAPTURE(BM_GradStats, avx512, CpuIsa::kAvx512) STRATA_SIZES;

}  // namespace
}  // namespace strata
