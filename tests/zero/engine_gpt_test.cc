// The GPT trained through the engine at world size 1 (no mpirun): every stage and offload
// combination against the dense single-rank reference (engine_gpt_checks.h), tied, with
// accumulation and clipping, with recompute, untied, and with bf16 compute.
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

// Evaluation passes between steps (a validation loss) change no bit of the training, and
// compute the loss of the parameters the step left: a dense forward over the gathered
// masters gives the same bits.
TEST(EngineGpt, EvaluationBetweenStepsChangesNothing) {
  GptSetup plain = GptVariants()[0].setup, evaluated = plain;
  evaluated.evaluate = true;
  for (const Combo& c : AllCombos()) {
    const std::string what = ComboName(c);
    const Config config = MakeConfig(c, GptVariants()[0].extra_json);
    const ChainRun a = RunGptEngine(World(), config, plain);
    const ChainRun b = RunGptEngine(World(), config, evaluated);
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << what << ": " << a.status.ToString() << b.status.ToString();
    EXPECT_EQ(a.losses, b.losses) << what;
    EXPECT_EQ(a.params, b.params) << what << ": an evaluation pass changed the training";
    // The CPU model is done when a hook is called: no step counts a wait for its kernels.
    EXPECT_EQ(b.model_waits, std::vector<double>(plain.steps, 0.0)) << what;
    ASSERT_EQ(b.eval_losses.size(), static_cast<size_t>(plain.steps)) << what;
    model::Gpt gpt(plain.spec);
    DenseHooks dense(gpt.modules(), DType::kF32, [&b](TensorId t, int64_t begin, int64_t n, float* out) {
      std::copy_n(b.params[t].data() + begin, n, out);
    });
    std::vector<int32_t> tokens, targets;
    FillGptBatch(plain, kEvalFirst, plain.eval_batch, &tokens, &targets);
    auto want = gpt.Forward(tokens.data(), targets.data(), plain.eval_batch, plain.seq,
                            static_cast<double>(plain.eval_batch * plain.seq), dense);
    ASSERT_TRUE(want.ok()) << want.status().ToString();
    EXPECT_EQ(b.eval_losses.back(), *want) << what << ": the evaluation saw other parameters";
  }
}

TEST(EngineGpt, TrainingCallsAreRefusedWhileEvaluating) {
  const GptSetup setup = GptVariants()[0].setup;
  const Config config = MakeConfig({3, "cpu", "nvme"}, GptVariants()[0].extra_json);
  model::Gpt gpt(setup.spec);
  auto dev = EngineDevice(config);
  ASSERT_TRUE(dev.ok());
  auto engine =
      Engine::Create(config, gpt.modules(), GptInit(setup.spec), EngineResources{&World(), dev->get()});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  ASSERT_TRUE(e.SetEvaluating(true).ok());
  for (const Status& st : {e.BeginMicroBatch(), e.BeginBackward(0).status(), e.Step().status()}) {
    EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
    EXPECT_NE(st.message().find("while evaluating; call SetEvaluating(false) first"), std::string::npos)
        << st.ToString();
  }
  ASSERT_TRUE(e.SetEvaluating(false).ok());
  ASSERT_TRUE(e.BeginMicroBatch().ok()) << "refusals change nothing: training goes on";
  const Status inside = e.SetEvaluating(true);
  EXPECT_EQ(inside.code(), StatusCode::kFailedPrecondition) << inside.ToString();
}

// bf16 compute copies, with accumulation and clipping that engages every step.
// The token embedding, tied to the head, takes a run of chunks (layout.h): its
// gathered values and gradients are one span, and the gradient adds both uses.
TEST(EngineGpt, AVocabularyLargerThanAChunkMatchesTheReference) {
  CheckGptVariants(World(), Variant(5), AllCombos());
}

TEST(EngineGpt, Bf16MatchesTheReference) {
  const std::vector<ChainRun> refs = CheckGptVariants(World(), Variant(4), AllCombos());
  ASSERT_TRUE(refs[0].status.ok());
  for (double clip : refs[0].clip_coefs) EXPECT_LT(clip, 1.0) << "clipping must engage";
}

}  // namespace
}  // namespace strata::testing
