// The parameter layout (layout.h): chunk size, packing, and runs for tensors larger than
// a chunk.
#include "zero/layout.h"

#include <gtest/gtest.h>

#include "strata/model.h"

namespace strata::zero {
namespace {

// One module per entry, each of the given tensors.
ModelDecl Modules(const std::vector<std::vector<int64_t>>& modules) {
  ModelDecl m;
  for (size_t i = 0; i < modules.size(); ++i) {
    ModuleDecl mod{"m" + std::to_string(i), {}};
    for (int64_t n : modules[i]) {
      mod.tensors.push_back(static_cast<TensorId>(m.tensors.size()));
      m.tensors.push_back({"t" + std::to_string(m.tensors.size()), {n}, std::nullopt});
    }
    m.modules.push_back(std::move(mod));
  }
  return m;
}

Layout Make(const ModelDecl& m, uint64_t chunk_bytes, int world = 1) {
  auto l = MakeLayout(m, chunk_bytes, world);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

TEST(Layout, UniformModulesRaiseTheChunkAsBefore) {
  // Every module larger than the asked chunk: the chunk is raised to one module, so a
  // weight and its bias share it and nothing runs.
  const Layout l = Make(Modules({{8192, 64}, {8192, 64}, {8192, 64}}), 2048 * 4);
  EXPECT_EQ(l.chunk_elems, 10240);
  EXPECT_EQ(l.num_chunks, 3);
  for (int c = 0; c < l.num_chunks; ++c) EXPECT_FALSE(l.InRun(c));
  EXPECT_EQ(l.module_chunks[1], (std::vector<int>{1}));
}

TEST(Layout, AnOutlierTensorTakesARunOfItsOwn) {
  // GPT-2's shape in small: an embedding 10x the blocks. The chunk stays at the blocks'
  // size; the embedding takes 5 whole chunks, and what follows packs into the last.
  const Layout l = Make(Modules({{20000, 100}, {2048}, {2048}, {2048}, {2048}}), 4096 * 4);
  ASSERT_EQ(l.chunk_elems, 4096);
  const TensorPlace& emb = l.tensors[0];
  EXPECT_EQ(emb.chunk, 0);
  EXPECT_EQ(emb.offset, 0);
  EXPECT_EQ(l.LastChunk(0), 4);  // 20000 elements over 5 chunks of 4096
  for (int c = 0; c <= 4; ++c) {
    EXPECT_EQ(l.run_first[c], 0) << c;
    EXPECT_EQ(l.run_length[c], 5) << c;
  }
  // The next tensor (100) packs after the run's end in chunk 4: 20000 - 4 x 4096 = 3616.
  EXPECT_EQ(l.tensors[1].chunk, 4);
  EXPECT_EQ(l.tensors[1].offset, 3616);
  EXPECT_EQ(l.StartIn(0, 4), -4 * 4096);
  EXPECT_EQ(l.module_chunks[0], (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(l.InRun(5));
  // Padding is only where no tensor lies: chunk 0 has none, chunk 4 after 3716.
  EXPECT_TRUE(l.chunk_gaps[0].empty());
  ASSERT_EQ(l.chunk_gaps[4].size(), 1u);
  EXPECT_EQ(l.chunk_gaps[4][0], (std::pair<int64_t, int64_t>{3716, 4096}));
}

TEST(Layout, ARunStartsAtAChunkBoundary) {
  // A small tensor first: the large one starts in the next chunk, not mid-chunk.
  const Layout l = Make(Modules({{100}, {10000}, {100}, {100}, {100}}), 4096 * 4, 2);
  ASSERT_EQ(l.chunk_elems, 4096);  // world 2 x 2048
  EXPECT_EQ(l.tensors[1].chunk, 1);
  EXPECT_EQ(l.tensors[1].offset, 0);
  EXPECT_FALSE(l.InRun(0));
  EXPECT_TRUE(l.InRun(1));
  EXPECT_EQ(l.run_length[1], 3);
  EXPECT_EQ(l.chunk_gaps[0], (std::vector<std::pair<int64_t, int64_t>>{{100, 4096}}));
  for (int c = 1; c <= 3; ++c) {
    ASSERT_FALSE(l.chunk_tensors[c].empty());
    EXPECT_EQ(l.chunk_tensors[c][0], 1);
  }
}

TEST(Layout, TwoRunsNeverShareAChunk) {
  const Layout l =
      Make(Modules({{5000}, {5000}, {100}, {100}, {100}, {100}, {100}, {100}, {100}, {100}}), 4096 * 4);
  EXPECT_EQ(l.tensors[0].chunk, 0);
  EXPECT_EQ(l.tensors[1].chunk, 2) << "the second run starts after the first's tail";
  EXPECT_EQ(l.run_first[1], 0);
  EXPECT_EQ(l.run_first[2], 2);
  EXPECT_EQ(l.run_first[3], 2);
  EXPECT_EQ(l.tensors[2].chunk, 3);
  EXPECT_EQ(l.tensors[2].offset, 5000 - 4096);
}

TEST(Layout, ATiedTensorIsPlacedOnce) {
  ModelDecl m = Modules({{20000}, {2048}, {2048}, {2048}, {2048}, {2048}, {2048}});
  m.modules.push_back({"head", {0}});  // the embedding again, as a tied LM head
  const Layout l = Make(m, 4096 * 4);
  EXPECT_EQ(l.num_params, 20000 + 6 * 2048);
  EXPECT_TRUE(l.InRun(0));
  EXPECT_EQ(l.module_chunks[7], l.module_chunks[0]);
}

TEST(Layout, ManyLargeModulesAreTheShapeNotOutliers) {
  // An MLP with small ends: the middle module is more than 4x the median, but one of
  // three is no outlier: the chunk is raised to it and nothing runs.
  const Layout l = Make(Modules({{64 * 1536, 1536}, {1536 * 1536, 1536}, {1536 * 64, 64}}), 4096 * 4);
  EXPECT_GE(l.chunk_elems, 1536 * 1536 + 1536);
  for (int c = 0; c < l.num_chunks; ++c) EXPECT_FALSE(l.InRun(c));
}

}  // namespace
}  // namespace strata::zero
