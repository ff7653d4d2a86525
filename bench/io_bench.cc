// Microbenchmarks of the IoEngine: per-request overhead (4 KiB reads at queue depth 1,
// hot in the page-cache-free O_DIRECT path), streaming reads at a queue depth, and the
// cost of the XXH3 checksum NvmeStore computes per segment. The file lives in
// $STRATA_BENCH_DIR (default /tmp) and is removed at exit.
#include <benchmark/benchmark.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "strata/io.h"

namespace {

using strata::IoBackendKind;
using strata::IoEngine;
using strata::IoEngineOptions;

constexpr uint64_t kFileSize = 256ull << 20;

struct Fixture {
  std::string path;
  char* buf = nullptr;
  Fixture() {
    const char* dir = std::getenv("STRATA_BENCH_DIR");
    path = std::string(dir ? dir : "/tmp") + "/strata-io-bench." + std::to_string(getpid());
    buf = static_cast<char*>(std::aligned_alloc(4096, 64ull << 20));
    std::memset(buf, 1, 64ull << 20);
    IoEngineOptions o;
    o.block_size = 8 << 20;
    auto e = std::move(IoEngine::Create(o)).value();
    int f = e->RegisterFile(path, true).value();
    for (uint64_t off = 0; off < kFileSize; off += 64ull << 20) {
      if (!e->Write(f, off, 64ull << 20, buf)->Wait().ok()) std::abort();
    }
  }
  ~Fixture() {
    std::free(buf);
    std::filesystem::remove(path);
  }
};

Fixture& Fix() {
  static Fixture f;
  return f;
}

std::unique_ptr<IoEngine> Engine(IoBackendKind kind, uint64_t bs, int qd, int* file) {
  IoEngineOptions o;
  o.backend = kind;
  o.block_size = bs;
  o.queue_depth = qd;
  auto e = std::move(IoEngine::Create(o)).value();
  *file = e->RegisterFile(Fix().path, false).value();
  strata::IoBufferRegion r{Fix().buf, 64ull << 20};
  e->RegisterBuffers({&r, 1}).IgnoreError();  // a benchmark of the plain path is still valid
  return e;
}

void BM_Read4KQD1(benchmark::State& state) {
  int f;
  auto e = Engine(static_cast<IoBackendKind>(state.range(0)), 1 << 20, 1, &f);
  uint64_t off = 0;
  for (auto _ : state) {
    if (!e->Read(f, off, 4096, Fix().buf)->Wait().ok()) state.SkipWithError("read failed");
    off = (off + (1 << 20)) % kFileSize;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 4096);
  state.SetLabel(std::string(e->backend_name()));
}
BENCHMARK(BM_Read4KQD1)->Arg(int(IoBackendKind::kIoUring))->Arg(int(IoBackendKind::kPsync))->UseRealTime();

// One request of 64 MiB split into block_size pieces, queue_depth in flight.
void BM_StreamRead(benchmark::State& state) {
  int f;
  const uint64_t bs = uint64_t(state.range(0)) << 20;
  auto e = Engine(IoBackendKind::kAuto, bs, int(state.range(1)), &f);
  uint64_t off = 0;
  for (auto _ : state) {
    if (!e->Read(f, off, 64ull << 20, Fix().buf)->Wait().ok()) state.SkipWithError("read failed");
    off = (off + (64ull << 20)) % kFileSize;
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * (64ll << 20));
  state.counters["fixed_pieces"] = double(e->stats().fixed_pieces);
}
BENCHMARK(BM_StreamRead)->Args({1, 32})->Args({4, 16})->Args({8, 8})->UseRealTime()->Unit(benchmark::kMillisecond);

void BM_Xxh3(benchmark::State& state) {
  const uint64_t n = uint64_t(state.range(0));
  uint64_t h = 0;
  for (auto _ : state) {
    h ^= XXH3_64bits(Fix().buf, n);
    benchmark::DoNotOptimize(h);
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n));
}
BENCHMARK(BM_Xxh3)->Arg(1 << 20)->Arg(8 << 20);

}  // namespace
