// The GPT trained through the engine at world size 1 (no mpirun): every stage and offload
// combination against the dense single-rank reference (engine_gpt_checks.h), tied, with
// accumulation and clipping, with recompute, and untied; and 16-bit compute refused.
#include "engine_gpt_checks.h"
#include "single_world.h"

namespace strata::testing {
namespace {

std::vector<GptVariant> Variant(int i) { return {GptVariants()[i]}; }

TEST(EngineGpt, TiedHeadMatchesTheReference) { CheckGptVariants(World(), Variant(0), AllCombos()); }

TEST(EngineGpt, AccumulationAndClippingMatchTheReference) {
  const std::vector<ChainRun> refs = CheckGptVariants(World(), Variant(1), AllCombos());
  ASSERT_TRUE(refs[0].status.ok());
  for (double clip : refs[0].clip_coefs) EXPECT_LT(clip, 1.0) << "clipping must engage";
}

// The recompute's Fetches inside the backward depart from the plain order the engine
// assumes in the first micro-batch, so chunks hold their gradient buffers to the end and
// the engine must reduce some early as partial sums (engine_reduce.cc).
TEST(EngineGpt, RecomputeMatchesTheReference) { CheckGptVariants(World(), Variant(2), AllCombos()); }

TEST(EngineGpt, UntiedHeadMatchesTheReference) { CheckGptVariants(World(), Variant(3), AllCombos()); }

// The engine hands out bf16 parameters; the GPT's CPU kernels have no 16-bit path yet.
TEST(EngineGpt, Bf16ComputeIsRefusedByTheDriver) {
  const GptSetup setup{GptVariants()[0].setup};
  const Config config = MakeConfig({2, "none", "none"}, R"({"bf16": {"enabled": true}})");
  const ChainRun run = RunGptEngine(World(), config, setup);
  EXPECT_EQ(run.status.code(), StatusCode::kUnimplemented) << run.status.ToString();
  EXPECT_NE(run.status.message().find("bf16"), std::string::npos) << run.status.ToString();
}

}  // namespace
}  // namespace strata::testing
