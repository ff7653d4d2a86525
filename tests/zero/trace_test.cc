// The model declaration's checks, the layout of shared tensors, and the recorded call
// order (layout.h, trace.h).
#include "zero/trace.h"

#include <gtest/gtest.h>

#include "zero/keep_plan.h"
#include "zero/layout.h"

namespace strata::zero {
namespace {

// Three modules over four tensors; the first and the last share tensor 0 (tied).
ModelDecl Tied() {
  ModelDecl m;
  m.tensors = {{"embed", {48, 32}, std::nullopt},
               {"block.w", {32, 32}, std::nullopt},
               {"block.b", {32}, std::nullopt},
               {"head.b", {64}, std::nullopt}};
  m.modules = {{"embed", {0}}, {"block", {1, 2}}, {"head", {0, 3}}};
  return m;
}

TEST(ModelDecl, FaultsAreRefusedByName) {
  EXPECT_TRUE(ValidateModel(Tied()).ok());
  ModelDecl m = Tied();
  m.modules[1].tensors = {1, 1, 2};
  EXPECT_NE(ValidateModel(m).message().find("lists tensor \"block.w\" twice"), std::string::npos);
  m = Tied();
  m.modules[2].tensors = {0, 7};
  EXPECT_NE(ValidateModel(m).message().find("tensor id 7"), std::string::npos);
  m = Tied();
  m.modules[2].tensors = {0};
  EXPECT_NE(ValidateModel(m).message().find("\"head.b\" is in no module"), std::string::npos);
  m = Tied();
  m.tensors[2].shape = {0};
  EXPECT_NE(ValidateModel(m).message().find("\"block.b\" has no elements"), std::string::npos);
  EXPECT_EQ(ValidateModel(ModelDecl{}).code(), StatusCode::kInvalidArgument);
}

TEST(Layout, ASharedTensorIsPlacedOnce) {
  auto l = MakeLayout(Tied(), 4096 * 4, 1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->num_params, 48 * 32 + 32 * 32 + 32 + 64);
  EXPECT_EQ(l->num_chunks, 1);
  // In the order modules first use them: embed, block.w, block.b, head.b.
  EXPECT_EQ(l->tensors[0].offset, 0);
  EXPECT_EQ(l->tensors[1].offset, 48 * 32);
  EXPECT_EQ(l->tensors[3].offset, 48 * 32 + 32 * 32 + 32);
  EXPECT_EQ(l->module_chunks[2], (std::vector<int>{0}));
  EXPECT_EQ(l->module_params[2], 48 * 32 + 64);
}

TEST(Trace, ChunkUsesCountEveryBackwardOfATiedTensor) {
  // Chunks of 2048 elements: the embedding alone, then the block and head.b.
  auto l = MakeLayout(Tied(), 2048 * 4, 1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->num_chunks, 2);
  EXPECT_EQ(l->module_chunks[2], (std::vector<int>{0, 1}));
  const Trace plain = Trace::Assumed(3);
  EXPECT_EQ(plain.size(), 6);
  EXPECT_EQ(plain.forward_end(), 3);
  const ChunkUses u = UsesOf(plain, *l);
  EXPECT_EQ(u.backward_uses, (std::vector<int>{2, 2}));  // the embedding: its module's and the head's
  EXPECT_EQ(u.first_use[0], 0);
  EXPECT_EQ(u.last_use[0], 5);
  EXPECT_EQ(u.last_forward_use[0], 2);
  EXPECT_EQ(u.first_backward_phase_use[0], 3);
  // Between the head's forward and its backward nothing runs: the tied chunk's reuse
  // distance is 0, so a keep plan with one spare buffer keeps it first.
  EXPECT_EQ(ReuseDistances(*l, plain)[0], 0);
}

TEST(CallOrder, RecordsTheFirstMicroBatchAndReportsAChange) {
  auto l = MakeLayout(Tied(), 2048 * 4, 1);
  ASSERT_TRUE(l.ok());
  CallOrder order(*l);
  const std::vector<ModuleUse> plain = Trace::Assumed(3).uses();
  for (const ModuleUse& u : plain) order.Note(u.kind, u.module);
  EXPECT_FALSE(order.diverged());
  EXPECT_FALSE(order.EndMicroBatch().has_value()) << "the plain order needs no new recording";
  // Recompute of the block inside the backward.
  const std::vector<ModuleUse> recompute = {
      {UseKind::kForward, 0}, {UseKind::kForward, 1},  {UseKind::kForward, 2}, {UseKind::kBackward, 2},
      {UseKind::kForward, 1}, {UseKind::kBackward, 1}, {UseKind::kBackward, 0}};
  for (int p = 0; p < static_cast<int>(recompute.size()); ++p) {
    EXPECT_EQ(order.Note(recompute[p].kind, recompute[p].module), p);
    EXPECT_EQ(order.diverged(), p >= 4) << p;
  }
  auto change = order.EndMicroBatch();
  ASSERT_TRUE(change.has_value());
  EXPECT_NE(change->find("at use 4 (expected backward of module 1, got forward of module 1)"),
            std::string::npos)
      << *change;
  EXPECT_EQ(order.trace().uses(), recompute);
  // The same again: followed, nothing to say.
  for (const ModuleUse& u : recompute) order.Note(u.kind, u.module);
  EXPECT_FALSE(order.diverged());
  EXPECT_FALSE(order.EndMicroBatch().has_value());
  // A frozen head (no backward): shorter, so recorded again.
  for (int p = 0; p < 3; ++p) order.Note(UseKind::kForward, p);
  order.Note(UseKind::kBackward, 1);
  EXPECT_TRUE(order.diverged());
  ASSERT_TRUE(order.EndMicroBatch().has_value());
  EXPECT_EQ(order.uses().backward_uses, (std::vector<int>{0, 1}));
}

}  // namespace
}  // namespace strata::zero
