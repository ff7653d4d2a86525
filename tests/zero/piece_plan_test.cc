// The NVMe optimizer's pieces, planned without allocating anything (piece_plan.h).
#include "zero/piece_plan.h"

#include <gtest/gtest.h>

namespace strata::zero {
namespace {

// One module of `numel` elements in chunks of `chunk_elems` at world size `world`.
Layout OneTensor(int64_t numel, int64_t chunk_elems, int world) {
  ModelDecl m;
  m.tensors.push_back({"w", {numel}, std::nullopt});
  m.modules.push_back({"m", {0}});
  auto l = MakeLayout(m, chunk_elems * 4, world);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

PieceInputs Inputs(const Layout& l, int rank, uint64_t sub_group) {
  PieceInputs in;
  in.layout = &l;
  in.stage = 3;
  in.optimizer_on_nvme = in.params_on_nvme = true;
  in.opt_elems = l.shard_elems;
  in.opt_offset = rank * l.shard_elems;
  in.sub_group_size = sub_group;
  return in;
}

TEST(PiecePlan, SubGroupSizeCapsPiecesAndFp32ReadsParamsFromTheMaster) {
  const Layout l = OneTensor(16384, 16384, 2);  // shards of 8192
  PiecePlan p = PlanPieces(Inputs(l, 0, 3000));
  // ceil(8192 / 3000) = 3 pieces of 2731; reading masters wants multiples of 1024, and
  // 3072 would pass the cap of 3000, so 2048: 4 pieces.
  EXPECT_EQ(p.piece_elems, 2048);
  EXPECT_EQ(p.pieces, 4);
  EXPECT_TRUE(p.publish_behind);
  EXPECT_TRUE(p.params_from_master);
  EXPECT_EQ(p.opt_set_bytes, 3u * 2048 * 4);
  EXPECT_EQ(p.grad_slot_bytes, 8192u * 4);
  EXPECT_FALSE(p.warning.empty()) << "24 KiB pieces are small NVMe requests";
}

TEST(PiecePlan, PiecesBelow1024KeepTheParameterSwap) {
  const Layout l = OneTensor(8192, 8192, 1);
  PiecePlan p = PlanPieces(Inputs(l, 0, 1000));
  EXPECT_LE(p.piece_elems, 1000);
  EXPECT_FALSE(p.params_from_master);
  EXPECT_TRUE(p.publish_behind);
}

TEST(PiecePlan, Bf16PublishesBehindWithoutReadingTheMaster) {
  const Layout l = OneTensor(8192, 8192, 1);
  PieceInputs in = Inputs(l, 0, 1'000'000'000);
  in.compute = DType::kBf16;
  PiecePlan p = PlanPieces(in);
  EXPECT_EQ(p.pieces, 1);
  EXPECT_EQ(p.piece_elems, 8192);
  EXPECT_TRUE(p.publish_behind);
  EXPECT_FALSE(p.params_from_master);
  EXPECT_TRUE(p.warning.empty());
}

TEST(PiecePlan, PiecesWhollyInPaddingAreNotLive) {
  // 3000 elements in a 4096-element chunk at world 2: rank 1's shard [2048, 4096) holds
  // 952 elements, then padding; in pieces of 1024 its second piece is padding only.
  const Layout l = OneTensor(3000, 4096, 2);
  ASSERT_EQ(l.shard_elems, 2048);
  PiecePlan p = PlanPieces(Inputs(l, 1, 1024));
  ASSERT_EQ(p.pieces, 2);
  EXPECT_EQ(p.piece_live, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(PlanPieces(Inputs(l, 0, 1024)).piece_live, (std::vector<uint8_t>{1, 1}));
}

TEST(PiecePlan, OptimizerInMemoryHasOnePieceAndNoLiveMap) {
  const Layout l = OneTensor(8192, 8192, 1);
  PieceInputs in = Inputs(l, 0, 1000);
  in.optimizer_on_nvme = false;
  PiecePlan p = PlanPieces(in);
  EXPECT_EQ(p.pieces, 1);
  EXPECT_TRUE(p.piece_live.empty());
  EXPECT_FALSE(p.publish_behind);
}

}  // namespace
}  // namespace strata::zero
