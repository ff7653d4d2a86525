// The engine at world size 1 (no mpirun): every combination against the reference,
// overlap, accumulation, clipping, fp16 overflow, bf16, budgets and bad configurations.
#include "engine_checks.h"

namespace strata::testing {
namespace {

std::unique_ptr<Communicator>& WorldPtr() {
  static std::unique_ptr<Communicator> world;
  return world;
}
Communicator& World() {
  auto& w = WorldPtr();
  if (!w) {
    auto r = InitWorld(CommOptions{"world", 120});
    STRATA_CHECK_MSG(r.ok(), r.status().ToString());
    w = std::move(*r);
  }
  return *w;
}

class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    if (WorldPtr()) {
      WorldPtr().reset();
      EXPECT_TRUE(FinalizeWorld().ok());
    }
  }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

TEST(Engine, EveryStageAndOffloadMatchesTheReference) { CheckAllCombos(World()); }
TEST(Engine, OverlappedStepEqualsSerialStep) { CheckOverlapEqualsSerial(World(), ""); }
TEST(Engine, OverlappedStepEqualsSerialStepWhenClipping) {
  CheckOverlapEqualsSerial(World(), R"({"gradient_clipping": 0.05})");
}
TEST(Engine, OverlappedStepEqualsSerialStepWithFp16Overflow) {
  CheckOverlapEqualsSerial(World(), R"({"fp16": {"enabled": true, "initial_scale_power": 24}})");
}
TEST(Engine, RandomizedSpeculativeCommitAndRollbackEqualSerial) {
  for (uint64_t seed : {1, 2, 3}) CheckRandomizedSpeculation(World(), seed, 6);
}
TEST(Engine, AccumulationEqualsLargerBatch) { CheckAccumulation(World()); }
TEST(Engine, ClippingMatchesTheReference) { CheckClipping(World()); }
TEST(Engine, Fp16OverflowStepsAreSkippedAsInTheReference) { CheckFp16Overflow(World()); }
TEST(Engine, Bf16MatchesTheReference) { CheckBf16(World()); }

TEST(Engine, DeviceBudgetTooSmallIsRefusedAtStart) {
  Config c = MakeConfig({2, "none", "none"}, R"({"strata": {"device_budget": "64KiB"}})");
  EngineRun run = RunEngine(World(), c, SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kOutOfBudget) << run.status.ToString();
  EXPECT_NE(run.status.message().find("device tier"), std::string::npos) << run.status.message();
  EXPECT_NE(run.status.message().find("needs"), std::string::npos) << run.status.message();
  // The same model fits once its state is offloaded.
  Config off = MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"device_budget": "512KiB"}})");
  EngineRun ok = RunEngine(World(), off, SmallSpec(2));
  EXPECT_TRUE(ok.status.ok()) << ok.status.ToString();
  EXPECT_LE(ok.device_high_water, 512u * 1024);
}

TEST(Engine, HostBudgetTooSmallIsRefusedAtStart) {
  Config c = MakeConfig({2, "cpu", "none"}, R"({"strata": {"host_budget": "16KiB"}})");
  EngineRun run = RunEngine(World(), c, SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kOutOfBudget) << run.status.ToString();
  EXPECT_NE(run.status.message().find("host"), std::string::npos) << run.status.message();
}

TEST(Engine, NvmeOptimizerOffloadNeedsStage3) {
  Config c = MakeConfig({2, "none", "none"});
  c.zero.offload_optimizer.device = OffloadDevice::kNvme;
  c.zero.offload_optimizer.nvme_path = {SwapDir()};
  EngineRun run = RunEngine(World(), c, SmallSpec(1));
  ASSERT_EQ(run.status.code(), StatusCode::kInvalidArgument) << run.status.ToString();
  EXPECT_NE(run.status.message().find("stage 3"), std::string::npos);
}

}  // namespace
}  // namespace strata::testing
