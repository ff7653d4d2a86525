// Refusals of configurations the budgets cannot hold: each names the tier that binds, its
// budget, what the fixed need there is made of and the largest model or module that
// fits; it suggests offloading only what is not offloaded yet; NVMe is checked first;
// and nothing is created on disk before the refusal.
#include <filesystem>
#include <string>

#include "engine_harness.h"
#include "single_world.h"

namespace strata::testing {
namespace {

// Creates an engine (and drops it): OK, or the refusal.
Status CreateOnly(const Config& config, const zero::TrainSpec& spec) {
  auto dev = EngineDevice(config);
  if (!dev.ok()) return dev.status();
  auto engine = Engine::Create(config, model::MlpModules(spec.model), MlpInit(spec),
                               EngineResources{&World(), dev->get()});
  return engine.status();
}

// A refusal, with the swap directory left as it was (nothing created there).
std::string Refusal(const Config& config, const zero::TrainSpec& spec) {
  const bool empty_before = std::filesystem::is_empty(SwapDir());
  Status st = CreateOnly(config, spec);
  EXPECT_EQ(st.code(), StatusCode::kOutOfBudget) << st.ToString();
  if (empty_before) {
    EXPECT_TRUE(std::filesystem::is_empty(SwapDir())) << "files created before the refusal";
  }
  return st.message();
}

#define EXPECT_SAYS(msg, text) \
  EXPECT_NE((msg).find(text), std::string::npos) << "no \"" << (text) << "\" in: " << (msg)
#define EXPECT_NOT_SAYS(msg, text) \
  EXPECT_EQ((msg).find(text), std::string::npos) << "\"" << (text) << "\" in: " << (msg)

// SmallSpec's layers pack into three chunks of 8192 elements (the largest module has
// 7760); stage 3 with both planes on NVMe holds on the device two fp32 gradient buffers,
// a reduce buffer and the gathered module: 16 bytes per chunk element, whatever the
// model's size.
TEST(EngineBudget, DeviceBoundByTheModuleWhenEverythingIsOnNvme) {
  const std::string msg =
      Refusal(MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"device_budget": "64KiB"}})"), SmallSpec(1));
  EXPECT_SAYS(msg, "the device tier cannot hold this configuration: it needs 128 KiB");
  EXPECT_SAYS(msg, "has 64.0 KiB (strata.device_budget)");
  EXPECT_SAYS(msg, "the largest module's gathered f32 parameters (1 chunk), 32.0 KiB");
  EXPECT_SAYS(msg, "fp32 gradient buffers for the largest module's 1 chunk and one more, 64.0 KiB");
  EXPECT_SAYS(msg, "chunks here hold the largest module, 7.76K parameters, and at most about 4.10K fit");
  EXPECT_SAYS(msg, "whatever the model's size");
  EXPECT_SAYS(msg, "split the largest module (7.76K parameters) into ones of at most about 4.10K");
  EXPECT_SAYS(msg, "the optimizer state and the parameter shards are already on NVMe");
  EXPECT_SAYS(msg, "raise strata.device_budget to at least 128 KiB");
  EXPECT_NOT_SAYS(msg, "offload_");
}

// A chunk larger than the largest module: a smaller strata.chunk_size is the fix, and the
// size it names fits.
TEST(EngineBudget, DeviceBoundByTheChunkSizeNamesOneThatFits) {
  const std::string budget = R"("device_budget": "160KiB")";
  const std::string msg = Refusal(
      MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"chunk_size": "1MiB", )" + budget + "}}"), SmallSpec(1));
  EXPECT_SAYS(msg, "the device tier cannot hold this configuration");
  EXPECT_SAYS(msg,
              "chunks here hold the whole model, 20.5K parameters (strata.chunk_size 1.00 MiB is larger)");
  EXPECT_SAYS(msg, "lower strata.chunk_size to at most 40.0 KiB");
  EXPECT_NOT_SAYS(msg, "offload_");
  EXPECT_TRUE(
      CreateOnly(MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"chunk_size": "40KiB", )" + budget + "}}"),
                 SmallSpec(1))
          .ok());
}

// Stage 1 keeps every parameter and the optimizer state on the device: the model's size
// binds, and moving the optimizer state off the device is the advice.
TEST(EngineBudget, DeviceBoundByTheModelSuggestsOffloadingWhatIsOnIt) {
  const std::string msg =
      Refusal(MakeConfig({1, "none", "none"}, R"({"strata": {"device_budget": "300KiB"}})"), SmallSpec(1));
  EXPECT_SAYS(msg, "the device tier cannot hold this configuration: it needs 576 KiB");
  EXPECT_SAYS(msg, "the optimizer state (fp32 master, m and v) and fp32 gradient shards, 384 KiB");
  EXPECT_SAYS(
      msg, "every chunk's f32 compute parameters (stage 1 keeps the whole model on each device), 96.0 KiB");
  EXPECT_SAYS(msg, "holds a model of at most about 8.43K parameters, and this one has 19.8K");
  EXPECT_SAYS(msg, "offload_optimizer.device \"cpu\" (\"nvme\" needs stage 3)");
  EXPECT_SAYS(msg, "zero_optimization.stage 3 with offload_param.device");
}

