#include "strata/units.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

TEST(ParseBytes, BinaryAndDecimalSuffixes) {
  EXPECT_EQ(*ParseBytes("64MiB"), 64 * MiB);
  EXPECT_EQ(*ParseBytes("64M"), 64 * MiB);
  EXPECT_EQ(*ParseBytes("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 3 * GiB / 2);
  EXPECT_EQ(*ParseBytes("2e9"), 2'000'000'000u);
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes(" 8 kib "), 8 * KiB);
  EXPECT_EQ(*ParseBytes("3kB"), 3000u);
  EXPECT_EQ(*ParseBytes("1TiB"), 1024 * GiB);
  EXPECT_EQ(*ParseBytes("0"), 0u);
}

TEST(ParseBytes, RejectsBadInputWithTheText) {
  for (const char* bad : {"", "abc", "-1", "12XB", "1.3B", "inf", "nan", "1e30"}) {
    auto r = ParseBytes(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
  auto r = ParseBytes("12XB");
  EXPECT_NE(r.status().message().find("XB"), std::string::npos);
  EXPECT_NE(r.status().message().find("MiB"), std::string::npos) << "should list accepted units";
}

TEST(ParseCount, DecimalSuffixes) {
  EXPECT_EQ(*ParseCount("2e9"), 2'000'000'000u);
  EXPECT_EQ(*ParseCount("256M"), 256'000'000u);
  EXPECT_EQ(*ParseCount("1.5k"), 1500u);
  EXPECT_EQ(*ParseCount("7"), 7u);
  EXPECT_EQ(*ParseCount("2B"), 2'000'000'000u);
  EXPECT_FALSE(ParseCount("1.5").ok());
  EXPECT_FALSE(ParseCount("3x").ok());
}

TEST(Format, BytesRatesSeconds) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(64 * MiB), "64.0 MiB");
  EXPECT_EQ(FormatBytes(3 * GiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(300 * GiB), "300 GiB");
  EXPECT_EQ(FormatRate(4.6e9), "4.60 GB/s");
  EXPECT_EQ(FormatRate(12.34e6), "12.3 MB/s");
  EXPECT_EQ(FormatSeconds(2.0), "2.00 s");
  EXPECT_EQ(FormatSeconds(1.23e-3), "1.23 ms");
  EXPECT_EQ(FormatSeconds(45.6e-6), "45.6 us");
  EXPECT_EQ(FormatCount(295), "295");
  EXPECT_EQ(FormatCount(20.1e6), "20.1M");
  EXPECT_EQ(FormatCount(1.5e9), "1.50G");
  EXPECT_EQ(FormatCount(1e12), "1.00T");
}

}  // namespace
}  // namespace strata
