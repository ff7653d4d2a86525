// The engine's model-agnostic interface at world size 1 (no mpirun): chain models with a
// tied weight, recomputed blocks, frozen modules, a module called twice, tensors larger
// than a chunk and a changing call order, each against the dense reference with every
// stage and offload combination (engine_model_checks.h).
#include "engine_model_checks.h"
#include "single_world.h"

namespace strata::testing {
namespace {

TEST(EngineModel, TiedWeightMatchesTheReference) { CheckTiedWeight(World(), AllCombos()); }
TEST(EngineModel, RecomputedBlocksMatchTheReference) { CheckRecompute(World(), AllCombos()); }
TEST(EngineModel, FrozenModulesMatchTheReference) { CheckFrozen(World(), AllCombos()); }
TEST(EngineModel, ModuleCalledTwiceMatchesTheReference) { CheckCalledTwice(World(), AllCombos()); }
TEST(EngineModel, TensorLargerThanAChunkMatchesTheReference) {
  CheckTensorLargerThanAChunk(World(), AllCombos());
}
TEST(EngineModel, ChangingCallOrderMatchesTheReference) { CheckOrderChanges(World(), AllCombos()); }
TEST(EngineModel, GradientsHandedInMatchTheReference) { CheckExternalGradients(World(), AllCombos()); }

// AccumulateGrad refuses what it cannot use, and a gradient that comes after its chunk
// was reduced for the micro-batch fails the engine with a message naming it.
TEST(EngineModel, AccumulateGradRefusesBadInputAndLateGradients) {
  const ModelDecl model = PlainChain(2);
  const Config config = MakeConfig({2, "none", "none"});
  auto dev = EngineDevice(config);
  ASSERT_TRUE(dev.ok());
  auto engine = Engine::Create(config, model, ChainInit(model, 7), EngineResources{&World(), dev->get()});
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  Engine& e = **engine;
  std::vector<float> g(model.tensors[0].numel(), 1.0f);
  EXPECT_EQ(e.AccumulateGrad(99, g.data(), DType::kF32).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e.AccumulateGrad(0, nullptr, DType::kF32).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(e.BeginMicroBatch().ok());
  std::vector<float> x, y;
  FillChainBatch(11, 0, 8, &x, &y);
  ChainDriver driver(model);
  ASSERT_TRUE(driver.ForwardBackward(Sequential(2), x, y, 8, 8, e).ok());
  // The plain order was followed to its end: every chunk's reduction has started.
  Status late = e.AccumulateGrad(0, g.data(), DType::kF32);
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.ToString();
  EXPECT_NE(late.message().find("gradient of tensor \"" + model.tensors[0].name +
                                "\" after the gradients of chunk 0"),
            std::string::npos)
      << late.ToString();
  EXPECT_EQ(e.Step().status().code(), StatusCode::kFailedPrecondition) << "the engine trains no more";
}

// The driver itself, without the engine: a recomputed program computes the plain one's
// loss and gradients bit for bit, and a frozen call changes only its own module's (none).
TEST(ChainModel, RecomputeAndFrozenLeaveTheLossAndOtherGradientsAlone) {
  const ModelDecl model = PlainChain(4);
  const TensorInit init = ChainInit(model, 7);
  std::vector<float> x, y;
  FillChainBatch(11, 0, 8, &x, &y);
  auto run = [&](const ChainProgram& program, DenseHooks* hooks) {
    ChainDriver driver(model);
    hooks->BeginMicroBatch();
    auto loss = driver.ForwardBackward(program, x, y, 8, 8, *hooks);
    EXPECT_TRUE(loss.ok()) << loss.status().ToString();
    return loss.ok() ? *loss : NAN;
  };
  DenseHooks plain(model, DType::kF32, init), recomputed(model, DType::kF32, init),
      frozen(model, DType::kF32, init);
  ChainProgram program = Sequential(4);
  const double l_plain = run(program, &plain);
  for (auto& c : program) c.recompute = true;
  const double l_recomputed = run(program, &recomputed);
  program = Sequential(4);
  program[1].frozen = true;
  const double l_frozen = run(program, &frozen);
  EXPECT_EQ(l_plain, l_recomputed);
  EXPECT_EQ(l_plain, l_frozen);
  for (TensorId t = 0; t < static_cast<TensorId>(model.tensors.size()); ++t) {
    EXPECT_EQ(plain.grad(t), recomputed.grad(t)) << "tensor " << t;
    if (t == 2 || t == 3) {
      EXPECT_FALSE(frozen.used(t)) << "a frozen module has no backward";
    } else {
      EXPECT_EQ(plain.grad(t), frozen.grad(t))
          << "tensor " << t << ": the gradient flows through a frozen module";
    }
  }
}

// A module called twice gets the sum of its two uses: the accumulate flag is honoured.
// Calls {0, 1, 0} of a model equal calls {0, 1, 2} of one whose module 2 is a copy of
// module 0, with module 2's gradient added to module 0's.
TEST(ChainModel, ModuleCalledTwiceSumsItsUses) {
  const ModelDecl two = PlainChain(2), three = PlainChain(3);
  std::vector<float> x, y;
  FillChainBatch(11, 0, 8, &x, &y);
  DenseHooks tied(two, DType::kF32, ChainInit(two, 7)), copy(three, DType::kF32, ChainInit(three, 7));
  for (TensorId t : {0, 1}) copy.master(t + 4) = copy.master(t) = tied.master(t);
  ChainDriver d2(two), d3(three);
  tied.BeginMicroBatch();
  copy.BeginMicroBatch();
  auto l2 = d2.ForwardBackward({{0}, {1}, {0}}, x, y, 8, 8, tied);
  auto l3 = d3.ForwardBackward({{0}, {1}, {2}}, x, y, 8, 8, copy);
  ASSERT_TRUE(l2.ok() && l3.ok());
  EXPECT_EQ(*l2, *l3);
  for (TensorId t : {0, 1}) {
    for (size_t i = 0; i < tied.grad(t).size(); ++i) {
      const float sum = copy.grad(t)[i] + copy.grad(t + 4)[i];
      ASSERT_NEAR(tied.grad(t)[i], sum,
                  1e-6f * (std::fabs(copy.grad(t)[i]) + std::fabs(copy.grad(t + 4)[i])) + 1e-12f)
          << "tensor " << t << " element " << i;
    }
  }
  for (TensorId t : {2, 3}) EXPECT_EQ(tied.grad(t), copy.grad(t)) << "tensor " << t;
}

// The driver's gradients are the loss's, so the reference is a real gradient: central
// differences with step 4e-3 (the fp32 forward's noise over 2h and the truncation error
// are both under 3e-7 here, against gradients of 3e-5 to 2e-2) agree with them for a
// program with a tied weight, a recompute, a frozen call and a module called twice.
TEST(ChainModel, GradientsMatchFiniteDifferences) {
  ModelDecl model = PlainChain(3);
  AddSharedLinear(&model, 0, -1);
  const ChainProgram program = {{0}, {1, false, true}, {2, true, false}, {1}, {3}};
  std::vector<float> x, y;
  FillChainBatch(11, 0, 8, &x, &y);
  DenseHooks hooks(model, DType::kF32, ChainInit(model, 7));
  ChainDriver driver(model);
  hooks.BeginMicroBatch();
  ASSERT_TRUE(driver.ForwardBackward(program, x, y, 8, 8, hooks).ok());
  auto loss = [&] {
    DenseHooks copy = hooks;
    copy.BeginMicroBatch();
    return *ChainDriver(model).ForwardBackward(program, x, y, 8, 8, copy);
  };
  for (TensorId t = 0; t < static_cast<TensorId>(model.tensors.size()); ++t) {
    EXPECT_EQ(hooks.used(t), t != 4 && t != 5)
        << "tensor " << t << ": only the frozen module has no gradient";
    if (!hooks.used(t)) continue;
    for (int64_t i : {int64_t{0}, model.tensors[t].numel() / 2 + 3, model.tensors[t].numel() - 1}) {
      const float p = hooks.master(t)[i], h = 4e-3f;
      hooks.master(t)[i] = p + h;
      const double up = loss();
      hooks.master(t)[i] = p - h;
      const double down = loss();
      hooks.master(t)[i] = p;
      const double fd = (up - down) / (2 * double(h));
      EXPECT_NEAR(hooks.grad(t)[i], fd, 1e-3 * std::fabs(fd) + 1e-6) << "tensor " << t << " element " << i;
    }
  }
}

}  // namespace
}  // namespace strata::testing