// With the optimizer on the host, only the host tier's own planes are offered a move.
TEST(EngineBudget, HostBoundByTheModelSuggestsNvmeForTheOptimizer) {
  const std::string msg =
      Refusal(MakeConfig({3, "cpu", "none"}, R"({"strata": {"host_budget": "256KiB"}})"), SmallSpec(1));
  EXPECT_SAYS(msg, "the pinned host tier cannot hold this configuration");
  EXPECT_SAYS(msg, "(strata.host_budget)");
  EXPECT_SAYS(msg, "the optimizer state (fp32 master, m and v) and fp32 gradient shards, 384 KiB");
  EXPECT_SAYS(msg, "staging for 3 f32 parameter shards, 96.0 KiB");
  EXPECT_SAYS(msg, "holds a model of at most about");
  EXPECT_SAYS(msg, "offload_optimizer.device \"nvme\"");
  EXPECT_NOT_SAYS(msg, "offload_param");
  EXPECT_SAYS(msg, "raise strata.host_budget to at least");
}

// Everything on NVMe: the pinned staging binds, per chunk; no offload advice.
TEST(EngineBudget, HostBoundByStagingWhenEverythingIsOnNvme) {
  const std::string msg =
      Refusal(MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"host_budget": "128KiB"}})"), SmallSpec(1));
  EXPECT_SAYS(msg, "the pinned host tier cannot hold this configuration");
  EXPECT_SAYS(msg, "staging for 3 f32 parameter shards, 96.0 KiB");
  EXPECT_SAYS(msg, "one NVMe optimizer staging set");
  EXPECT_SAYS(msg, "at most about");
  EXPECT_SAYS(msg, "split the largest module (7.76K parameters)");
  EXPECT_SAYS(msg, "the optimizer state and the parameter shards are already on NVMe");
  EXPECT_NOT_SAYS(msg, "offload_");
}

// The reduced gradient reaches a host-side shard through one piece of pinned staging,
// whatever the module: with sub_group_size 512 a 16th of SmallSpec's 8192-element shard.
TEST(EngineBudget, GradientStagingIsOnePieceNotAShard) {
  Combo whole{3, "nvme", "nvme", "nvme"};
  std::string msg = Refusal(MakeConfig(whole, R"({"strata": {"host_budget": "128KiB"}})"), SmallSpec(1));
  EXPECT_SAYS(msg, "the fp32 gradient receive buffer (one shard), 32.0 KiB");
  Combo pieced{3, "nvme", "nvme", "nvme", 512};
  msg = Refusal(MakeConfig(pieced, R"({"strata": {"host_budget": "128KiB"}})"), SmallSpec(1));
  EXPECT_SAYS(msg, "the fp32 gradient receive buffer (one 4.00 KiB piece of a shard), 4.00 KiB");
}

// strata.nvme_budget binds before any memory tier, and the memory tier short too is named
// after it.
TEST(EngineBudget, NvmeBudgetIsCheckedFirst) {
  const std::string msg = Refusal(
      MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"nvme_budget": "64KiB", "device_budget": "64KiB"}})"),
      SmallSpec(1));
  EXPECT_EQ(msg.rfind("engine: the NVMe tier cannot hold this configuration", 0), 0u) << msg;
  EXPECT_SAYS(msg, "(strata.nvme_budget)");
  EXPECT_SAYS(msg, "the optimizer state (fp32 master, m and v, in two slots: committed and next)");
  EXPECT_SAYS(msg, "holds a model of at most about");
  EXPECT_SAYS(msg, "raise strata.nvme_budget to at least");
  EXPECT_SAYS(msg, "Also, the device tier is short too: it needs 128 KiB and has 64.0 KiB");
}

// A model far beyond the free space of the swap directory's file system (a trillion
// parameters need tens of TB): refused for the disk first, before any file is created.
TEST(EngineBudget, NvmeFreeSpaceBindsForAHugeModel) {
  zero::TrainSpec spec = SmallSpec(1);
  spec.model = model::MlpSpecForParams(1e12, 4, 256, 16, model::LossKind::kMse, 1);
  const std::string msg =
      Refusal(MakeConfig({3, "nvme", "nvme"}, R"({"strata": {"chunk_size": "16MiB"}})"), spec);
  EXPECT_EQ(msg.rfind("engine: the NVMe tier cannot hold this configuration", 0), 0u) << msg;
  EXPECT_SAYS(msg, "free space on the file system of " + SwapDir());
  EXPECT_SAYS(msg, "this one has 1.00T");
  EXPECT_SAYS(msg, "stripe the swap over more disks");
  EXPECT_SAYS(msg, "Also, the device tier is short too");
}

}  // namespace
}  // namespace strata::testing
