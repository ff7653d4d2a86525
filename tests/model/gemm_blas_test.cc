// model::Gemm on the configured BLAS (STRATA_BLAS): the bits it promises, on shapes that
// take every path of src/model/gemm_blas.cc (vector products, k cut into pieces, the tile
// grid), and agreement with the built-in kernel to fp32 rounding.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "strata/mlp_kernels.h"

namespace strata::model {
namespace {

std::vector<float> Random(int64_t n, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

// Whether an element's bits depend only on its row of A, its column of B, k and its old
// value (gemm_blas.cc makes oneDNN so; the built-in kernel is so by construction).
bool ShapeInvariant() {
  const std::string lib = GemmLibrary();
  return lib.rfind("oneDNN", 0) == 0 || lib == "built-in";
}

struct Shape {
  int64_t m, n, k;
  bool accumulate;
};

// Small and large products, k below and above gemm_blas.cc's 512-wide pieces.
const std::vector<Shape>& Shapes() {
  static const std::vector<Shape> s = {
      {1, 1, 7, false},     {1, 300, 129, true},     {300, 1, 700, false},   {37, 45, 1, false},
      {130, 70, 513, true}, {2048, 384, 128, false}, {384, 128, 2048, true}, {900, 1500, 1100, false}};
  return s;
}

TEST(GemmBlasTest, SubProductsRowsAndColumnsGiveTheBitsOfTheWhole) {
  if (!ShapeInvariant()) GTEST_SKIP() << GemmLibrary() << " does not promise shape-independent bits";
  std::mt19937_64 rng(1);
  std::vector<Shape> shapes = Shapes();
  // Tiles of 1500 x 1024 x 1100: at that size oneDNN's own cut of k depends on m and n,
  // which gemm_blas.cc's fixed pieces of k override.
  shapes.push_back({1500, 8192, 1100, false});
  for (const Shape& s : shapes) {
    const std::vector<float> a = Random(s.m * s.k, rng), b = Random(s.k * s.n, rng),
                             c0 = Random(s.m * s.n, rng);
    std::vector<float> c = c0;
    Gemm(s.m, s.n, s.k, a.data(), s.k, b.data(), s.n, c.data(), s.n, s.accumulate);
    // One row, one column, a block: each computed alone, in a buffer of its own width.
    std::uniform_int_distribution<int64_t> row(0, s.m - 1), col(0, s.n - 1);
    for (int piece = 0; piece < 3; ++piece) {
      const int64_t i0 = row(rng), j0 = col(rng);
      const int64_t i1 = piece == 0 ? i0 + 1 : std::min(s.m, i0 + 70);
      const int64_t j1 = piece == 1 ? j0 + 1 : std::min(s.n, j0 + 90);
      const int64_t pm = i1 - i0, pn = j1 - j0;
      std::vector<float> part(static_cast<size_t>(pm * pn));
      for (int64_t i = 0; i < pm; ++i)
        std::memcpy(&part[i * pn], &c0[(i0 + i) * s.n + j0], pn * sizeof(float));
      Gemm(pm, pn, s.k, a.data() + i0 * s.k, s.k, b.data() + j0, s.n, part.data(), pn, s.accumulate);
      for (int64_t i = 0; i < pm; ++i) {
        ASSERT_EQ(0, std::memcmp(&part[i * pn], &c[(i0 + i) * s.n + j0], pn * sizeof(float)))
            << s.m << "x" << s.n << "x" << s.k << ": the " << pm << "x" << pn << " piece at (" << i0 << ", "
            << j0 << "), its row " << i;
      }
    }
  }
}

TEST(GemmBlasTest, BitIdenticalForAnyThreadCount) {
  std::mt19937_64 rng(2);
  // Allow more workers than this machine's cores, so that 3 and 8 really differ from 2.
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  for (const Shape& s : Shapes()) {
    const std::vector<float> a = Random(s.m * s.k, rng), b = Random(s.k * s.n, rng),
                             c0 = Random(s.m * s.n, rng);
    auto run = [&](int threads) {
      std::vector<float> c = c0;
      tbb::task_arena(threads).execute(
          [&] { Gemm(s.m, s.n, s.k, a.data(), s.k, b.data(), s.n, c.data(), s.n, s.accumulate); });
      return c;
    };
    const std::vector<float> one = run(1);
    for (int threads : {2, 3, 8}) {
      EXPECT_EQ(0, std::memcmp(one.data(), run(threads).data(), one.size() * sizeof(float)))
          << s.m << "x" << s.n << "x" << s.k << ", " << threads << " threads";
    }
  }
}

TEST(GemmBlasTest, AgreesWithTheBuiltinKernelToRounding) {
  std::mt19937_64 rng(3);
  for (const Shape& s : Shapes()) {
    const std::vector<float> a = Random(s.m * s.k, rng), b = Random(s.k * s.n, rng),
                             c0 = Random(s.m * s.n, rng);
    std::vector<float> c = c0, ref = c0;
    Gemm(s.m, s.n, s.k, a.data(), s.k, b.data(), s.n, c.data(), s.n, s.accumulate);
    GemmBuiltin(s.m, s.n, s.k, a.data(), s.k, b.data(), s.n, ref.data(), s.n, s.accumulate);
    // The same k + 1 terms of size <= 1 summed in fp32 in other orders: for random signs
    // each sum is off by about sqrt(k) 2^-24 times its size; this leaves a wide margin.
    const double tol = 4e-7 * (s.k + 1);
    for (size_t i = 0; i < c.size(); ++i) {
      ASSERT_NEAR(c[i], ref[i], tol) << GemmLibrary() << ", " << s.m << "x" << s.n << "x" << s.k << " at "
                                     << i;
    }
  }
}

}  // namespace
}  // namespace strata::model
