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

// Modules of three quarters of a chunk, in tensors of a quarter: every module but the
// first straddles two chunks, as a GPT block's halves do (12 chunks).
Layout StraddlingModules() {
  ModelDecl m;
  for (int i = 0; i < 2 * kChunks; ++i) {
    ModuleDecl mod{"m" + std::to_string(i), {}};
    for (int t = 0; t < 3; ++t) {
      mod.tensors.push_back(static_cast<TensorId>(m.tensors.size()));
      m.tensors.push_back({"w" + std::to_string(m.tensors.size()), {kChunkElems / 4}, std::nullopt});
    }
    m.modules.push_back(std::move(mod));
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
  DType compute = DType::kF32;

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
    f.param_tier =
        config.zero.offload_param.device == OffloadDevice::kNvme ? ZeroTier::kNvme : ZeroTier::kDevice;
    f.opt_elems = layout.chunk_elems;
    f.compute = compute;
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

// Stage 3 with both on NVMe over modules that straddle two chunks.
Case BothOnNvme() {
  Case c(3, OffloadDevice::kNvme);
  c.layout = StraddlingModules();
  c.trace = Trace::Assumed(c.layout.num_modules());
  c.config.zero.offload_param.device = OffloadDevice::kNvme;
  c.config.strata.optimizer_resident = 0;
  return c;
}

TEST(EnginePlanner, ParameterStagingHoldsThreeModulesAheadAsTheHostRoomAllows) {
  Case c = BothOnNvme();
  auto roomy = c.Plan();
  ASSERT_TRUE(roomy.ok()) << roomy.status().ToString();
  ASSERT_EQ(roomy->max_module_chunks, 2u);
  ASSERT_TRUE(roomy->param_from_master);
  EXPECT_EQ(roomy->param_staging, 2 * kFetchWindowModules);
  EXPECT_EQ(roomy->gather.max_prefetch_modules, kFetchWindowModules);
  // Room for one buffer beyond the fixed ones (and the other extras, which come after).
  const uint64_t buffer = roomy->param_stage_bytes;
  c.host = roomy->host.Total() + buffer;
  auto one = c.Plan();
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->param_staging, kParamStaging + 1);
  EXPECT_EQ(one->gather.max_prefetch_modules, (kParamStaging + 1) / 2);
  EXPECT_EQ(one->host_need, c.host);
  c.host = roomy->host.Total() + buffer - 1;
  auto none = c.Plan();
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->param_staging, kParamStaging);
  EXPECT_LE(none->host_need, c.host);
}

TEST(EnginePlanner, NoExtraParameterStagingWhereNoShardIsReadFromDisk) {
  Case c = BothOnNvme();
  c.config.strata.optimizer_resident = -1;  // auto: the room keeps every chunk resident
  auto p = c.Plan();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(std::count(p->opt_resident.begin(), p->opt_resident.end(), 1), c.layout.num_chunks);
  EXPECT_EQ(p->param_staging, kParamStaging);
  // bf16 shards in a swap of their own: the room keeps every one in memory, unless
  // strata.param_resident says otherwise.
  Case swapped = BothOnNvme();
  swapped.compute = DType::kBf16;
  auto s = swapped.Plan();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_FALSE(s->param_from_master);
  EXPECT_EQ(s->param_resident_chunks, swapped.layout.num_chunks);
  EXPECT_EQ(s->param_staging, kParamStaging);
  swapped.config.strata.param_resident = 0;
  s = swapped.Plan();
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->param_staging, 2 * kFetchWindowModules);
  // One chunk per module: the fixed buffers already hold three modules ahead.
  Case one = BothOnNvme();
  one.layout = Chunks();
  one.trace = Trace::Assumed(kChunks);
  auto q = one.Plan();
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->param_staging, kParamStaging);
}

}  // namespace
}  // namespace strata::zero
