// The CPU kernels against double-precision references and finite differences.
#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/reference.h"
#include "strata/half.h"
#include "strata/mlp_kernels.h"

namespace strata::model {
namespace {

using testing::RefGelu;
using testing::RefLinear;

std::vector<float> Random(int64_t n, uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * HashUniform(1234, stream, i);
  return v;
}

std::vector<double> D(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Largest |a - b| relative to the largest |b| (or 1).
double MaxRelErr(const std::vector<float>& a, const std::vector<double>& b) {
  double scale = 1e-30, err = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    scale = std::max(scale, std::abs(b[i]));
    err = std::max(err, std::abs(a[i] - b[i]));
  }
  return err / scale;
}

class GemmTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { ForceGenericGemmForTesting(GetParam()); }
  void TearDown() override { ForceGenericGemmForTesting(false); }
};
// false: the machine's best micro-kernel (AVX2 + FMA where present); true: the plain one.
INSTANTIATE_TEST_SUITE_P(MicroKernels, GemmTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Generic" : "Best");
                         });

TEST_P(GemmTest, MatchesDoubleReferenceOnRaggedShapes) {
  // Shapes that cut the 64 x 256 x 256 tiles and the 4 x 16 micro-tiles unevenly.
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {3, 17, 5},
                         {67, 300, 259},
                         {130, 33, 600},
                         {5, 513, 16}}) {
    const std::vector<float> a = Random(m * k, 1), b = Random(k * n, 2);
    std::vector<float> c(m * n, 0.0f);
    Gemm(m, n, k, a.data(), k, b.data(), n, c.data(), n, false);
    std::vector<double> ref(m * n, 0.0);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        for (int64_t p = 0; p < k; ++p) ref[i * n + j] += static_cast<double>(a[i * k + p]) * b[p * n + j];
      }
    }
    // fp32 accumulation of k terms of size <= 1: error <= k * 2^-24 * sum|terms|, far below.
    EXPECT_LT(MaxRelErr(c, ref), 1e-5) << m << "x" << n << "x" << k;
    // Accumulate mode adds to the old values.
    std::vector<float> c2(m * n, 1.0f);
    Gemm(m, n, k, a.data(), k, b.data(), n, c2.data(), n, true);
    for (double& r : ref) r += 1.0;
    EXPECT_LT(MaxRelErr(c2, ref), 1e-5) << m << "x" << n << "x" << k;
  }
}

TEST_P(GemmTest, LeadingDimensionsAreRespected) {
  const int64_t m = 9, n = 21, k = 13, lda = 20, ldb = 30, ldc = 25;
  const std::vector<float> a = Random(m * lda, 3), b = Random(k * ldb, 4);
  std::vector<float> c(m * ldc, -7.0f);
  Gemm(m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, false);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      if (j >= n) {
        EXPECT_EQ(c[i * ldc + j], -7.0f) << "wrote outside C";
        continue;
      }
      double ref = 0;
      for (int64_t p = 0; p < k; ++p) ref += static_cast<double>(a[i * lda + p]) * b[p * ldb + j];
      EXPECT_NEAR(c[i * ldc + j], ref, 1e-5);
    }
  }
}

TEST(KernelsTest, LinearForwardMatchesReferenceBothShapeForms) {
  // batch < out and batch >= out take different (bit-equivalent) routes.
  for (auto [batch, in, out] : {std::tuple<int64_t, int64_t, int64_t>{3, 37, 70}, {90, 37, 20}}) {
    const std::vector<float> x = Random(batch * in, 5), w = Random(out * in, 6, 0.2f), b = Random(out, 7);
    std::vector<float> y(batch * out);
    LinearForward(x.data(), batch, in, out, w.data(), b.data(), DType::kF32, y.data());
    EXPECT_LT(MaxRelErr(y, RefLinear(D(x), batch, in, out, D(w), D(b))), 1e-6);
  }
}

TEST(KernelsTest, LinearForwardRoutesAreBitIdentical) {
  // Rows of a batch are independent, so computing a row alone (batch 1 < out: the
  // transposed-input route) must give the bits of the same row in a large batch.
  const int64_t batch = 40, in = 300, out = 24;
  const std::vector<float> x = Random(batch * in, 8), w = Random(out * in, 9, 0.1f), b = Random(out, 10);
  std::vector<float> y(batch * out), y1(out);
  LinearForward(x.data(), batch, in, out, w.data(), b.data(), DType::kF32, y.data());
  for (int64_t s : {0, 17, 39}) {
    LinearForward(x.data() + s * in, 1, in, out, w.data(), b.data(), DType::kF32, y1.data());
    EXPECT_EQ(0, std::memcmp(y1.data(), y.data() + s * out, out * sizeof(float))) << "row " << s;
  }
}

