// The engine training on a CUDA device (one rank): every stage and offload combination
// DeepSpeed allows, and bf16 and fp16, against the reference (one rank, CPU kernels,
// unsharded). Skips with the reason where there is no usable GPU.
//
// Tolerances. On the GPU the model runs the CUDA kernels (mlp_cuda.h), here with the
// matrix products in fp32 (model/cuda/matmul.h; the tensor-core default rounds their
// inputs, see the last test): the matmuls sum
// each output in a different order than the CPU's blocked kernels and GELU uses tanhf,
// so every gradient differs from the reference's by fp32 rounding (~1e-6 relative);
// with the optimizer on the device the GPU Adam is within a few ulps of the reference
// Adam per step (adam.h), as the CPU one is. Over 20 Adam steps with lr = 0.01 that
// moves a parameter by ~1e-6: we allow atol 1e-4 + rtol 1e-3 (5 and 10 times the sim
// engine tests' bounds, for the rounding of the forward and backward that the sim runs
// share with the reference) and loss rtol 1e-4, still two orders of magnitude below one
// Adam step. 16-bit compute copies as in the sim tests (engine_checks.h): a flipped
// rounding of a 16-bit copy moves an element by up to one step per step, so those
// runs are compared at loss rtol 2e-3 and atol 2 lr.
#include <sys/vfs.h>

#include <cstdlib>
#include <filesystem>

#include "engine_checks.h"
#include "single_world.h"
#include "tmp_on_disk.h"
#if STRATA_HAVE_CUDA
#include "model/cuda/matmul.h"
#endif

namespace strata::testing {

// How GoogleTest (and so ctest's test list) shows a combination.
void PrintTo(const Combo& c, std::ostream* os) { *os << ComboName(c); }

namespace {

constexpr double kCudaAtol = 1e-4, kCudaRtol = 1e-3, kCudaLossRtol = 1e-4;

const bool kSwapOnDisk = testing::MoveTmpOffTmpfs();

// The configuration on the GPU: strata.device "cuda" (the harness makes the device).
Config CudaConfig(const Combo& c, const std::string& extra = "") {
  nlohmann::json e = extra.empty() ? nlohmann::json::object() : nlohmann::json::parse(extra);
  e["strata"]["device"] = "cuda";
  return MakeConfig(c, e.dump());
}

// Every stage x offload_optimizer x offload_param DeepSpeed allows (gradients "auto"),
// and half the NVMe optimizer's state resident in pinned memory.
std::vector<Combo> BaseCombos() {
  std::vector<Combo> out;
  for (const Combo& c : AllCombos()) {
    if (std::string(c.grads) == "auto" && c.sub_group == 0) out.push_back(c);
  }
  return out;
}

class EngineCudaTest : public ::testing::TestWithParam<Combo> {
 protected:
  void SetUp() override {
    const CudaProbe probe = ProbeCuda();
    if (!probe.available) GTEST_SKIP() << "no usable GPU: " << probe.reason;
    UseTensorCores(false);
  }
  void TearDown() override { UseTensorCores(false); }
  static void UseTensorCores(bool tensor) {
#if STRATA_HAVE_CUDA
    model::cuda::SetMatmulPrecision(tensor ? model::cuda::MatmulPrecision::kTensorCores
                                           : model::cuda::MatmulPrecision::kFp32);
#else
    (void)tensor;
#endif
  }
};

TEST_P(EngineCudaTest, MatchesTheReference) {
  const Combo c = GetParam();
  const zero::TrainSpec spec = SmallSpec(20);
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EngineRun run = RunEngine(World(), CudaConfig(c), spec, DeviceKind::kCuda);
  ExpectMatchesReference(run, *ref, kCudaLossRtol, kCudaAtol, kCudaRtol, ComboName(c) + " on cuda");
  if (run.status.ok()) {
    EXPECT_TRUE(LossWentDown(run.log.losses)) << ComboName(c) << ": loss did not go down";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryStageAndOffload, EngineCudaTest, ::testing::ValuesIn(BaseCombos()),
                         [](const ::testing::TestParamInfo<Combo>& info) {
                           return "stage" + std::to_string(info.param.stage) + "_opt_" + info.param.opt +
                                  "_param_" + info.param.param +
                                  (info.param.resident != 0 ? "_partial" : "") +
                                  (info.param.ratio != 1
                                       ? "_ratio" + std::to_string(int(info.param.ratio * 100))
                                       : "") +
                                  (info.param.param_resident != 0 ? "_params_partial" : "");
                         });

// The 16-bit combinations: the optimizer on the device writing the compute copy in
// place (stage 1) and through device staging to the shards (stage 3), and on the host;
// and both at once (offload_optimizer.ratio).
const Combo k16BitCombos[] = {{1, "none", "none"},
                              {3, "none", "none"},
                              {3, "cpu", "cpu"},
                              {3, "nvme", "nvme"},
                              {3, "cpu", "cpu", "auto", 0, 0, 0.5}};

TEST_F(EngineCudaTest, Bf16MatchesTheReference) {
  const zero::TrainSpec spec = SmallSpec(20);
  const std::string extra = R"({"bf16": {"enabled": true}})";
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, extra), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const Combo& c : k16BitCombos) {
    EngineRun run = RunEngine(World(), CudaConfig(c, extra), spec, DeviceKind::kCuda);
    ExpectMatchesReference(run, *ref, 2e-3, 2 * 0.01, 0, ComboName(c) + " bf16 on cuda");
  }
}

// fp16 with a loss scale that overflows at first: the gradients are rounded to fp16 on
// the GPU, the overflowing steps are skipped (and speculative updates rolled back) as
// in the reference, and the scale backs off.
TEST_F(EngineCudaTest, Fp16MatchesTheReference) {
  const zero::TrainSpec spec = SmallSpec(20);
  const std::string extra =
      R"({"fp16": {"enabled": true, "initial_scale_power": 24, "loss_scale_window": 4}})";
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, extra), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  int skipped = 0;
  for (bool s : ref->log.skipped) skipped += s;
  ASSERT_GT(skipped, 0) << "the reference should overflow at scale 2^24";
  for (const Combo& c : k16BitCombos) {
    EngineRun run = RunEngine(World(), CudaConfig(c, extra), spec, DeviceKind::kCuda);
    ExpectMatchesReference(run, *ref, 2e-3, 2 * 0.01, 0, ComboName(c) + " fp16 on cuda");
  }
}

