// Injected I/O errors during eviction and prefetch: the error reaches the caller, the
// block stays valid where it was, and nothing is lost. Runs over the in-memory slot
// backend, and over a real NvmeStore + IoEngine (psync) with the engine's fault hook.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "strata/io.h"
#include "tier_test_util.h"
#include "tiering/io_fault.h"

namespace strata {
namespace {

using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnvOptions;

BlockId B(uint32_t c) { return BlockId{c, 0, kWholeChunk}; }

void ExpectBytes(TierManager& tm, BlockId id, Tier tier, const std::vector<std::byte>& want) {
  auto h = tm.Acquire(id, tier, Access::kRead);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_TRUE(h->Wait().ok());
  EXPECT_EQ(std::memcmp(h->data(), want.data(), want.size()), 0);
}

TEST(TierFaultTest, FailedEvictionKeepsTheBlockAndTellsTheAcquirer) {
  TierEnvOptions o;
  o.budgets = {8 << 10, 8 << 10, 0};  // host: two blocks
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  for (uint32_t c = 0; c < 3; ++c) ASSERT_TRUE(tm.Register(B(c), Tier::kNvme, Pattern(4096, c)).ok());
  std::vector<std::byte> a2 = Pattern(4096, 42);
  {  // Dirty blocks 0 and 1 on host: their only valid copies.
    for (uint32_t c = 0; c < 2; ++c) {
      auto h = tm.Acquire(B(c), Tier::kHost, Access::kOverwrite);
      ASSERT_TRUE(h.ok() && h->Wait().ok());
      std::vector<std::byte> p = Pattern(4096, 40 + c);
      std::memcpy(h->data(), p.data(), 4096);
    }
  }
  env.nvme->FailWrites(1);
  auto h = tm.Acquire(B(2), Tier::kHost, Access::kRead, "needs room");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Status s = h->Wait();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("injected write error"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("evicting"), std::string::npos) << s.ToString();
  h->Release();
  EXPECT_FALSE(tm.WaitAll().ok());  // reported there too, once
  EXPECT_TRUE(tm.WaitAll().ok());
  // The victim is still valid on host, with its bytes.
  for (uint32_t c = 0; c < 2; ++c) {
    auto v = tm.ValidTiers(B(c));
    EXPECT_NE(std::find(v.begin(), v.end(), Tier::kHost), v.end()) << c;
  }
  // Retrying works, and nothing was lost on the way.
  ExpectBytes(tm, B(2), Tier::kHost, Pattern(4096, 2));
  ExpectBytes(tm, B(0), Tier::kHost, Pattern(4096, 40));
  ExpectBytes(tm, B(1), Tier::kHost, Pattern(4096, 41));
  EXPECT_GE(tm.Telemetry().io_errors, 1u);
}

TEST(TierFaultTest, FailedPrefetchIsReportedByNextAcquire) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  ASSERT_TRUE(tm.Register(B(0), Tier::kNvme, Pattern(4096, 5)).ok());
  env.nvme->FailReads(1);
  std::vector<PrefetchRequest> p{{B(0), Tier::kHost}};
  ASSERT_TRUE(tm.Prefetch(p).ok());
  Status all = tm.WaitAll();
  EXPECT_EQ(all.code(), StatusCode::kIoError) << all.ToString();
  EXPECT_EQ(tm.ValidTiers(B(0)), std::vector<Tier>{Tier::kNvme});
  auto first = tm.Acquire(B(0), Tier::kHost, Access::kRead);
  ASSERT_FALSE(first.ok());
  EXPECT_NE(first.status().message().find("injected read error"), std::string::npos);
  EXPECT_NE(first.status().message().find("prefetch"), std::string::npos);
  ExpectBytes(tm, B(0), Tier::kHost, Pattern(4096, 5));
}

TEST(TierFaultTest, FailedDemandReadFailsTheHandleOnly) {
  auto env = MakeTierEnv(TierEnvOptions{});
  TierManager& tm = *env.tm;
  ASSERT_TRUE(tm.Register(B(0), Tier::kNvme, Pattern(4096, 6)).ok());
  env.nvme->FailReads(1);
  auto h = tm.Acquire(B(0), Tier::kDevice, Access::kRead, "fwd");
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->Wait().code(), StatusCode::kIoError);
  EXPECT_EQ(h->data(), nullptr);
  h->Release();
  EXPECT_FALSE(tm.WaitAll().ok());
  ExpectBytes(tm, B(0), Tier::kDevice, Pattern(4096, 6));
}

// The same through the real store: ScriptedFaults make the engine see EIO.
TEST(TierFaultTest, RealStoreWriteErrorDuringEviction) {
  auto faults = std::make_shared<ScriptedFaults>();
  IoEngineOptions io;
  io.backend = IoBackendKind::kPsync;
  io.fault_hook = faults;
  auto engine = IoEngine::Create(io);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::string dir = ::testing::TempDir() + "/tier_fault_" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  DeviceOptions d;
  d.kind = DeviceKind::kSim;
  d.capacity = 8 << 20;
  auto device = CreateDevice(d);
  ASSERT_TRUE(device.ok());
  HostArenaOptions ha;
  ha.bytes = 2 << 20;
  ha.huge_pages = false;
  ha.pinning = HostPinning::kMlock;
  auto arena = HostArena::Create(ha);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  {
    TierManagerOptions t;
    t.layout = *ChunkLayout::Create(4 * 2048, 2048);
    t.planes = {{"p16", 2}};
    t.budgets = {0, 8 << 10, 1 << 20};
    t.host_arena = arena->get();
    t.io_engine = engine->get();
    t.nvme_paths = {dir};
    t.nvme_name = "tier-fault";
    auto tm = TierManager::Create(std::move(t));
    ASSERT_TRUE(tm.ok()) << tm.status().ToString();
    for (uint32_t c = 0; c < 3; ++c) ASSERT_TRUE((*tm)->Register(B(c), Tier::kNvme, Pattern(4096, c)).ok());
    for (uint32_t c = 0; c < 2; ++c) {
      auto h = (*tm)->Acquire(B(c), Tier::kHost, Access::kOverwrite);
      ASSERT_TRUE(h.ok() && h->Wait().ok());
      std::vector<std::byte> p = Pattern(4096, 50 + c);
      std::memcpy(h->data(), p.data(), 4096);
    }
    ScriptedFaults::Rule rule;
    rule.error = EIO;
    rule.op = 1;
    rule.times = 1;
    faults->Add(rule);
    auto h = (*tm)->Acquire(B(2), Tier::kHost, Access::kRead);
    ASSERT_TRUE(h.ok());
    Status s = h->Wait();
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(faults->fired(), 1u);
    h->Release();
    (*tm)->WaitAll().IgnoreError();  // the failure was just checked through the handle
    ExpectBytes(**tm, B(2), Tier::kHost, Pattern(4096, 2));
    ExpectBytes(**tm, B(0), Tier::kHost, Pattern(4096, 50));
    ExpectBytes(**tm, B(1), Tier::kHost, Pattern(4096, 51));
    EXPECT_TRUE((*tm)->WaitAll().ok());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata
