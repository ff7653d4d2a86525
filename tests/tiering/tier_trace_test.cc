// The trace policy: recording, following, divergence (detected, logged once,
// re-recorded), and fewer bytes moved than LRU on the forward/backward sweep.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "strata/log.h"
#include "tier_test_util.h"

namespace strata {
namespace {

using testing::MakeTierEnv;
using testing::Pattern;
using testing::TierEnvOptions;

std::atomic<int> g_divergence_logs{0};
void CountingSink(LogLevel level, std::string_view subsystem, const std::string& message) {
  if (level == LogLevel::kWarn && subsystem == "tier" && message.find("diverged") != std::string::npos)
    g_divergence_logs++;
}

void RunStep(TierManager& tm, const std::vector<uint32_t>& order, bool write) {
  tm.BeginStep();
  for (uint32_t c : order) {
    auto h = tm.Acquire(BlockId{c, 0, kWholeChunk}, Tier::kDevice, write ? Access::kReadWrite : Access::kRead);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE(h->Wait().ok());
  }
}

std::vector<uint32_t> Sweep(uint32_t n) {
  std::vector<uint32_t> order;
  for (uint32_t c = 0; c < n; ++c) order.push_back(c);
  for (uint32_t c = n; c-- > 0;) order.push_back(c);
  return order;
}

TEST(TierTraceTest, DivergenceIsDetectedLoggedOnceAndReRecorded) {
  TierEnvOptions o;
  o.policy = TierPolicy::kTrace;
  o.budgets = {12 << 10, 16 << 10, 0};
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  for (uint32_t c = 0; c < 8; ++c) ASSERT_TRUE(tm.Register(BlockId{c, 0, kWholeChunk}, Tier::kNvme).ok());
  SetLogSink(&CountingSink);
  g_divergence_logs = 0;
  std::vector<uint32_t> a = Sweep(8);
  RunStep(tm, a, false);  // recorded
  EXPECT_EQ(tm.Telemetry().trace_length, 0u);
  RunStep(tm, a, false);  // followed
  EXPECT_EQ(tm.Telemetry().trace_length, 16u);
  EXPECT_EQ(tm.Telemetry().trace_divergences, 0u);
  EXPECT_GT(tm.Telemetry().prefetches_issued, 0u);
  std::vector<uint32_t> b = {0, 2, 1, 3, 4, 5, 6, 7, 6, 5};  // differs at position 1, and is shorter
  RunStep(tm, b, false);
  EXPECT_EQ(tm.Telemetry().trace_divergences, 1u);
  EXPECT_EQ(g_divergence_logs.load(), 1);
  EXPECT_EQ(tm.Telemetry().trace_length, 0u);  // re-recording
  RunStep(tm, b, false);
  RunStep(tm, b, false);
  EXPECT_EQ(tm.Telemetry().trace_length, b.size());
  EXPECT_EQ(tm.Telemetry().trace_divergences, 1u);
  EXPECT_EQ(g_divergence_logs.load(), 1);
  SetLogSink(nullptr);
}

// The forward-then-backward sweep over 8 chunks, every step: forward reads each
// chunk's parameters on the device, backward reads and updates them there and (with
// `grads`) writes the chunk's gradient block on host. Parameters live on NVMe.
uint64_t SweepBytes(TierPolicy policy, bool grads, uint64_t device_blocks, uint64_t host_blocks, int steps) {
  TierEnvOptions o;
  o.policy = policy;
  o.synchronous = true;  // deterministic decisions and counts
  o.chunks = 8;
  o.planes = {{"p16", 2}, {"grad", 2}};
  o.budgets = {device_blocks * 4096, host_blocks * 4096, 0};
  auto env = MakeTierEnv(o);
  TierManager& tm = *env.tm;
  for (uint32_t c = 0; c < 8; ++c) {
    EXPECT_TRUE(tm.Register(BlockId{c, 0, kWholeChunk}, Tier::kNvme, Pattern(4096, c)).ok());
    EXPECT_TRUE(tm.Register(BlockId{c, 1, kWholeChunk}, Tier::kNvme).ok());
  }
  tm.ResetTelemetry();
  std::vector<uint32_t> order = Sweep(8);
  for (int s = 0; s < steps; ++s) {
    tm.BeginStep();
    for (size_t i = 0; i < order.size(); ++i) {
      bool backward = i >= 8;
      auto h = tm.Acquire(BlockId{order[i], 0, kWholeChunk}, Tier::kDevice,
                          backward ? Access::kReadWrite : Access::kRead, backward ? "bwd" : "fwd");
      EXPECT_TRUE(h.ok()) << h.status().ToString();
      EXPECT_TRUE(h->Wait().ok());
      if (backward && grads) {
        auto g = tm.Acquire(BlockId{order[i], 1, kWholeChunk}, Tier::kHost, Access::kReadWrite, "grad");
        EXPECT_TRUE(g.ok()) << g.status().ToString();
        EXPECT_TRUE(g->Wait().ok());
      }
    }
  }
  EXPECT_TRUE(tm.WaitAll().ok());
  TierTelemetry t = tm.Telemetry();
  uint64_t bytes = 0;
  for (const LaneTelemetry& l : t.lanes) bytes += l.bytes;
  return bytes;
}

TEST(TierTraceTest, TraceMovesFewerBytesThanLruOnTheSweep) {
  struct Case {
    bool grads;
    uint64_t device_blocks, host_blocks;
  };
  for (Case c : {Case{false, 3, 6}, Case{true, 3, 10}, Case{true, 5, 10}}) {
    uint64_t lru = SweepBytes(TierPolicy::kLru, c.grads, c.device_blocks, c.host_blocks, 4);
    uint64_t trace = SweepBytes(TierPolicy::kTrace, c.grads, c.device_blocks, c.host_blocks, 4);
    // Deterministic: the same run gives the same count.
    EXPECT_EQ(lru, SweepBytes(TierPolicy::kLru, c.grads, c.device_blocks, c.host_blocks, 4));
    EXPECT_EQ(trace, SweepBytes(TierPolicy::kTrace, c.grads, c.device_blocks, c.host_blocks, 4));
    std::printf("sweep%s, device %llu blocks, host %llu: bytes moved over 4 steps: lru %llu, trace %llu\n",
                c.grads ? " with grads" : "", static_cast<unsigned long long>(c.device_blocks),
                static_cast<unsigned long long>(c.host_blocks), static_cast<unsigned long long>(lru),
                static_cast<unsigned long long>(trace));
    // At least 10% fewer.
    EXPECT_LT(trace * 10, lru * 9) << "grads " << c.grads << " device " << c.device_blocks;
  }
}

}  // namespace
}  // namespace strata
