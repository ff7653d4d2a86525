// Which chunks of an NVMe optimizer stay in pinned memory (residency_plan.h), worked by
// hand on small layouts.
#include "zero/residency_plan.h"

#include <gtest/gtest.h>

#include "strata/model.h"

namespace strata::zero {
namespace {

using K = UseKind;

ModelDecl Modules(int n) {
  ModelDecl m;
  for (int i = 0; i < n; ++i) {
    m.tensors.push_back({"w" + std::to_string(i), {4096}, std::nullopt});
    m.modules.push_back({"m" + std::to_string(i), {static_cast<TensorId>(i)}});
  }
  return m;
}

// One module per chunk of 4096 elements.
Layout Chunks(int n) {
  auto l = MakeLayout(Modules(n), 4096 * 4, 1);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->num_chunks, n);
  return *l;
}

// Four chunks, one piece each; a staging set of 100 bytes, a resident chunk 300.
ResidencyInputs Inputs(const Layout& l, const Trace& t, uint64_t room, double fraction = -1) {
  ResidencyInputs in;
  in.layout = &l;
  in.trace = &t;
  in.pieces = 1;
  in.set_bytes = 100;
  in.chunk_bytes = 300;
  in.room = room;
  in.fraction = fraction;
  return in;
}

TEST(ResidencyPlan, ThePlainOrderKeepsTheChunksTheBackwardFinishesLast) {
  const Layout l = Chunks(4);
  EXPECT_EQ(ResidencyOrder(l, Trace::Assumed(4)), (std::vector<int>{0, 1, 2, 3}));
}

TEST(ResidencyPlan, ParameterShardsStayInTheOrderTheForwardNeedsThem) {
  const Layout l = Chunks(4);
  EXPECT_EQ(ParamResidencyOrder(l, Trace::Assumed(4)), (std::vector<int>{0, 1, 2, 3}));
  // A forward that runs the modules in another order (module 2 first, then 0, 3, 1).
  const Trace shuffled({{K::kForward, 2},
                        {K::kForward, 0},
                        {K::kForward, 3},
                        {K::kForward, 1},
                        {K::kBackward, 1},
                        {K::kBackward, 3},
                        {K::kBackward, 0},
                        {K::kBackward, 2}});
  EXPECT_EQ(ParamResidencyOrder(l, shuffled), (std::vector<int>{2, 0, 3, 1}));
  // A module the forward skips (used in backward only, say a recomputed one) comes after
  // every module the forward uses.
  const Trace late({{K::kForward, 0},
                    {K::kForward, 2},
                    {K::kForward, 3},
                    {K::kBackward, 3},
                    {K::kBackward, 1},
                    {K::kBackward, 2},
                    {K::kBackward, 0}});
  EXPECT_EQ(ParamResidencyOrder(l, late), (std::vector<int>{0, 2, 3, 1}));
}

TEST(ResidencyPlan, AFrozenModuleComesLastAndATiedOneByItsLastUse) {
  const Layout l = Chunks(3);
  // Module 0 frozen (no backward): its last use is the first forward.
  const Trace frozen(
      {{K::kForward, 0}, {K::kForward, 1}, {K::kForward, 2}, {K::kBackward, 2}, {K::kBackward, 1}});
  EXPECT_EQ(ResidencyOrder(l, frozen), (std::vector<int>{1, 2, 0}));
  // Module 2 used again at the very end (a tied weight's second backward).
  const Trace tied({{K::kForward, 0},
                    {K::kForward, 1},
                    {K::kForward, 2},
                    {K::kBackward, 1},
                    {K::kBackward, 0},
                    {K::kBackward, 2}});
  EXPECT_EQ(ResidencyOrder(l, tied), (std::vector<int>{2, 0, 1}));
}

TEST(ResidencyPlan, AutoTakesTheMostChunksThatFitBesideThePipeline) {
  const Layout l = Chunks(4);
  const Trace t = Trace::Assumed(4);
  // Two resident (600) and the two sets the other two chunks want (one fixed, 100 more).
  ResidencyPlan p = PlanResidency(Inputs(l, t, 700));
  EXPECT_EQ(p.count, 2);
  EXPECT_EQ(p.resident, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(p.staging_sets, 2);
  EXPECT_EQ(p.extra_bytes, 700u);
  // One byte short: one resident (300), and the three sets the rest want (200 more).
  p = PlanResidency(Inputs(l, t, 699));
  EXPECT_EQ(p.count, 1);
  EXPECT_EQ(p.resident, (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(p.staging_sets, 3);
  EXPECT_EQ(p.extra_bytes, 500u);
}

TEST(ResidencyPlan, EveryChunkResidentNeedsNoMoreSets) {
  const Layout l = Chunks(4);
  const Trace t = Trace::Assumed(4);
  ResidencyPlan p = PlanResidency(Inputs(l, t, 1200));
  EXPECT_EQ(p.count, 4);
  EXPECT_EQ(p.staging_sets, 1);
  EXPECT_EQ(p.extra_bytes, 1200u);
  // 1199: three resident (900) and the one set the last chunk wants (the fixed one).
  p = PlanResidency(Inputs(l, t, 1199));
  EXPECT_EQ(p.count, 3);
  EXPECT_EQ(p.staging_sets, 1);
  EXPECT_EQ(p.extra_bytes, 900u);
}

TEST(ResidencyPlan, NoRoomLeavesEverythingOnDiskWithWhatSetsFit) {
  const Layout l = Chunks(4);
  const Trace t = Trace::Assumed(4);
  ResidencyPlan p = PlanResidency(Inputs(l, t, 0));
  EXPECT_EQ(p.count, 0);
  EXPECT_EQ(p.staging_sets, 1);
  EXPECT_EQ(p.extra_bytes, 0u);
  // 299: no chunk fits, so the room deepens the pipeline up to four sets.
  p = PlanResidency(Inputs(l, t, 299));
  EXPECT_EQ(p.count, 0);
  EXPECT_EQ(p.staging_sets, 3);
  p = PlanResidency(Inputs(l, t, 10000, /*fraction=*/0));
  EXPECT_EQ(p.count, 0);
  EXPECT_EQ(p.staging_sets, 4);
  EXPECT_EQ(p.extra_bytes, 300u);
}

TEST(ResidencyPlan, AnExplicitFractionIsHeldAndTheRoomGoesToSets) {
  const Layout l = Chunks(4);
  const Trace t = Trace::Assumed(4);
  // The state of the fraction's chunks is in the fixed needs: the room is for sets only.
  ResidencyPlan p = PlanResidency(Inputs(l, t, 1000, 0.5));
  EXPECT_EQ(p.count, 2);
  EXPECT_EQ(p.resident, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(p.staging_sets, 2);
  EXPECT_EQ(p.extra_bytes, 100u);
  EXPECT_EQ(ResidentCount(4, 0.3), 1);
  EXPECT_EQ(ResidentCount(4, 0.4), 2);
  EXPECT_EQ(ResidentCount(4, 1.0), 4);
  EXPECT_EQ(ResidentCount(3, 0.5), 2);  // 1.5 rounds away from zero
}

// Gradients on the NVMe path: a resident chunk is 300 bytes, 100 of them its gradient
// shard. Shards that go to disk and back every step may be kept on their own.
ResidencyInputs WithGrads(const Layout& l, const Trace& t, uint64_t room, bool grads_first) {
  ResidencyInputs in = Inputs(l, t, room);
  in.grad_bytes = 100;
  in.keep_grads = true;
  in.grads_first = grads_first;
  return in;
}

TEST(ResidencyPlan, StateFirstThenGradientShardsThenStagingSets) {
  const Layout l = Chunks(4);
  const Trace t = Trace::Assumed(4);
  // 850: two resident chunks (600) beside their pipeline (one more set, 100); the 250
  // left keeps one more chunk's gradient shard (100), not two: the two chunks on disk
  // want two sets, and the pipeline keeps them (kMinStagingSets caps it at three).
  ResidencyPlan p = PlanResidency(WithGrads(l, t, 850, false));
  EXPECT_EQ(p.count, 2);
  EXPECT_EQ(p.resident, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(p.grad_count, 1);
  EXPECT_EQ(p.grad_resident, (std::vector<uint8_t>{0, 0, 1, 0}));
  EXPECT_EQ(p.staging_sets, 2);
  EXPECT_EQ(p.extra_bytes, 800u);
  // Without keep_grads (they never touch the disk) the room deepens the pipeline.
  ResidencyInputs off = WithGrads(l, t, 850, false);
  off.keep_grads = false;
  p = PlanResidency(off);
  EXPECT_EQ(p.grad_count, 0);
  EXPECT_EQ(p.grad_resident, (std::vector<uint8_t>{0, 0, 0, 0}));
  EXPECT_EQ(p.staging_sets, 2);
  EXPECT_EQ(p.extra_bytes, 700u);
}

TEST(ResidencyPlan, WithAccumulationGradientShardsComeBeforeState) {
  const Layout l = Chunks(4);
  const Trace t = Trace::Assumed(4);
  // 700: state first would keep two chunks (as in the test above). Gradients first keep
  // all four shards (400) and no chunk's state fits beside its pipeline; the 300 left
  // are the three sets the four chunks on disk want.
  ResidencyPlan p = PlanResidency(WithGrads(l, t, 700, true));
  EXPECT_EQ(p.count, 0);
  EXPECT_EQ(p.grad_count, 4);
  EXPECT_EQ(p.grad_resident, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(p.staging_sets, 4);
  EXPECT_EQ(p.extra_bytes, 700u);
  // 699: the shards still, and two of the three sets.
  p = PlanResidency(WithGrads(l, t, 699, true));
  EXPECT_EQ(p.grad_count, 4);
  EXPECT_EQ(p.staging_sets, 3);
  EXPECT_EQ(p.extra_bytes, 600u);
  // 350: one shard, and the two sets beyond the fixed one that keep the reads from
  // waiting for the writes (kMinStagingSets) before a second shard.
  p = PlanResidency(WithGrads(l, t, 350, true));
  EXPECT_EQ(p.count, 0);
  EXPECT_EQ(p.grad_resident, (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(p.staging_sets, 3);
  EXPECT_EQ(p.extra_bytes, 300u);
  // 150: no shard beside those two sets; the room buys the one set it holds.
  p = PlanResidency(WithGrads(l, t, 150, true));
  EXPECT_EQ(p.grad_count, 0);
  EXPECT_EQ(p.staging_sets, 2);
  EXPECT_EQ(p.extra_bytes, 100u);
  // 1000: all four shards (400), then the state of three chunks (200 each, their shards
  // already paid): 1000, and the one chunk left on disk wants no set beyond the fixed one.
  p = PlanResidency(WithGrads(l, t, 1000, true));
  EXPECT_EQ(p.count, 3);
  EXPECT_EQ(p.resident, (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(p.grad_count, 1);
  EXPECT_EQ(p.grad_resident, (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(p.staging_sets, 1);
  EXPECT_EQ(p.extra_bytes, 1000u);
}

TEST(ResidencyPlan, AnExplicitGradientFractionIsPaidAndTheRestIsAuto) {
  const Layout l = Chunks(4);
  const Trace t = Trace::Assumed(4);
  // Half the shards in the fixed needs; the state of a chunk among them costs only its
  // 200, so 500 holds two chunks (400) and the one more set the other two want.
  ResidencyInputs in = Inputs(l, t, 500);
  in.grad_bytes = 100;
  in.grad_fraction = 0.5;
  ResidencyPlan p = PlanResidency(in);
  EXPECT_EQ(p.count, 2);
  EXPECT_EQ(p.grad_count, 0);
  EXPECT_EQ(p.staging_sets, 2);
  EXPECT_EQ(p.extra_bytes, 500u);
  // With no state resident the fraction's shards are the first along the order.
  in.fraction = 0;
  p = PlanResidency(in);
  EXPECT_EQ(p.count, 0);
  EXPECT_EQ(p.grad_resident, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(p.staging_sets, 4);
  EXPECT_EQ(p.extra_bytes, 300u);
  // Gradients that wait elsewhere (grad_bytes 0) have no shard to keep.
  in.grad_bytes = 0;
  p = PlanResidency(in);
  EXPECT_EQ(p.grad_count, 0);
}

}  // namespace
}  // namespace strata::zero