// Linear backward against finite differences of L = sum(y * r) in double.
TEST(KernelsTest, LinearBackwardMatchesFiniteDifferences) {
  const int64_t batch = 6, in = 9, out = 5;
  const std::vector<float> x = Random(batch * in, 11), w = Random(out * in, 12, 0.3f), b = Random(out, 13),
                           r = Random(batch * out, 14);
  std::vector<float> dx(batch * in), dw(out * in), db(out);
  LinearBackward(x.data(), r.data(), batch, in, out, w.data(), DType::kF32, dx.data(), dw.data(), db.data(),
                 false);
  auto loss = [&](const std::vector<double>& xd, const std::vector<double>& wd,
                  const std::vector<double>& bd) {
    const std::vector<double> y = RefLinear(xd, batch, in, out, wd, bd);
    double l = 0;
    for (size_t i = 0; i < y.size(); ++i) l += y[i] * r[i];
    return l;
  };
  const double h = 1e-6;
  std::vector<double> xd = D(x), wd = D(w), bd = D(b);
  auto fd = [&](std::vector<double>* which, size_t i) {
    const double keep = (*which)[i];
    (*which)[i] = keep + h;
    const double lp = loss(xd, wd, bd);
    (*which)[i] = keep - h;
    const double lm = loss(xd, wd, bd);
    (*which)[i] = keep;
    return (lp - lm) / (2 * h);
  };
  for (size_t i = 0; i < xd.size(); ++i) EXPECT_NEAR(dx[i], fd(&xd, i), 1e-5) << "dx " << i;
  for (size_t i = 0; i < wd.size(); ++i) EXPECT_NEAR(dw[i], fd(&wd, i), 1e-5) << "dw " << i;
  for (size_t i = 0; i < bd.size(); ++i) EXPECT_NEAR(db[i], fd(&bd, i), 1e-5) << "db " << i;

  // accumulate adds; a null dx skips the input gradient.
  std::vector<float> dw2(out * in, 0.5f), db2(out, 0.25f);
  LinearBackward(x.data(), r.data(), batch, in, out, w.data(), DType::kF32, nullptr, dw2.data(), db2.data(),
                 true);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], dw[i] + 0.5f, 1e-6);
  for (size_t i = 0; i < db.size(); ++i) EXPECT_NEAR(db2[i], db[i] + 0.25f, 1e-6);
}

TEST(KernelsTest, GeluForwardAndBackwardMatchReference) {
  const int64_t n = 2001;
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = -10.0f + 20.0f * static_cast<float>(i) / (n - 1);
  const std::vector<float> dy = Random(n, 15);
  std::vector<float> y(n), dx(n);
  GeluForward(x.data(), n, y.data());
  GeluBackward(x.data(), dy.data(), n, dx.data());
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(y[i], RefGelu(x[i]), 1e-6 * (1 + std::abs(x[i])));
    const double h = 1e-5, d = (RefGelu(x[i] + h) - RefGelu(x[i] - h)) / (2 * h);
    EXPECT_NEAR(dx[i], dy[i] * d, 2e-6) << "x = " << x[i];
  }
  // In place.
  std::vector<float> inplace = dy;
  GeluBackward(x.data(), inplace.data(), n, inplace.data());
  EXPECT_EQ(0, std::memcmp(inplace.data(), dx.data(), n * sizeof(float)));
}

TEST(KernelsTest, LossesMatchFiniteDifferences) {
  const int64_t batch = 5, out = 4;
  const double normaliser = 12;  // e.g. this is part of a global batch of 12
  const std::vector<float> y = Random(batch * out, 16, 2.0f);
  Batch b;
  b.size = batch;
  b.targets = Random(batch * out, 17);
  b.labels = {0, 3, 1, 2, 3};
  for (LossKind kind : {LossKind::kMse, LossKind::kCrossEntropy}) {
    std::vector<float> dy(batch * out);
    const double loss = LossForwardBackward(kind, y.data(), b.targets.data(), b.labels.data(), batch, out,
                                            normaliser, dy.data());
    std::vector<double> yd = D(y);
    EXPECT_NEAR(loss, testing::RefLoss(kind, yd, b, out, normaliser), 1e-6);
    for (size_t i = 0; i < yd.size(); ++i) {
      const double h = 1e-6, keep = yd[i];
      yd[i] = keep + h;
      const double lp = testing::RefLoss(kind, yd, b, out, normaliser);
      yd[i] = keep - h;
      const double lm = testing::RefLoss(kind, yd, b, out, normaliser);
      yd[i] = keep;
      EXPECT_NEAR(dy[i], (lp - lm) / (2 * h), 1e-6) << LossKindName(kind) << " " << i;
    }
    // Evaluation only: same loss, no gradient needed.
    EXPECT_EQ(loss, LossForwardBackward(kind, y.data(), b.targets.data(), b.labels.data(), batch, out,
                                        normaliser, nullptr));
  }
}

