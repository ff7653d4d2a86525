// The GPT trained through the engine on a CUDA device (one rank): the driver runs the
// CUDA kernels on the engine's compute stream, against the dense single-rank reference on
// the CPU (engine_gpt_checks.h). Skips with the reason where there is no usable GPU.
//
// Tolerances. The products run in fp32 (no TF32), so every gradient differs from the
// reference's by fp32 rounding in other orders (gpt_driver_gpu_test: within 1e-4 of each
// tensor's scale, ~1e-6 typically): losses and gradient norms at rtol 1e-4. Parameters:
// the GPT has elements whose gradient cancels to near Adam's eps (engine_gpt_checks.h),
// where a rounding of ~1e-10 moves the update by up to a step, so they are held to one
// step per step (kChain16Atol = 2 lr, as the 16-bit runs); a gradient dropped, doubled or
// misplaced shows in the norms and losses, and a missing update in the losses.
#include <cmath>
#include <string>
#include <vector>

#include "engine_gpt_checks.h"
#include "single_world.h"
#if STRATA_HAVE_CUDA
#include "model/cuda/matmul.h"
#endif

namespace strata::testing {
namespace {

constexpr double kCudaGptRtol = 1e-4;

class EngineGptCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const CudaProbe probe = ProbeCuda();
    if (!probe.available) GTEST_SKIP() << "no usable GPU: " << probe.reason;
#if STRATA_HAVE_CUDA
    model::cuda::SetMatmulPrecision(model::cuda::MatmulPrecision::kFp32);
#endif
  }
};

Config CudaGptConfig(const Combo& c, const std::string& extra) {
  nlohmann::json e = extra.empty() ? nlohmann::json::object() : nlohmann::json::parse(extra);
  e["strata"]["device"] = "cuda";
  return MakeConfig(c, e.dump());
}

void ExpectCloseToReference(const ChainRun& run, const ChainRun& ref, const std::string& what) {
  ASSERT_TRUE(run.status.ok()) << what << ": " << run.status.ToString();
  EXPECT_EQ(run.model_backend, Backend::kCuda) << what << ": the GPT did not run its CUDA kernels";
  ASSERT_EQ(run.losses.size(), ref.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(run.losses[i], ref.losses[i], kCudaGptRtol * std::fabs(ref.losses[i]))
        << what << ": loss " << i;
    EXPECT_NEAR(run.grad_norms[i], ref.grad_norms[i], kCudaGptRtol * ref.grad_norms[i])
        << what << ": norm " << i;
  }
  EXPECT_LE(ChainParamError(run, ref, kChain16Atol, 0), 1.0) << what << ": final parameters";
  EXPECT_LE(run.device_high_water, run.device_capacity) << what;
  // EndBackward drains the compute stream at every stage: each step's model time shows.
  for (size_t i = 0; i < run.model_waits.size(); ++i) {
    EXPECT_GT(run.model_waits[i], 0.0)
        << what << ": step " << i << " counted no wait for the model's kernels";
  }
}

// Stage 0 on the device, the CPU optimizer, and stage 3 with both on NVMe; tied with
// accumulation and clipping, recompute, untied.
TEST_F(EngineGptCudaTest, MatchesTheReference) {
  const std::vector<GptVariant> variants = GptVariants();
  const Combo combos[] = {{0, "none", "none"}, {2, "cpu", "none"}, {3, "cpu", "cpu"}, {3, "nvme", "nvme"}};
  for (int v : {0, 1, 2, 3}) {
    const GptVariant& var = variants[v];
    const ChainRun ref = TrainGptReference(MakeConfig({0, "none", "none"}, var.extra_json), var.setup, 1);
    ASSERT_TRUE(ref.status.ok()) << var.name << ": " << ref.status.ToString();
    for (const Combo& c : combos) {
      const std::string what = var.name + " " + ComboName(c) + " on cuda";
      ExpectCloseToReference(RunGptEngine(World(), CudaGptConfig(c, var.extra_json), var.setup), ref, what);
    }
  }
}

}  // namespace
}  // namespace strata::testing
