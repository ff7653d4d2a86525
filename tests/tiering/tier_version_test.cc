// Speculative versions over two NVMe slots: commit flips, rollback discards, and a
// "crash" (the manager destroyed between write and commit) leaves the old version intact
// in the store.
#include <gtest/gtest.h>

#include <cstring>

#include "tier_test_util.h"

namespace strata {
namespace {

using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnvOptions;

const BlockId kB{0, 1, kWholeChunk};  // an f32 block: 8 KiB, two 4 KiB slots per version

std::vector<std::byte> Read(TierManager& tm, Tier tier = Tier::kHost) {
  auto h = tm.Acquire(kB, tier, Access::kRead);
  EXPECT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->Wait().ok());
  auto* p = static_cast<const std::byte*>(h->data());
  return std::vector<std::byte>(p, p + tm.BlockBytes(kB));
}

void Write(TierManager& tm, const std::vector<std::byte>& bytes) {
  auto h = tm.Acquire(kB, Tier::kHost, Access::kOverwrite);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(h->Wait().ok());
  std::memcpy(h->data(), bytes.data(), bytes.size());
}

TEST(TierVersionTest, RollbackRestoresTheCommittedVersionWithoutIo) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  auto a = Pattern(8192, 1), b = Pattern(8192, 2);
  ASSERT_TRUE(tm.Register(kB, Tier::kNvme, a).ok());
  std::vector<BlockId> blocks{kB};
  ASSERT_TRUE(tm.BeginVersion(blocks).ok());
  Write(tm, b);
  ASSERT_TRUE(tm.Evict(kB, Tier::kHost).ok());  // the tentative version goes to the other slot
  EXPECT_EQ(Read(tm), b);
  ASSERT_TRUE(tm.Evict(kB, Tier::kHost).ok());
  uint64_t writes = env.nvme->writes();
  ASSERT_TRUE(tm.Rollback(blocks).ok());
  EXPECT_EQ(env.nvme->writes(), writes);
  EXPECT_EQ(Read(tm), a);
  // Also when the tentative version never left host memory.
  ASSERT_TRUE(tm.BeginVersion(blocks).ok());
  Write(tm, b);
  ASSERT_TRUE(tm.Rollback(blocks).ok());
  EXPECT_EQ(Read(tm), a);
  EXPECT_EQ(Read(tm, Tier::kDevice), a);
}

TEST(TierVersionTest, CommitMakesTheNewVersionCurrent) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  auto a = Pattern(8192, 1), b = Pattern(8192, 2), c = Pattern(8192, 3);
  ASSERT_TRUE(tm.Register(kB, Tier::kNvme, a).ok());
  std::vector<BlockId> blocks{kB};
  ASSERT_TRUE(tm.BeginVersion(blocks).ok());
  Write(tm, b);
  ASSERT_TRUE(tm.Evict(kB, Tier::kHost).ok());
  ASSERT_TRUE(tm.Commit(blocks).ok());
  EXPECT_EQ(Read(tm), b);
  ASSERT_TRUE(tm.Evict(kB, Tier::kHost).ok());
  EXPECT_EQ(tm.ValidTiers(kB), std::vector<Tier>{Tier::kNvme});
  // Commit of a version still only in host memory; it is written (and flipped) later.
  ASSERT_TRUE(tm.BeginVersion(blocks).ok());
  Write(tm, c);
  ASSERT_TRUE(tm.Commit(blocks).ok());
  ASSERT_TRUE(tm.Evict(kB, Tier::kHost).ok());
  EXPECT_EQ(Read(tm), c);
  // A rollback now goes back to c, not to a or b.
  ASSERT_TRUE(tm.BeginVersion(blocks).ok());  // c is durable: no write needed
  Write(tm, a);
  ASSERT_TRUE(tm.Rollback(blocks).ok());
  EXPECT_EQ(Read(tm), c);
}

TEST(TierVersionTest, BeginVersionMakesADirtyBlockDurableFirst) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  auto a = Pattern(8192, 1), b = Pattern(8192, 2), c = Pattern(8192, 3);
  ASSERT_TRUE(tm.Register(kB, Tier::kNvme, a).ok());
  Write(tm, b);  // dirty on host, not durable
  std::vector<BlockId> blocks{kB};
  uint64_t writes = env.nvme->writes();
  ASSERT_TRUE(tm.BeginVersion(blocks).ok());
  EXPECT_EQ(env.nvme->writes(), writes + 1);
  Write(tm, c);
  ASSERT_TRUE(tm.Rollback(blocks).ok());
  EXPECT_EQ(Read(tm), b);
}

TEST(TierVersionTest, CrashBetweenWriteAndCommitLeavesOldVersionInStore) {
  auto a = Pattern(8192, 1), b = Pattern(8192, 2);
  std::shared_ptr<testing::MemorySlotBackend> store;
  std::vector<std::vector<std::byte>> before;
  {
    auto env = MakeTierEnv(TierEnvOptions{});
    store = env.nvme;
    ASSERT_TRUE(env.tm->Register(kB, Tier::kNvme, a).ok());
    before = store->Snapshot();
    std::vector<BlockId> blocks{kB};
    ASSERT_TRUE(env.tm->BeginVersion(blocks).ok());
    Write(*env.tm, b);
    ASSERT_TRUE(env.tm->Evict(kB, Tier::kHost).ok());  // tentative b written
    // "Crash": destroyed without Commit or Rollback.
  }
  std::vector<std::vector<std::byte>> after = store->Snapshot();
  // Every slot that held a's bytes still holds them; b went to slots that did not.
  auto concat = [](const std::vector<std::vector<std::byte>>& s) {
    std::vector<std::byte> all;
    for (const auto& v : s) all.insert(all.end(), v.begin(), v.end());
    return all;
  };
  size_t a_slots = 0, b_slots = 0;
  for (size_t i = 0; i < before.size(); ++i) {
    if (!before[i].empty()) {
      EXPECT_EQ(before[i], after[i]) << "committed slot " << i << " was overwritten";
      a_slots++;
    } else if (!after[i].empty()) {
      b_slots++;
    }
  }
  EXPECT_EQ(a_slots, 2u);
  EXPECT_EQ(b_slots, 2u);
  auto all_before = concat(before);
  EXPECT_EQ(all_before, a);  // the two committed slots hold exactly version a
}

TEST(TierVersionTest, SpeculationNeedsTwoNvmeSlots) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  BlockId host_block{1, 0, kWholeChunk};
  ASSERT_TRUE(tm.Register(host_block, Tier::kHost).ok());
  std::vector<BlockId> blocks{host_block};
  EXPECT_EQ(tm.BeginVersion(blocks).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tm.Register(kB, Tier::kNvme).ok());
  std::vector<BlockId> nv{kB};
  EXPECT_EQ(tm.Rollback(nv).code(), StatusCode::kFailedPrecondition);  // nothing tentative
  ASSERT_TRUE(tm.BeginVersion(nv).ok());
  EXPECT_EQ(tm.BeginVersion(nv).code(), StatusCode::kFailedPrecondition);
  auto h = tm.Acquire(kB, Tier::kHost, Access::kRead);
  ASSERT_TRUE(h.ok() && h->Wait().ok());
  EXPECT_EQ(tm.Rollback(nv).code(), StatusCode::kFailedPrecondition);  // pinned
  h->Release();
  EXPECT_TRUE(tm.Rollback(nv).ok());
}

}  // namespace
}  // namespace strata
