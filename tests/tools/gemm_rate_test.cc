// The matrix-product rate probes (tools/gemm_rate.h): the CPU's measures, the GPU's says
// Unavailable where there is no GPU (the device check runs it on one).
#include "tools/gemm_rate.h"

#include <gtest/gtest.h>

#include "strata/mlp_cuda.h"

namespace strata::tools {
namespace {

TEST(GemmRate, TheCpuProbeTimesItsShape) {
  const GemmRate r = MeasureGemmRate(64, 48, 32, 0.02);
  EXPECT_EQ(r.Shape(), "[64 x 32] x [32 x 48]");
  EXPECT_EQ(r.library, "Gemm");
  EXPECT_GE(r.calls, 1);
  EXPECT_GT(r.flops_per_s, 1e6) << "any CPU of this century";
}

TEST(GemmRate, TheGpuProbeIsUnavailableWithoutAGpu) {
  if (model::cuda::DeviceAvailable().ok()) GTEST_SKIP() << "a GPU is present: the device check times it";
  const Result<GemmRate> r = MeasureDeviceGemmRate(64, 48, 32, DType::kBf16, 0.02);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();
}

}  // namespace
}  // namespace strata::tools
