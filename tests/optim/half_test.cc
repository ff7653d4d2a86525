// bf16 / fp16 conversions (half.h) against independent oracles: for fp16, GCC's
// _Float16 conversion (libgcc / F16C, IEEE round-to-nearest-even); for bf16, the
// nearer of the two neighbouring bf16 values computed in double (ties to even).
// Inputs: every 4097th bit pattern of all 2^32 (about 1M, covering every exponent and
// sign with varied mantissas), plus hand-picked edge cases (ties, overflow, subnormals).
#include "strata/half.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace strata {
namespace {

uint16_t OracleBf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return static_cast<uint16_t>((x >> 16) | 0x40);
  const uint32_t lo = x & 0xffff0000u;  // truncation toward zero (same sign)
  const uint32_t hi = lo + 0x10000u;    // next bf16 away from zero (may be inf)
  const double d = std::fabs(static_cast<double>(f));
  const double dlo = std::fabs(static_cast<double>(std::bit_cast<float>(lo)));
  double dhi;
  if ((hi & 0x7fffffffu) >= 0x7f800000u) {
    dhi = std::ldexp(1.0, 128);  // the rounding boundary to infinity is 2^128 in this sense
  } else {
    dhi = std::fabs(static_cast<double>(std::bit_cast<float>(hi)));
  }
  const double a = d - dlo, b = dhi - d;
  uint32_t r;
  if (a < b) {
    r = lo;
  } else if (b < a) {
    r = hi;
  } else {
    r = ((lo >> 16) & 1u) ? hi : lo;
  }
  return static_cast<uint16_t>(r >> 16);
}

uint16_t OracleFp16(float f) {
  const _Float16 h = static_cast<_Float16>(f);
  return std::bit_cast<uint16_t>(h);
}

TEST(HalfTest, Bf16MatchesOracle) {
  uint64_t checked = 0;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4097) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(b));
    ASSERT_EQ(FloatToBf16(f).bits, OracleBf16(f)) << "bits 0x" << std::hex << b;
    ++checked;
  }
  EXPECT_GT(checked, 1000000u);
}

TEST(HalfTest, Fp16MatchesOracle) {
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4097) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(b));
    const uint16_t want = OracleFp16(f);
    if (std::isnan(f)) {  // payload rules differ between implementations: require a quiet NaN
      const uint16_t got = FloatToFp16(f).bits;
      EXPECT_EQ(got & 0x7e00u, 0x7e00u);
      EXPECT_EQ(got & 0x8000u, want & 0x8000u);
      continue;
    }
    ASSERT_EQ(FloatToFp16(f).bits, want) << "bits 0x" << std::hex << b << " value " << f;
  }
}

TEST(HalfTest, Fp16EdgeCases) {
  const float cases[] = {0.0f,
                         -0.0f,
                         65504.0f,
                         65519.99f,
                         65520.0f,
                         1e9f,
                         6.103515625e-05f /*2^-14*/,
                         6.0975552e-05f,
                         5.9604645e-08f /*2^-24*/,
                         2.9802322e-08f /*2^-25, tie to 0*/,
                         2.9802326e-08f,
                         8.9406967e-08f /*1.5 * 2^-24, tie to 2*/,
                         1.0009765625f,
                         1.00048828125f /*tie to even*/,
                         1.00146484375f /*tie up*/,
                         std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::denorm_min()};
  for (float f : cases) {
    EXPECT_EQ(FloatToFp16(f).bits, OracleFp16(f)) << f;
    EXPECT_EQ(FloatToFp16(-f).bits, OracleFp16(-f)) << -f;
  }
}

TEST(HalfTest, Bf16EdgeCasesAndNaN) {
  EXPECT_EQ(FloatToBf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f808000u)).bits, 0x3f80);  // tie, even stays
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x3f818000u)).bits, 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x7f7fffffu)).bits, 0x7f80);  // FLT_MAX -> inf
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x00008000u)).bits, 0x0000);  // subnormal tie -> 0
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x00018000u)).bits, 0x0002);  // subnormal tie -> even
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0x7f800001u)).bits, 0x7fc0);  // sNaN -> qNaN
  EXPECT_EQ(FloatToBf16(std::bit_cast<float>(0xffc12345u)).bits, 0xffc1);
}

TEST(HalfTest, RoundTripsAreExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const Bf16 b{static_cast<uint16_t>(h)};
    const Fp16 f{static_cast<uint16_t>(h)};
    const float fb = Bf16ToFloat(b), ff = Fp16ToFloat(f);
    const float oracle = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    if (std::isnan(oracle)) {
      ASSERT_TRUE(std::isnan(ff)) << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(ff), std::bit_cast<uint32_t>(oracle)) << h;
    }
    if (!std::isnan(fb)) {
      ASSERT_EQ(FloatToBf16(fb).bits, h);
    }
    if (!std::isnan(ff)) {
      ASSERT_EQ(FloatToFp16(ff).bits, h);
    }
  }
}

}  // namespace
}  // namespace strata