// Gradient clipping engaged: speculative device steps are redone with the clip factor.
TEST_F(EngineCudaTest, ClippingMatchesTheReference) {
  const zero::TrainSpec spec = SmallSpec(20);
  const std::string extra = R"({"gradient_clipping": 0.05})";
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, extra), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const Combo& c : {Combo{0, "none", "none"}, Combo{3, "none", "none"}, Combo{2, "cpu", "none"}}) {
    EngineRun run = RunEngine(World(), CudaConfig(c, extra), spec, DeviceKind::kCuda);
    ExpectMatchesReference(run, *ref, kCudaLossRtol, kCudaAtol, kCudaRtol, ComboName(c) + " clipped on cuda");
  }
}

// The default precision (tensor cores: bf16 activations with bf16 weights) still trains:
// it rounds every product's inputs to 8 bits, so it is held to the loss only, within 5%
// of the reference's per step (the fp32-product tests above check the engine itself).
TEST_F(EngineCudaTest, Bf16OnTensorCoresTrains) {
  UseTensorCores(true);
  const zero::TrainSpec spec = SmallSpec(20);
  const std::string extra = R"({"bf16": {"enabled": true}})";
  auto ref = zero::TrainReference(MakeConfig({0, "none", "none"}, extra), spec, 1);
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const Combo& c : {Combo{0, "none", "none"}, Combo{3, "nvme", "nvme"}}) {
    EngineRun run = RunEngine(World(), CudaConfig(c, extra), spec, DeviceKind::kCuda);
    ASSERT_TRUE(run.status.ok()) << ComboName(c) << ": " << run.status.ToString();
    ASSERT_EQ(run.log.losses.size(), ref->log.losses.size());
    for (size_t i = 0; i < ref->log.losses.size(); ++i) {
      EXPECT_NEAR(run.log.losses[i], ref->log.losses[i], 0.05 * std::fabs(ref->log.losses[i]))
          << ComboName(c) << " tensor cores: loss of step " << i;
    }
    EXPECT_TRUE(LossWentDown(run.log.losses)) << ComboName(c) << " tensor cores: loss did not go down";
  }
}

}  // namespace
}  // namespace strata::testing
