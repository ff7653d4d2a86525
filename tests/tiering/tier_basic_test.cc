// TierManager basics: layout, registration, acquire/release, eviction chains, clean
// drops, OutOfBudget messages, argument errors, the timeline.
#include <gtest/gtest.h>

#include <cstring>

#include "strata/timeline.h"
#include "tier_test_util.h"

namespace strata {
namespace {

using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnvOptions;

TEST(ChunkLayoutTest, ShardsAndPadding) {
  auto l = ChunkLayout::Create(10000, 4096, 2, 1, 1024);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  EXPECT_EQ(l->num_chunks(), 3u);
  EXPECT_EQ(l->shard_elements(), 2048u);
  EXPECT_EQ(l->ChunkValidElements(2), 10000u - 8192u);
  EXPECT_EQ(l->ShardBegin(2, 1), 8192u + 2048u);
  EXPECT_EQ(l->ShardValidElements(2, 1), 0u);  // 1808 real elements all in shard 0
  EXPECT_EQ(l->ShardValidElements(2, 0), 1808u);
  EXPECT_EQ(l->ChunkOf(4096), 1u);
  auto bad = ChunkLayout::Create(10000, 3000, 2, 0, 1024);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("multiple of world size x alignment"), std::string::npos);
  auto fb = ChunkLayout::FromChunkBytes(1 << 20, 64 << 10, 4, 0, 2048);
  ASSERT_TRUE(fb.ok());
  EXPECT_EQ(fb->chunk_elements(), 32768u);
}

TEST(TierBasicTest, ReadBackThroughEveryTier) {
  TierEnvOptions o;
  o.budgets = {8 << 10, 16 << 10, 0};  // device: two 4 KiB blocks, host: four
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  std::vector<std::vector<std::byte>> want;
  for (uint32_t c = 0; c < 8; ++c) {
    want.push_back(Pattern(4096, c));
    ASSERT_TRUE(tm.Register(BlockId{c, 0, kWholeChunk}, Tier::kNvme, want.back()).ok());
  }
  // Touch every block on the device, writing a new version each time.
  for (int round = 0; round < 3; ++round) {
    for (uint32_t c = 0; c < 8; ++c) {
      auto h = tm.Acquire(BlockId{c, 0, kWholeChunk}, Tier::kDevice, Access::kReadWrite, "test");
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      ASSERT_TRUE(h->Wait().ok());
      ASSERT_EQ(std::memcmp(h->data(), want[c].data(), 4096), 0) << "chunk " << c << " round " << round;
      want[c] = Pattern(4096, 100 * (round + 1) + c);
      std::memcpy(h->data(), want[c].data(), 4096);
      h->Release();
    }
  }
  ASSERT_TRUE(tm.WaitAll().ok());
  auto t = tm.Telemetry();
  EXPECT_LE(t.high_water[0], 8u << 10);
  EXPECT_LE(t.high_water[1], 16u << 10);
  EXPECT_GT(t.writebacks, 0u);
  EXPECT_GT(t.lanes[static_cast<int>(Lane::kNvmeWrite)].bytes, 0u);
  // Push everything to NVMe and read it on host.
  for (uint32_t c = 0; c < 8; ++c) {
    ASSERT_TRUE(tm.Evict(BlockId{c, 0, kWholeChunk}, Tier::kDevice).ok());
    ASSERT_TRUE(tm.Evict(BlockId{c, 0, kWholeChunk}, Tier::kHost).ok());
    EXPECT_EQ(tm.ValidTiers(BlockId{c, 0, kWholeChunk}), std::vector<Tier>{Tier::kNvme});
  }
  for (uint32_t c = 0; c < 8; ++c) {
    auto h = tm.Acquire(BlockId{c, 0, kWholeChunk}, Tier::kHost, Access::kRead);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->Wait().ok());
    EXPECT_EQ(std::memcmp(h->data(), want[c].data(), 4096), 0) << "chunk " << c;
  }
}

TEST(TierBasicTest, CleanCopyIsDroppedWithoutWrite) {
  TierEnvOptions o;
  o.budgets = {8 << 10, 16 << 10, 0};
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  BlockId b{0, 0, kWholeChunk};
  ASSERT_TRUE(tm.Register(b, Tier::kNvme, Pattern(4096, 7)).ok());
  uint64_t writes = env.nvme->writes();
  {
    auto h = tm.Acquire(b, Tier::kDevice, Access::kRead);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->Wait().ok());
  }
  EXPECT_EQ(tm.ValidTiers(b), (std::vector<Tier>{Tier::kDevice, Tier::kHost, Tier::kNvme}));
  ASSERT_TRUE(tm.Evict(b, Tier::kDevice).ok());
  ASSERT_TRUE(tm.Evict(b, Tier::kHost).ok());
  EXPECT_EQ(env.nvme->writes(), writes);
  auto t = tm.Telemetry();
  EXPECT_EQ(t.clean_drops, 2u);
  EXPECT_EQ(t.lanes[static_cast<int>(Lane::kD2H)].bytes, 0u);
}

TEST(TierBasicTest, ZeroRegisteredBlocksReadAsZero) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  ASSERT_TRUE(tm.RegisterPlane(1, Tier::kNvme, 0).ok());
  ASSERT_TRUE(tm.Register(BlockId{0, 0, 0}, Tier::kHost).ok());
  auto h = tm.Acquire(BlockId{3, 1, 0}, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(h->Wait().ok());
  std::vector<std::byte> zeros(tm.BlockBytes(BlockId{3, 1, 0}));
  EXPECT_EQ(std::memcmp(h->data(), zeros.data(), zeros.size()), 0);
  EXPECT_EQ(env.nvme->reads(), 0u);  // never written: filled, not read
}