TEST(KernelsTest, SixteenBitWeightsEqualFp32OfTheRoundedValues) {
  // Conversion on load is exact, so bf16 / fp16 weights must give exactly the bits of fp32
  // weights holding the rounded values; against the unrounded weights they differ by the
  // rounding (bf16: 2^-9 relative per weight, fp16: 2^-12).
  const int64_t batch = 7, in = 45, out = 30;
  const std::vector<float> x = Random(batch * in, 18), w = Random(out * in, 19, 0.2f), b = Random(out, 20),
                           dy = Random(batch * out, 21);
  std::vector<float> y32(batch * out), dx32(batch * in), dw32(out * in), db32(out);
  LinearForward(x.data(), batch, in, out, w.data(), b.data(), DType::kF32, y32.data());
  for (DType dtype : {DType::kBf16, DType::kFp16}) {
    std::vector<uint16_t> wh(w.size()), bh(b.size());
    FromFloat(w.data(), w.size(), dtype, wh.data());
    FromFloat(b.data(), b.size(), dtype, bh.data());
    std::vector<float> wr(w.size()), br(b.size());
    ToFloat(wh.data(), dtype, w.size(), wr.data());
    ToFloat(bh.data(), dtype, b.size(), br.data());
    std::vector<float> yh(batch * out), yr(batch * out);
    LinearForward(x.data(), batch, in, out, wh.data(), bh.data(), dtype, yh.data());
    LinearForward(x.data(), batch, in, out, wr.data(), br.data(), DType::kF32, yr.data());
    EXPECT_EQ(0, std::memcmp(yh.data(), yr.data(), yh.size() * sizeof(float))) << DTypeName(dtype);
    const double tol = dtype == DType::kBf16 ? 1e-2 : 2e-3;
    EXPECT_LT(MaxRelErr(yh, D(y32)), tol) << DTypeName(dtype);

    std::vector<float> dxh(batch * in), dwh(out * in), dbh(out), dxr(batch * in), dwr(out * in), dbr(out);
    LinearBackward(x.data(), dy.data(), batch, in, out, wh.data(), dtype, dxh.data(), dwh.data(), dbh.data(),
                   false);
    LinearBackward(x.data(), dy.data(), batch, in, out, wr.data(), DType::kF32, dxr.data(), dwr.data(),
                   dbr.data(), false);
    EXPECT_EQ(0, std::memcmp(dxh.data(), dxr.data(), dxh.size() * sizeof(float))) << DTypeName(dtype);
    EXPECT_EQ(0, std::memcmp(dwh.data(), dwr.data(), dwh.size() * sizeof(float))) << DTypeName(dtype);
  }
}

TEST_P(GemmTest, LinearBitIdenticalForAnyThreadCount) {
  const int64_t batch = 100, in = 520, out = 300;
  const std::vector<float> x = Random(batch * in, 22), w = Random(out * in, 23, 0.05f), b = Random(out, 24),
                           dy = Random(batch * out, 25);
  auto run = [&](int threads) {
    std::vector<float> y(batch * out), dx(batch * in), dw(out * in), db(out);
    tbb::task_arena arena(threads);
    arena.execute([&] {
      LinearForward(x.data(), batch, in, out, w.data(), b.data(), DType::kF32, y.data());
      LinearBackward(x.data(), dy.data(), batch, in, out, w.data(), DType::kF32, dx.data(), dw.data(),
                     db.data(), false);
    });
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), dw.begin(), dw.end());
    y.insert(y.end(), db.begin(), db.end());
    return y;
  };
  // Allow more workers than this machine's cores, so that 3 and 8 really differ from 2.
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  const std::vector<float> one = run(1);
  for (int threads : {2, 3, 8}) {
    const std::vector<float> many = run(threads);
    EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float))) << threads << " threads";
  }
}

}  // namespace
}  // namespace strata::model
