// The engine's plan as a pure function (engine_planner.h): no device, no arena, no file;
// only a config, a layout, a call order and the budgets.
#include "zero/engine_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "strata/model.h"

namespace strata::zero {
namespace {

constexpr int kChunks = 8;
constexpr int64_t kChunkElems = 8192;

// One module per chunk.
Layout Chunks() {
  ModelDecl m;
  for (int i = 0; i < kChunks; ++i) {
    m.tensors.push_back({"w" + std::to_string(i), {kChunkElems}, std::nullopt});
    m.modules.push_back({"m" + std::to_string(i), {static_cast<TensorId>(i)}});
  }
  auto l = MakeLayout(m, kChunkElems * 4, 1);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return *l;
}

struct Case {
  Config config;
  Layout layout = Chunks();
  Trace trace = Trace::Assumed(kChunks);
  uint64_t device = 1ull << 40, host = 1ull << 40;

  Case(int stage, OffloadDevice opt) {
    config.zero.stage = stage;
    config.zero.offload_optimizer.device = opt;
    config.strata.nvme_budget = 1ull << 40;
    config.strata.swap_paths = {::testing::TempDir()};
  }
  Result<EnginePlan> Plan() const {
    PlanFacts f;
    f.config = &config;
    f.layout = &layout;
    f.trace = &trace;
    f.stage = config.zero.stage;
    f.opt_tier = config.zero.offload_optimizer.device == OffloadDevice::kNvme  ? ZeroTier::kNvme
                 : config.zero.offload_optimizer.device == OffloadDevice::kCpu ? ZeroTier::kHost
                                                                               : ZeroTier::kDevice;
    f.param_tier = ZeroTier::kDevice;
    f.opt_elems = layout.chunk_elems;
    f.device_budget = {device, "the test's device budget", "raise it"};
    const uint64_t host_bytes = host;
    f.host_budget = [host_bytes](bool) {
      return TierBudget{host_bytes, "the test's host budget", "raise it"};
    };
    return PlanEngine(f);
  }
};

// A budget exactly at the tier's fixed need fits, with nothing left for spares; one byte
// less is refused, naming the tier.
void CheckBoundary(Case c, bool host) {
  auto roomy = c.Plan();
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  const uint64_t fixed = (host ? roomy->host : roomy->device).Total();
  ASSERT_GT(fixed, 0u);
  EXPECT_GT(roomy->spares, 0);  // the room beyond the fixed need goes to speculation
  (host ? c.host : c.device) = fixed;
  auto exact = c.Plan();
  ASSERT_TRUE(exact.ok()) << exact.status().ToString();
  EXPECT_EQ(host ? exact->host_need : exact->device_need, fixed);
  EXPECT_EQ(exact->spares, 0);
  (host ? c.host : c.device) = fixed - 1;
  auto short_one = c.Plan();
  ASSERT_FALSE(short_one.ok());
  EXPECT_EQ(short_one.status().code(), StatusCode::kOutOfBudget);
  EXPECT_NE(short_one.status().message().find(host ? "host" : "device"), std::string::npos)
      << short_one.status().ToString();
}

TEST(EnginePlanner, ADeviceBudgetExactlyAtTheFixedNeedFitsAndOneByteLessDoesNot) {
  CheckBoundary(Case(2, OffloadDevice::kNone), /*host=*/false);
}

TEST(EnginePlanner, AHostBudgetExactlyAtTheFixedNeedFitsAndOneByteLessDoesNot) {
  CheckBoundary(Case(2, OffloadDevice::kCpu), /*host=*/true);
}

TEST(EnginePlanner, EveryTierShortIsNamedInOneError) {
  Case c(3, OffloadDevice::kNvme);
  auto roomy = c.Plan();
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  c.device = roomy->device.Total() - 1;
  c.host = roomy->host.Total() - 1;
  c.config.strata.nvme_budget = roomy->nvme.Total() - 1;
  auto none = c.Plan();
  ASSERT_FALSE(none.ok());
  const std::string m(none.status().message());
  for (const char* tier : {"device", "host", "nvme"}) {
    EXPECT_NE(m.find(tier), std::string::npos) << tier << " missing from: " << m;
  }
}

TEST(EnginePlanner, HostRoomKeepsMoreNvmeOptimizerChunksResidentAndOffDisk) {
  Case c(3, OffloadDevice::kNvme);
  c.host = 0;
  auto fixed = c.Plan();
  ASSERT_FALSE(fixed.ok());  // nothing fits in no room; take the fixed need from a roomy plan
  c.host = 1ull << 40;
  auto all = c.Plan();
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(std::count(all->opt_resident.begin(), all->opt_resident.end(), 1), kChunks);
  int last_resident = -1;
  uint64_t last_nvme = ~0ull;
  // Budgets from the fixed need up: residency never shrinks and the disk never grows.
  for (uint64_t extra = 0; extra <= 12 * kChunkElems * kChunks; extra += 12 * kChunkElems) {
    c.host = all->host.Total() + extra;
    auto p = c.Plan();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    const int resident = static_cast<int>(std::count(p->opt_resident.begin(), p->opt_resident.end(), 1));
    EXPECT_GE(resident, last_resident) << "at " << extra << " bytes beyond the fixed need";
    EXPECT_LE(p->nvme_need, last_nvme);
    EXPECT_LE(p->host_need, c.host);
    last_resident = resident;
    last_nvme = p->nvme_need;
  }
  EXPECT_GT(last_resident, 0);
}

}  // namespace
}  // namespace strata::zero
