// Engine::SetLearningRate at world size 1: a rate that changes every step (and one from
// a DeepSpeed schedule) trains as the dense reference does with the same rate per step,
// in stages 0-3 with the optimizer on the device, on the host and on NVMe; and the rate
// cannot change inside an accumulation window, where speculative steps already use it.
#include "engine_model_checks.h"
#include "single_world.h"
#include "strata/lr_schedule.h"

namespace strata::testing {
namespace {

std::vector<Combo> LrCombos() {
  return {{0, "none", "none"}, {1, "cpu", "none"},
          {2, "none", "none"}, {3, "none", "none"},
          {3, "cpu", "cpu"},   {3, "nvme", "none", "host"},
          {3, "nvme", "nvme"}, {3, "nvme", "nvme", "auto", kPiecedSubGroup}};
}

// Rates that differ at every step (one of them 0, one twice MakeConfig's 0.01), so a rate
// ignored, applied a step late or mixed into a speculative step shows in the parameters.
double PerStepRate(int step) {
  static constexpr double kRates[] = {0.01, 0.003, 0.02, 0.0, 0.015};
  return kRates[step % 5];
}

TEST(EngineLr, RateChangedEveryStepMatchesTheReference) {
  ChainSetup plain{PlainChain(4), Always(Sequential(4))};
  plain.steps = 5;
  plain.lr_at = PerStepRate;
  LrSchedule cosine;
  cosine.type = LrScheduleType::kWarmupCosineLR;
  cosine.warmup_type = WarmupType::kLinear;
  cosine.warmup_num_steps = 2;
  cosine.total_num_steps = 5;
  cosine.warmup_min_ratio = 0.25;
  ChainSetup scheduled{PlainChain(4), Always(Sequential(4))};
  scheduled.steps = 6;
  scheduled.lr_at = [cosine](int step) { return LearningRateAt(cosine, step, 0.02); };
  CheckChainVariants(World(),
                     {{"rate per step", "", plain},
                      {"rate per step, accumulation 2, clipping",
                       R"({"gradient_accumulation_steps": 2, "gradient_clipping": 0.01})", plain},
                      {"WarmupCosineLR rates", "", scheduled}},
                     LrCombos());
}

TEST(EngineLr, SetLearningRateOnlyBetweenWindows) {
  const ModelDecl model = PlainChain(2);
  const Config config = MakeConfig({3, "cpu", "none"}, R"({"gradient_accumulation_steps": 2})");
  auto dev = EngineDevice(config);
  ASSERT_TRUE(dev.ok());
  auto engine = Engine::Create(config, model, ChainInit(model, 7), EngineResources{&World(), dev->get()});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  EXPECT_EQ(e.learning_rate(), static_cast<float>(0.01)) << "optimizer.params.lr until set";
  ASSERT_TRUE(e.SetLearningRate(0.5).ok());
  EXPECT_EQ(e.learning_rate(), 0.5);
  for (double bad : {-1e-3, double(NAN), double(INFINITY), 1e300}) {
    Status st = e.SetLearningRate(bad);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad << ": " << st.ToString();
    EXPECT_NE(st.message().find("finite"), std::string::npos) << st.ToString();
  }
  EXPECT_EQ(e.learning_rate(), 0.5) << "a refused rate changes nothing";
  std::vector<float> x, y;
  FillChainBatch(11, 0, 8, &x, &y);
  ChainDriver driver(model);
  for (int mb = 0; mb < 2; ++mb) {
    ASSERT_TRUE(e.BeginMicroBatch().ok());
    Status st = e.SetLearningRate(0.1);
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_NE(st.message().find("micro-batch " + std::to_string(mb + 1) + " of 2"), std::string::npos)
        << st.ToString();
    ASSERT_TRUE(driver.ForwardBackward(Sequential(2), x, y, 8, 8, e).ok());
    EXPECT_EQ(e.SetLearningRate(0.1).code(), StatusCode::kFailedPrecondition) << "after the backward";
  }
  EXPECT_EQ(e.learning_rate(), 0.5);
  ASSERT_TRUE(e.Step().ok());
  EXPECT_TRUE(e.SetLearningRate(0.25).ok()) << "between Step() and the next micro-batch";
  // A hook without BeginMicroBatch opens the window too.
  ASSERT_TRUE(driver.ForwardBackward(Sequential(2), x, y, 8, 8, e).ok());
  EXPECT_EQ(e.SetLearningRate(0.1).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(e.BeginMicroBatch().ok());
  ASSERT_TRUE(driver.ForwardBackward(Sequential(2), x, y, 8, 8, e).ok());
  ASSERT_TRUE(e.Step().ok());
  // Evaluation passes belong to no window.
  ASSERT_TRUE(e.SetEvaluating(true).ok());
  EXPECT_TRUE(e.SetLearningRate(0.125).ok());
  ASSERT_TRUE(e.SetEvaluating(false).ok());
  EXPECT_EQ(e.learning_rate(), 0.125);
}

}  // namespace
}  // namespace strata::testing
