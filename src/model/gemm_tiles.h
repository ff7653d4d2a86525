// The tile grid on which model::Gemm runs its library (oneDNN): C [m, n] is cut into
// tiles, each computed by one single-threaded call on a oneTBB worker. Shared by
// src/model/gemm.cc and bench/gemm_bench.cc, so that the benchmark times the engine's cut.
//
// Why a grid of our own rather than the library's threads: a BLAS's bits commonly depend
// on how its threads split the matrix (OpenBLAS 0.3.21 gives other bits with 2 threads
// than with 1), while the engine promises the same bits for any thread count; and one
// thread pool (oneTBB) on the cores, where a library pool beside it would spin on the
// cores the Adam step runs on. The cut depends on the shape only, never on the thread
// count, and each piece is one deterministic single-threaded call.
#pragma once

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>

namespace strata::model {

struct GemmTiles {
  int64_t rows = 0, cols = 0;  // size of a full tile
  int64_t row_tiles = 0, col_tiles = 0;
};

// At least kMinTiles tiles when the product is large enough to be worth splitting
// (below kSplitWork multiply-adds a second thread costs more than it saves), and tiles
// no larger than kMaxTile along the side cut first, so that large products give many
// tiles for large machines. The longer side of C is cut first: a tile re-reads its whole
// share of the other operand (a row tile all of B's k x n, a column tile all of A's
// m x k), so cutting rows of a wide dW [C, 4C] would read B eight times over. Rows in
// multiples of 16 and columns in multiples of 64 keep the BLAS's register blocks whole.
// Measured on the GPT's shapes (docs/benchmarks.md).
inline GemmTiles PlanGemmTiles(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMinTiles = 8, kMaxTile = 256, kSplitWork = int64_t{1} << 20;
  if (m * n * k < kSplitWork) return {m, n, 1, 1};
  auto ceil_div = [](int64_t x, int64_t y) { return (x + y - 1) / y; };
  // A piece of `len` for `pieces` pieces: a multiple of `align`, within [lo, hi].
  auto cut = [&](int64_t len, int64_t pieces, int64_t align, int64_t lo, int64_t hi) {
    return std::min(len, std::max(lo, std::min(hi, ceil_div(ceil_div(len, pieces), align) * align)));
  };
  GemmTiles t;
  if (m >= n) {
    t.rows = cut(m, kMinTiles, 16, 32, kMaxTile);
    t.row_tiles = ceil_div(m, t.rows);
    t.cols = cut(n, ceil_div(kMinTiles, t.row_tiles), 64, 128, n);
    t.col_tiles = ceil_div(n, t.cols);
  } else {
    t.cols = cut(n, kMinTiles, 64, 128, 4 * kMaxTile);
    t.col_tiles = ceil_div(n, t.cols);
    t.rows = cut(m, ceil_div(kMinTiles, t.col_tiles), 16, 32, m);
    t.row_tiles = ceil_div(m, t.rows);
  }
  return t;
}

// Calls f(i0, i1, j0, j1) for every tile [i0, i1) x [j0, j1) of the plan, in parallel on
// the caller's oneTBB arena (a single tile runs on the calling thread).
template <class F>
void ForEachGemmTile(int64_t m, int64_t n, const GemmTiles& t, F&& f) {
  auto run = [&](int64_t tile) {
    const int64_t ti = tile / t.col_tiles, tj = tile % t.col_tiles;
    f(ti * t.rows, std::min(m, (ti + 1) * t.rows), tj * t.cols, std::min(n, (tj + 1) * t.cols));
  };
  const int64_t tiles = t.row_tiles * t.col_tiles;
  if (tiles == 1) {
    run(0);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, tiles, 1), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t tile = r.begin(); tile < r.end(); ++tile) run(tile);
  });
}

}  // namespace strata::model
