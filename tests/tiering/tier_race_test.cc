// Races the randomized model test meets only by chance, made deterministic with the test
// backend's write gate: a write-back held in flight while a newer version of the block
// is written on another tier.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "tier_test_util.h"

namespace strata {
namespace {

using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnvOptions;

// Polls instead of Wait(): a stranded ticket must fail the test, not hang it.
bool ReadyWithin(const BlockHandle& h, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!h.Ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// A host copy being written back to NVMe turns stale when the device copy is written.
// A later host acquisition must wait for that write-back and load the new bytes; it
// used to take the stale leaving copy back as valid, drop its load, and never become
// ready (seen as a rare hang of seed 23 in tier_model_test).
TEST(TierRaceTest, StaleCopyLeavingForNvmeIsNotTakenBack) {
  TierEnvOptions o;
  o.budgets = {16 << 10, 32 << 10, 0};
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  const BlockId id{0, 0, kWholeChunk};
  const uint64_t bytes = tm.BlockBytes(id);
  ASSERT_TRUE(tm.Register(id, Tier::kNvme, Pattern(bytes, 1)).ok());

  // Version 2 on the host only (NVMe still holds version 1).
  std::vector<std::byte> v2 = Pattern(bytes, 2);
  {
    auto h = tm.Acquire(id, Tier::kHost, Access::kReadWrite);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE(h->Wait().ok());
    std::memcpy(h->data(), v2.data(), bytes);
  }

  // Its write-back to NVMe is held in flight; Evict waits for it on another thread.
  env.nvme->CloseWriteGate();
  auto evicted = std::async(std::launch::async, [&] { return tm.Evict(id, Tier::kHost); });
  env.nvme->WaitForHeldWrites(1);

  // Version 3 on the device: the leaving host copy is stale now.
  std::vector<std::byte> v3 = Pattern(bytes, 3);
  {
    auto h = tm.Acquire(id, Tier::kDevice, Access::kOverwrite);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE(ReadyWithin(*h, std::chrono::seconds(10)));
    ASSERT_TRUE(env.device->CopySync(h->data(), v3.data(), bytes, CopyDir::kHostToDevice).ok());
  }

  auto reader = tm.Acquire(id, Tier::kHost, Access::kRead);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  env.nvme->OpenWriteGate();
  bool ready = ReadyWithin(*reader, std::chrono::seconds(10));
  EXPECT_TRUE(ready) << "the host acquisition was never made ready";
  ASSERT_EQ(evicted.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  Status evict = evicted.get();
  EXPECT_TRUE(evict.ok()) << evict.ToString();
  if (!ready) return;
  ASSERT_TRUE(reader->Wait().ok());
  EXPECT_EQ(std::memcmp(reader->data(), v3.data(), bytes), 0)
      << "the host copy is not the device's newer bytes";
}

}  // namespace
}  // namespace strata
