// The host implementation of the engine's device operations (device_ops.h) where it
// converts: gradients handed in as bf16 or fp16 (the CUDA one: device_ops_gpu_test.cc).
#include "zero/device_ops.h"

#include <gtest/gtest.h>

#include <vector>

#include "strata/half.h"

namespace strata::zero {
namespace {

TEST(HostOps, AddGradientConvertsAndAddsOrOverwrites) {
  // Values a 16-bit format holds exactly, so the sums are exact too.
  const std::vector<float> values = {1.5f, -2.25f, 0.0f, 1024.0f, -0.125f};
  std::vector<Bf16> bf16;
  std::vector<Fp16> fp16;
  for (float v : values) {
    bf16.push_back(FloatToBf16(v));
    fp16.push_back(FloatToFp16(v));
  }
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<float> dst(n, 7.0f);
  ASSERT_TRUE(
      HostMemoryOps().AddGradient(OpsLane::kTraining, dst.data(), bf16.data(), DType::kBf16, n, true).ok());
  EXPECT_EQ(dst, values) << "overwrite";
  ASSERT_TRUE(
      HostMemoryOps().AddGradient(OpsLane::kTraining, dst.data(), fp16.data(), DType::kFp16, n, false).ok());
  ASSERT_TRUE(
      HostMemoryOps().AddGradient(OpsLane::kTraining, dst.data(), values.data(), DType::kF32, n, false).ok());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(dst[i], 3 * values[i]) << i;
  Status bad = HostMemoryOps().AddGradient(OpsLane::kTraining, dst.data(), values.data(),
                                           static_cast<DType>(9), n, false);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("use fp32, bf16 or fp16"), std::string::npos) << bad.ToString();
}

}  // namespace
}  // namespace strata::zero
