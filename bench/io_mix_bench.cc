// How the swap disk takes reads and writes together, which is what bounds a training
// step with the optimizer and parameters on NVMe (docs/benchmarks.md, "Training step").
// Each iteration is one pass over a 1 GiB file through the IoEngine (1 MiB requests at
// depth 32 unless STRATA_BENCH_BLOCK_KIB / STRATA_BENCH_DEPTH say otherwise; buffers in
// the host arena, as the engine's): all reads, all writes, or half
// read and half written, either interleaved request by request (phase 0) or in phases
// of N MiB of one direction, each phase queued once the previous one is done. Compare
// the mixed rows with the additive rate of the same run, 1 / (0.5 / read + 0.5 / write).
// The file lives in $STRATA_BENCH_DIR (default /tmp) and is removed at exit.
//
//   build/bench/io_mix_bench --benchmark_repetitions=6 --benchmark_enable_random_interleaving=true
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "strata/host_arena.h"
#include "strata/io.h"

namespace {

using strata::IoOp;
using strata::IoRequest;

// Request size and depth: the engine's defaults, or STRATA_BENCH_BLOCK_KIB and
// STRATA_BENCH_DEPTH to see how the mixing cost depends on them.
// A set variable must be a whole number, positive and a multiple of `multiple`; anything
// else stops the bench naming it, rather than running a pass nobody asked for.
uint64_t EnvOr(const char* name, uint64_t fallback, uint64_t multiple = 1) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end != '\0' || n == 0 || n % multiple != 0 || n > (1ull << 20)) {
    std::fprintf(stderr, "io_mix_bench: %s=%s: want a whole number from %llu to %llu, a multiple of %llu\n", name,
                 v, static_cast<unsigned long long>(multiple), 1ull << 20, static_cast<unsigned long long>(multiple));
    std::exit(2);
  }
  return n;
}
// KiB: O_DIRECT requests are whole 4 KiB blocks.
const uint64_t kBlock = EnvOr("STRATA_BENCH_BLOCK_KIB", 1024, 4) << 10;
const uint64_t kBlocks = (1ull << 30) / kBlock;  // 1 GiB
const int kDepth = static_cast<int>(EnvOr("STRATA_BENCH_DEPTH", 32));

struct Fixture {
  std::string path;
  std::unique_ptr<strata::IoEngine> io;
  std::unique_ptr<strata::HostArena> arena;
  int file = -1;
  Fixture() {
    const char* dir = std::getenv("STRATA_BENCH_DIR");
    path = std::string(dir ? dir : "/tmp") + "/strata-io-mix-bench." + std::to_string(getpid());
    strata::IoEngineOptions o;
    o.block_size = kBlock;
    o.queue_depth = kDepth;
    io = std::move(strata::IoEngine::Create(o)).value();
    strata::HostArenaOptions ao;
    ao.bytes = 2 * kDepth * kBlock;  // reads land in the first half, writes leave from the second
    arena = std::move(strata::HostArena::Create(ao)).value();
    strata::IoBufferRegion region{arena->base(), arena->size()};
    io->RegisterBuffers({&region, 1}).IgnoreError();  // slower without, still a valid pass
    file = io->RegisterFile(path, /*create=*/true).value();
    Pass(Writes(0, kBlocks));  // fresh extents are slower to write: measure overwrites
  }
  ~Fixture() {
    (void)io->UnregisterFile(file);
    std::filesystem::remove(path);
  }
  IoRequest Request(IoOp op, uint64_t block) const {
    IoRequest r;
    r.op = op;
    r.file = file;
    r.offset = block * kBlock;
    r.length = kBlock;
    r.buffer =
        static_cast<char*>(arena->base()) + (block % kDepth + (op == IoOp::kRead ? 0 : kDepth)) * kBlock;
    return r;
  }
  std::vector<IoRequest> Run(IoOp op, uint64_t first, uint64_t n) const {
    std::vector<IoRequest> v;
    for (uint64_t b = first; b < first + n; ++b) v.push_back(Request(op, b));
    return v;
  }
  std::vector<IoRequest> Writes(uint64_t first, uint64_t n) const { return Run(IoOp::kWrite, first, n); }
  // Submits one batch and waits for all of it.
  void Pass(const std::vector<IoRequest>& batch) const {
    if (!io->Submit(batch).value().Wait().ok()) std::abort();
  }
};

Fixture& Fix() {
  static Fixture f;
  return f;
}

void Finish(benchmark::State& state) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBlocks * kBlock));
}

void BM_Read(benchmark::State& state) {
  Fix();  // the first call creates and fills the file, outside the timed loop
  for (auto _ : state) Fix().Pass(Fix().Run(IoOp::kRead, 0, kBlocks));
  Finish(state);
}

void BM_Write(benchmark::State& state) {
  Fix();
  for (auto _ : state) Fix().Pass(Fix().Writes(0, kBlocks));
  Finish(state);
}

// Reads the first half of the file and writes the second; range(0): phase length in
// MiB, 0 for request-by-request interleaving.
void BM_Mixed(benchmark::State& state) {
  // In requests: at least one for a non-zero phase.
  const uint64_t phase = state.range(0) == 0 ? 0 : std::max<uint64_t>((state.range(0) << 20) / kBlock, 1);
  const uint64_t half = kBlocks / 2;
  Fix();
  for (auto _ : state) {
    if (phase == 0) {
      std::vector<IoRequest> v;
      for (uint64_t i = 0; i < half; ++i) {
        v.push_back(Fix().Request(IoOp::kRead, i));
        v.push_back(Fix().Request(IoOp::kWrite, half + i));
      }
      Fix().Pass(v);
      continue;
    }
    for (uint64_t i = 0; i < half; i += phase) {
      Fix().Pass(Fix().Run(IoOp::kRead, i, std::min(phase, half - i)));
      Fix().Pass(Fix().Writes(half + i, std::min(phase, half - i)));
    }
  }
  Finish(state);
}

BENCHMARK(BM_Read)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Write)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Mixed)->Arg(0)->Arg(16)->Arg(64)->Arg(256)->Iterations(1)->UseRealTime()->Unit(
    benchmark::kMillisecond);

}  // namespace
