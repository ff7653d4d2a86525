// Thread safety: several threads acquire, write, verify and release blocks at once
// under budgets small enough that every acquisition evicts. Each thread owns a set of
// blocks it writes (so it knows their bytes); all threads also read shared read-only
// blocks. Nothing may be lost, torn or stale, and budgets hold throughout.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "tier_test_util.h"

namespace strata {
namespace {

using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnvOptions;

class TierConcurrencyTest : public ::testing::TestWithParam<TierPolicy> {};

TEST_P(TierConcurrencyTest, ConcurrentAcquireRelease) {
  constexpr int kThreads = 4;
  constexpr uint32_t kOwnPerThread = 4;
  constexpr uint32_t kShared = 4;
  TierEnvOptions o;
  o.chunks = kThreads * kOwnPerThread + kShared;
  o.planes = {{"p16", 2}};
  // Device: 6 blocks; host: 8 blocks. Enough that four threads each holding one pin
  // (plus a transit copy each) always fit, never enough to avoid evictions.
  o.budgets = {6 * 4096, 8 * 4096, 0};
  o.policy = GetParam();
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  for (uint32_t c = 0; c < o.chunks; ++c) {
    ASSERT_TRUE(tm.Register(BlockId{c, 0, kWholeChunk}, Tier::kNvme, Pattern(4096, c)).ok());
  }
  std::atomic<int> failures{0};
  std::atomic<uint64_t> budget_violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 77);
      std::vector<uint64_t> version(kOwnPerThread, 0);
      for (int it = 0; it < 150; ++it) {
        bool shared = rng() % 3 == 0;
        uint32_t k = static_cast<uint32_t>(rng() % (shared ? kShared : kOwnPerThread));
        uint32_t chunk = shared ? kThreads * kOwnPerThread + k : static_cast<uint32_t>(t) * kOwnPerThread + k;
        Tier tier = rng() % 2 ? Tier::kDevice : Tier::kHost;
        Access access = shared ? Access::kRead : (rng() % 2 ? Access::kReadWrite : Access::kRead);
        auto h = tm.Acquire(BlockId{chunk, 0, kWholeChunk}, tier, access, "thread " + std::to_string(t));
        if (!h.ok()) {
          // A shared block pinned on the other tier by a reader is fine to read here; the
          // only refusals possible are writer conflicts, which owners never create.
          failures++;
          ADD_FAILURE() << h.status().ToString();
          continue;
        }
        Status s = h->Wait();
        if (!s.ok()) {
          failures++;
          ADD_FAILURE() << s.ToString();
          continue;
        }
        uint64_t seed = shared ? chunk : (version[k] == 0 ? chunk : version[k]);
        std::vector<std::byte> want = Pattern(4096, seed);
        if (std::memcmp(h->data(), want.data(), 4096) != 0) {
          failures++;
          ADD_FAILURE() << "thread " << t << " chunk " << chunk << " iteration " << it << ": wrong bytes";
        }
        if (access == Access::kReadWrite) {
          version[k] = 1000000 + static_cast<uint64_t>(t) * 10000 + static_cast<uint64_t>(it);
          std::vector<std::byte> next = Pattern(4096, version[k]);
          std::memcpy(h->data(), next.data(), 4096);
        }
        TierTelemetry tel = tm.Telemetry();
        if (tel.used[0] > tel.budget[0] || tel.used[1] > tel.budget[1]) budget_violations++;
        if (rng() % 4 == 0) {
          std::vector<PrefetchRequest> p{{BlockId{static_cast<uint32_t>(rng() % o.chunks), 0, kWholeChunk},
                                          rng() % 2 ? Tier::kDevice : Tier::kHost}};
          if (!tm.Prefetch(p).ok()) failures++;
        }
        h->Release();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(budget_violations.load(), 0u);
  ASSERT_TRUE(tm.WaitAll().ok());
  TierTelemetry tel = tm.Telemetry();
  EXPECT_LE(tel.high_water[0], tel.budget[0]);
  EXPECT_LE(tel.high_water[1], tel.budget[1]);
  EXPECT_GT(tel.evictions, 0u);
}

INSTANTIATE_TEST_SUITE_P(Policies, TierConcurrencyTest, ::testing::Values(TierPolicy::kLru, TierPolicy::kTrace),
                         [](const ::testing::TestParamInfo<TierPolicy>& info) {
                           return std::string(TierPolicyName(info.param));
                         });

}  // namespace
}  // namespace strata