TEST(TierBasicTest, OutOfBudgetNamesTierBudgetAndPinners) {
  TierEnvOptions o;
  o.budgets = {8 << 10, 16 << 10, 0};
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  for (uint32_t c = 0; c < 3; ++c) ASSERT_TRUE(tm.Register(BlockId{c, 0, kWholeChunk}, Tier::kNvme).ok());
  auto a = tm.Acquire(BlockId{0, 0, kWholeChunk}, Tier::kDevice, Access::kRead, "fwd layer 0");
  auto b = tm.Acquire(BlockId{1, 0, kWholeChunk}, Tier::kDevice, Access::kRead, "fwd layer 1");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(a->Wait().ok() && b->Wait().ok());
  auto c = tm.Acquire(BlockId{2, 0, kWholeChunk}, Tier::kDevice, Access::kRead, "fwd layer 2");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kOutOfBudget);
  const std::string& msg = c.status().message();
  EXPECT_NE(msg.find("device tier"), std::string::npos) << msg;
  EXPECT_NE(msg.find("8.00 KiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fwd layer 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fwd layer 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("strata.device_budget"), std::string::npos) << msg;
  a->Release();
  auto c2 = tm.Acquire(BlockId{2, 0, kWholeChunk}, Tier::kDevice, Access::kRead, "fwd layer 2");
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_TRUE(c2->Wait().ok());
}

TEST(TierBasicTest, ArgumentErrors) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  EXPECT_EQ(tm.Register(BlockId{99, 0, 0}, Tier::kHost).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tm.Register(BlockId{0, 5, 0}, Tier::kHost).code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> wrong(100);
  EXPECT_EQ(tm.Register(BlockId{0, 0, 0}, Tier::kHost, wrong).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(tm.Register(BlockId{0, 0, 0}, Tier::kHost).ok());
  EXPECT_EQ(tm.Register(BlockId{0, 0, 0}, Tier::kHost).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tm.Acquire(BlockId{1, 0, 0}, Tier::kHost, Access::kRead).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tm.Acquire(BlockId{0, 0, 0}, Tier::kNvme, Access::kRead).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(tm.Evict(BlockId{0, 0, 0}, Tier::kHost).code(), StatusCode::kFailedPrecondition);  // home
  auto h = tm.Acquire(BlockId{0, 0, 0}, Tier::kDevice, Access::kRead, "reader");
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(h->Wait().ok());
  EXPECT_EQ(tm.Evict(BlockId{0, 0, 0}, Tier::kDevice).code(), StatusCode::kFailedPrecondition);
  // Writing on host while the device copy is pinned would make the pinned copy stale.
  EXPECT_EQ(tm.Acquire(BlockId{0, 0, 0}, Tier::kHost, Access::kReadWrite).status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_EQ(tm.Unregister(BlockId{0, 0, 0}).code(), StatusCode::kFailedPrecondition);
  h->Release();
  EXPECT_TRUE(tm.Unregister(BlockId{0, 0, 0}).ok());
}

TEST(TierBasicTest, MovesAppearOnTheTimeline) {
  Timeline timeline;
  TierEnvOptions o;
  o.budgets = {8 << 10, 16 << 10, 0};
  auto env = MakeTierEnv(o);
  // A manager recording on a caller's timeline.
  TierManagerOptions opts = env.tm->options();
  opts.timeline = &timeline;
  env.tm.reset();
  auto tm = TierManager::Create(opts);
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  ASSERT_TRUE((*tm)->Register(BlockId{0, 0, kWholeChunk}, Tier::kNvme, Pattern(4096, 1)).ok());
  {
    auto h = (*tm)->Acquire(BlockId{0, 0, kWholeChunk}, Tier::kDevice, Access::kRead);
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->Wait().ok());
  }
  ASSERT_TRUE((*tm)->WaitAll().ok());
  bool saw_h2d = false;
  for (const auto& s : timeline.Spans()) {
    if (timeline.TrackName(s.track) == "h2d" && s.bytes == 4096) saw_h2d = true;
  }
  EXPECT_TRUE(saw_h2d);
  std::string json = timeline.ToChromeTraceJson();
  EXPECT_NE(json.find("\"thread_name\""), std::string::npos);
  EXPECT_NE(json.find("nvme-read"), std::string::npos);
  EXPECT_GT(timeline.BusySeconds(timeline.AddTrack("h2d")), 0.0);
}

TEST(TimelineTest, BusyTimeIsTheUnionOfSpans) {
  Timeline t;
  int a = t.AddTrack("a");
  EXPECT_EQ(t.AddTrack("a"), a);
  auto o = t.origin();
  using std::chrono::milliseconds;
  t.Record(a, "x", o + milliseconds(0), o + milliseconds(10));
  t.Record(a, "y", o + milliseconds(5), o + milliseconds(15));   // overlaps 5 ms
  t.Record(a, "z", o + milliseconds(20), o + milliseconds(30), 64);
  EXPECT_NEAR(t.BusySeconds(a), 0.025, 1e-9);
  auto stats = t.Stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].spans, 3u);
  EXPECT_EQ(stats[0].bytes, 64u);
  Timeline off(false);
  int b = off.AddTrack("b");
  off.Record(b, "x", o, o + milliseconds(1));
  EXPECT_TRUE(off.Spans().empty());
  EXPECT_GT(off.BusySeconds(b), 0.0);
}

}  // namespace
}  // namespace strata
