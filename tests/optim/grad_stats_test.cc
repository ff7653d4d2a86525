// The fused inf/NaN + sum-of-squares pass, every ISA, against the plain reference.
// Tolerance: both accumulate exact fp32 squares in double; the orders differ, so the
// relative difference is bounded by n * 2^-53 (sum of positive terms), checked as 1e-12
// for the sizes here.
#include "strata/grad_stats.h"

#include <gtest/gtest.h>
#include <oneapi/tbb/task_arena.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "strata/cpu_isa.h"

namespace strata {
namespace {

struct Grads {
  std::vector<float> f32;
  std::vector<uint16_t> b16, h16;
};

Grads MakeGrads(size_t n, uint64_t seed) {
  Grads g;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (size_t i = 0; i < n; ++i) {
    const float x = u(rng);
    g.f32.push_back(x);
    g.b16.push_back(FloatToBf16(x).bits);
    g.h16.push_back(FloatToFp16(x).bits);
  }
  return g;
}

GradView View(const Grads& g, DType t, size_t off) {
  if (t == DType::kF32) return {g.f32.data() + off, t};
  return {(t == DType::kBf16 ? g.b16.data() : g.h16.data()) + off, t};
}

class GradStatsIsaTest : public ::testing::TestWithParam<CpuIsa> {};

TEST_P(GradStatsIsaTest, MatchesReference) {
  tbb::task_arena arena(2);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{1000},
                   (size_t{1} << 20) + 3}) {
    const Grads g = MakeGrads(n + 1, n);
    for (DType t : {DType::kF32, DType::kBf16, DType::kFp16}) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << " " << DTypeName(t));
      const GradStats want = ComputeGradStatsReference(View(g, t, 1), n);
      Result<GradStats> got = ComputeGradStatsWithIsa(GetParam(), View(g, t, 1), n, &arena);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_FALSE(got->has_inf_nan);
      EXPECT_NEAR(got->sum_sq, want.sum_sq, 1e-12 * want.sum_sq);
      if (n > 0) {
        EXPECT_GT(got->sum_sq, 0);
      }
    }
  }
}

TEST_P(GradStatsIsaTest, FindsEveryNonFiniteAnywhere) {
  const size_t n = 100;
  for (size_t pos : {size_t{0}, size_t{15}, size_t{16}, size_t{63}, size_t{99}}) {
    for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN()}) {
      Grads g = MakeGrads(n, 1);
      g.f32[pos] = bad;
      g.b16[pos] = FloatToBf16(bad).bits;
      g.h16[pos] = FloatToFp16(bad).bits;
      for (DType t : {DType::kF32, DType::kBf16, DType::kFp16}) {
        Result<GradStats> got = ComputeGradStatsWithIsa(GetParam(), View(g, t, 0), n);
        ASSERT_TRUE(got.ok());
        EXPECT_TRUE(got->has_inf_nan) << "pos " << pos << " " << DTypeName(t) << " " << bad;
      }
    }
  }
  // Large finite values are not overflow: the sum is in double.
  std::vector<float> big(33, 3e38f);
  Result<GradStats> got = ComputeGradStatsWithIsa(GetParam(), {big.data(), DType::kF32}, big.size());
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_inf_nan);
  EXPECT_NEAR(got->sum_sq, 33 * 9e76, 1e-6 * 33 * 9e76);
}

TEST_P(GradStatsIsaTest, DeterministicAcrossThreadCounts) {
  const Grads g = MakeGrads(3 << 20, 4);
  tbb::task_arena one(1), two(2);
  Result<GradStats> a = ComputeGradStatsWithIsa(GetParam(), View(g, DType::kF32, 0), g.f32.size(), &one);
  Result<GradStats> b = ComputeGradStatsWithIsa(GetParam(), View(g, DType::kF32, 0), g.f32.size(), &two);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->sum_sq, b->sum_sq);
}

std::string IsaParamName(const ::testing::TestParamInfo<CpuIsa>& info) {
  return std::string(CpuIsaName(info.param));
}
INSTANTIATE_TEST_SUITE_P(AllSupported, GradStatsIsaTest, ::testing::ValuesIn(SupportedCpuIsas()),
                         IsaParamName);

TEST(GradStatsTest, MultiShardMerges) {
  const Grads a = MakeGrads(5000, 1), b = MakeGrads(70001, 2);
  const GradShard shards[] = {{View(a, DType::kF32, 0), 5000}, {View(b, DType::kBf16, 0), 70001}, {{}, 0}};
  Result<GradStats> got = ComputeGradStats(shards);
  ASSERT_TRUE(got.ok());
  GradStats want = ComputeGradStatsReference(View(a, DType::kF32, 0), 5000);
  want.Merge(ComputeGradStatsReference(View(b, DType::kBf16, 0), 70001));
  EXPECT_NEAR(got->sum_sq, want.sum_sq, 1e-12 * want.sum_sq);
  EXPECT_FALSE(got->has_inf_nan);
  const GradShard null_shard[] = {{{nullptr, DType::kF32}, 3}};
  EXPECT_EQ(ComputeGradStats(null_shard).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
