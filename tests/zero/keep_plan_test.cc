// Which stage-3 chunks stay gathered from forward to backward (keep_plan.h).
#include "zero/keep_plan.h"

#include <gtest/gtest.h>

#include "strata/model.h"

namespace strata::zero {
namespace {

// Modules of the given parameter counts, one tensor each.
ModelDecl Modules(const std::vector<int64_t>& numels) {
  ModelDecl m;
  for (size_t i = 0; i < numels.size(); ++i) {
    m.tensors.push_back({"w" + std::to_string(i), {numels[i]}, std::nullopt});
    m.modules.push_back({"m" + std::to_string(i), {static_cast<TensorId>(i)}});
  }
  return m;
}

// The plain order: forward 0..n-1, backward n-1..0.
Trace Plain(const Layout& l) { return Trace::Assumed(l.num_modules()); }

// A chunk of exactly 4096 elements (2 alignment units), one module per chunk.
Layout FourChunks() {
  auto l = MakeLayout(Modules({4096, 4096, 4096, 4096}), 4096 * 4, 1);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->num_chunks, 4);
  return *l;
}

TEST(KeepPlan, ReuseDistanceIsWhatRunsBetweenTheTwoUses) {
  // Chunk c is used by module c; between its forward and its backward run the modules
  // after it, forward and then backward.
  EXPECT_EQ(ReuseDistances(FourChunks(), Plain(FourChunks())),
            (std::vector<int64_t>{6 * 4096, 4 * 4096, 2 * 4096, 0}));
}

TEST(KeepPlan, KeepsTheNearestReusesWithinTheSpareBuffers) {
  const Layout l = FourChunks();
  KeepPlan two = PlanKeep(l, Plain(l), 1'000'000'000, 0, 2);
  EXPECT_EQ(two.kept, (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(two.reused, 2);
  EXPECT_EQ(two.persistent, 0);
  EXPECT_EQ(PlanKeep(l, Plain(l), 1'000'000'000, 0, 10).total(), 4) << "no more than there are chunks";
  EXPECT_EQ(PlanKeep(l, Plain(l), 1'000'000'000, 0, 0).total(), 0) << "no spare buffer, nothing kept";
}

TEST(KeepPlan, HonoursTheMaxReuseDistance) {
  const Layout l = FourChunks();
  // Distance 0: only the last module's chunk, whose backward follows its forward.
  EXPECT_EQ(PlanKeep(l, Plain(l), 0, 0, 4).kept, (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(PlanKeep(l, Plain(l), 4 * 4096, 0, 4).kept, (std::vector<uint8_t>{0, 1, 1, 1}));
  EXPECT_EQ(PlanKeep(l, Plain(l), 4 * 4096 - 1, 0, 4).kept, (std::vector<uint8_t>{0, 0, 1, 1}));
}

TEST(KeepPlan, ChunksOfSmallTensorsPersistWhateverTheBudget) {
  // Chunk 0 holds modules 0 and 1 (small), chunk 1 module 2 (large), chunk 2 module 3.
  auto l = MakeLayout(Modules({1000, 1000, 4096, 100}), 4096 * 4, 1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->num_chunks, 3);
  KeepPlan p = PlanKeep(*l, Plain(*l), 0, 2000, 0);
  EXPECT_EQ(p.kept, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(p.persistent, 2);
  EXPECT_EQ(p.reused, 0);
  // The spare buffers go to the nearest reuse not already kept.
  KeepPlan q = PlanKeep(*l, Plain(*l), 1'000'000'000, 2000, 1);
  EXPECT_EQ(q.kept, (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(q.reused, 1);
  // The threshold is strict: a tensor of exactly the threshold does not persist.
  EXPECT_EQ(PlanKeep(*l, Plain(*l), 0, 1000, 0).kept, (std::vector<uint8_t>{0, 0, 1}));
}

TEST(KeepPlan, PeakCountsWhatTheWindowAndTheKeptChunksHoldTogether) {
  const Layout l = FourChunks();
  EXPECT_EQ(PeakGathered(l, Plain(l), {0, 0, 0, 0}, 0), 1) << "one module's chunk at a time";
  EXPECT_EQ(PeakGathered(l, Plain(l), {1, 1, 1, 1}, 0), 4);
  EXPECT_EQ(PeakGathered(l, Plain(l), {0, 0, 0, 0}, 1), 2) << "the running module's and the next one's";
  // The window already holds the last chunks over the turn: keeping them costs nothing.
  EXPECT_EQ(PeakGathered(l, Plain(l), {0, 0, 1, 1}, 1), 2);
  EXPECT_EQ(PeakGathered(l, Plain(l), {0, 1, 1, 1}, 1), 3);
  EXPECT_EQ(PeakGathered(l, Plain(l), {0, 0, 0, 0}, 9), 4)
      << "a window past the trace's end holds no more than it all";
}

TEST(KeepPlan, CarryDistanceIsWhatRunsBetweenTwoMicroBatches) {
  // From chunk c's last backward use to its next forward use run the modules before it,
  // backward and then forward.
  const Layout l = FourChunks();
  EXPECT_EQ(CarryDistances(l, Plain(l)), (std::vector<int64_t>{0, 2 * 4096, 4 * 4096, 6 * 4096}));
  EXPECT_EQ(PlanCarry(l, Plain(l), 1'000'000'000, 2), (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(PlanCarry(l, Plain(l), 1'000'000'000, 9), (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_EQ(PlanCarry(l, Plain(l), 2 * 4096 - 1, 4), (std::vector<uint8_t>{1, 0, 0, 0}))
      << "within the reuse distance";
}

TEST(KeepPlan, CarriedChunksStayOnlyBetweenMicroBatchesOfOneStep) {
  const Layout l = FourChunks();
  const std::vector<uint8_t> none(4, 0), all(4, 1), first{1, 0, 0, 0}, two{1, 1, 0, 0};
  // A carried chunk stays after its last backward use unless the step follows ...
  EXPECT_TRUE(StaysGathered(UsesOf(Plain(l), l), none, first, 0, 7, /*last_micro_batch=*/false));
  EXPECT_FALSE(StaysGathered(UsesOf(Plain(l), l), none, first, 0, 7, /*last_micro_batch=*/true));
  // ... and in the next forward until the last module that uses it has run.
  EXPECT_FALSE(StaysGathered(UsesOf(Plain(l), l), none, first, 0, 0, false));
  EXPECT_FALSE(StaysGathered(UsesOf(Plain(l), l), none, first, 1, 7, false)) << "not carried";
  // Only the backward's last chunks are held over the boundary: chunk 0 alone costs no
  // buffer (the module that ends backward starts forward), each one more costs one.
  EXPECT_EQ(PeakGathered(l, Plain(l), none, 0, first, 2), 1);
  EXPECT_EQ(PeakGathered(l, Plain(l), none, 0, two, 2), 2);
  EXPECT_EQ(PeakGathered(l, Plain(l), none, 0, all, 3), 4);
  EXPECT_EQ(PeakGathered(l, Plain(l), none, 0, all, 1), 1) << "one micro-batch per step: nothing is carried";
}

}  // namespace
}  // namespace strata::zero
