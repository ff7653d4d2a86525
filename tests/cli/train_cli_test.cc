// `strata train` as a user meets it: which setting wins between a config file and a
// flag, DeepSpeed's batch rule, live progress, early refusals, interruption and swap
// files that an earlier run left behind. Each test runs the binary.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>

#include "cli/cli_runner.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using testing::RunStrata;

class TrainCli : public testing::ScratchDirTest {
 protected:
  TrainCli() : ScratchDirTest("strata-cli-test-") {}
  void SetUp() override {
    ScratchDirTest::SetUp();
    swap_ = (dir_ / "swap").string();
  }

  std::string WriteConfig(const std::string& text) {
    const std::string path = (dir_ / "ds.json").string();
    std::ofstream(path) << text;
    return path;
  }
  // Small()'s configuration with the optimizer state all on NVMe (by default the host
  // budget holds it all), for the tests of what happens to swap files.
  std::vector<std::string> OnDisk(std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"--config", WriteConfig(R"({"zero_optimization": {"stage": 3,
        "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "nvme"}},
        "strata": {"optimizer_resident": 0}})")});
    return extra;
  }
  // A small stage-3 NVMe run: a few chunks, well under a second per step.
  std::vector<std::string> Small(std::vector<std::string> extra, int steps = 2) {
    std::vector<std::string> a{"train",        "--model", "mlp",         "--depth", "2",
                               "--chunk-size", "4MiB",    "--nvme-path", swap_};
    if (std::find(extra.begin(), extra.end(), "--params") == extra.end())
      a.insert(a.end(), {"--params", "2M"});
    if (std::find(extra.begin(), extra.end(), "--steps") == extra.end()) {
      a.insert(a.end(), {"--steps", std::to_string(steps)});
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  nlohmann::json Json(const CliRun& r) {
    EXPECT_EQ(r.exit_status, 0) << r.err;
    try {
      return nlohmann::json::parse(r.out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what() << "\n" << r.out << r.err;
      return nlohmann::json::object();
    }
  }
  size_t SwapEntries() {
    std::error_code ec;
    size_t n = 0;
    for (auto it = fs::directory_iterator(swap_, ec); !ec && it != fs::directory_iterator(); ++it) ++n;
    return n;
  }
  std::string swap_;
};

TEST_F(TrainCli, ConfigBatchSizeIsKeptWithoutTheFlag) {
  const std::string cfg = WriteConfig(R"({"train_micro_batch_size_per_gpu": 4,
    "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  nlohmann::json j = Json(RunStrata(Small({"--config", cfg, "--json"})));
  EXPECT_EQ(j["config"]["train_micro_batch_size_per_gpu"], 4);
  EXPECT_EQ(j["config"]["zero_optimization"]["stage"], 2);
  EXPECT_EQ(j["steps"].size(), 2u);
  j = Json(RunStrata(Small({"--config", cfg, "--json", "--micro-batch", "8", "--stage", "1"})));
  EXPECT_EQ(j["config"]["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(j["config"]["zero_optimization"]["stage"], 1);
}

TEST_F(TrainCli, OverlapFlagsOverrideTheAutoDefaultAndExcludeEachOther) {
  nlohmann::json j = Json(RunStrata(Small({"--json"})));
  EXPECT_EQ(j["config"]["strata"]["overlap"], "auto");
  j = Json(RunStrata(Small({"--json", "--overlap"})));
  EXPECT_EQ(j["config"]["strata"]["overlap"], true);
  j = Json(RunStrata(Small({"--json", "--no-overlap"})));
  EXPECT_EQ(j["config"]["strata"]["overlap"], false);
  CliRun both = RunStrata(Small({"--overlap", "--no-overlap"}));
  EXPECT_NE(both.exit_status, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
}

TEST_F(TrainCli, AccumulationAndTrainBatchSizeFollowDeepSpeedsRule) {
  std::string cfg = WriteConfig(R"({"gradient_accumulation_steps": 3, "zero_optimization": {"stage": 1}})");
  nlohmann::json j = Json(RunStrata(Small({"--config", cfg, "--json"})));
  EXPECT_EQ(j["config"]["gradient_accumulation_steps"], 3);
  EXPECT_EQ(j["config"]["train_batch_size"], 32 * 3);  // the default micro batch, one rank
  j = Json(RunStrata(Small({"--config", cfg, "--json", "--gradient-accumulation-steps", "2"})));
  EXPECT_EQ(j["config"]["gradient_accumulation_steps"], 2);

  cfg = WriteConfig(
      R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 1}})");
  j = Json(RunStrata(Small({"--config", cfg, "--json"})));
  EXPECT_EQ(j["config"]["gradient_accumulation_steps"], 4);
  j = Json(RunStrata(Small({"--config", cfg, "--json", "--train-batch-size", "32"})));
  EXPECT_EQ(j["config"]["gradient_accumulation_steps"], 2);

  CliRun bad = RunStrata(Small({"--config", cfg, "--gradient-accumulation-steps", "3"}));
  EXPECT_EQ(bad.exit_status, 1);
  EXPECT_NE(bad.err.find("train_batch_size = micro batch x accumulation x world size (48)"),
            std::string::npos)
      << bad.err;
}

TEST_F(TrainCli, FlagsOverrideOnlyWhenGiven) {
  const std::string other = (dir_ / "config-swap").string();
  const std::string cfg =
      WriteConfig(R"({"strata": {"device": "sim", "chunk_size": "8MiB", "host_budget": "3GiB"},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": ")" +
                  other + R"("}}})");
  nlohmann::json j = Json(RunStrata({"train", "--model", "mlp", "--params", "2M", "--depth", "2", "--steps",
                                     "1", "--config", cfg, "--json"}));
  EXPECT_EQ(j["config"]["strata"]["chunk_size"], 8u << 20);
  EXPECT_EQ(j["config"]["strata"]["host_budget"], 3ull << 30);
  EXPECT_EQ(j["config"]["zero_optimization"]["offload_optimizer"]["nvme_path"][0], other);
  j = Json(RunStrata(
      Small({"--config", cfg, "--json", "--host-budget", "2GiB", "--offload-optimizer", "cpu"}, 1)));
  EXPECT_EQ(j["config"]["strata"]["chunk_size"], 4u << 20);
  EXPECT_EQ(j["config"]["strata"]["host_budget"], 2ull << 30);
  EXPECT_EQ(j["config"]["zero_optimization"]["offload_optimizer"]["device"], "cpu");
}

TEST_F(TrainCli, PrintsEachStepAsItEndsAndExactlyTheStepsAsked) {
  CliRun r = RunStrata(Small({}, 3));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  for (const char* s :
       {"ZeRO stage 3", "world size 1", "optimizer state: nvme", "parameters: nvme",
        "per rank per micro-batch (default)", "accumulation 1 (default)", "gradient clipping: off",
        "memory needed per rank", "default: the device's capacity"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  }
  const std::regex step(R"(step +(\d+)/3  loss \d+\.\d+  lr 0\.001  [0-9.]+ samples/s  .+/step)");
  int lines = 0;
  for (std::sregex_iterator it(r.out.begin(), r.out.end(), step), end; it != end; ++it) {
    EXPECT_EQ(std::stoi((*it)[1]), ++lines);
  }
  EXPECT_EQ(lines, 3) << r.out;
  EXPECT_NE(r.out.find("ETA"), std::string::npos) << r.out;
  EXPECT_EQ(SwapEntries(), 0u) << "a finished run leaves no swap files";
}

TEST_F(TrainCli, RefusesBadValuesBeforeAnySwapFile) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--params", "0"}, "--params 0: the reference MLP with 2 hidden layers has at least"},
      {{"--params", "100"}, "--params 100"},
      {{"--micro-batch", "0"}, "--micro-batch 0: must be at least 1"},
      {{"--gradient-accumulation-steps", "0"}, "--gradient-accumulation-steps 0"},
      {{"--steps", "0"}, "--steps 0"},
  };
  for (const Case& c : cases) {
    CliRun r = RunStrata(Small(c.args));
    EXPECT_EQ(r.exit_status, 1) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(swap_)) << c.message << ": nothing is created before the refusal";
  }
  const std::string cfg =
      WriteConfig(R"({"zero_optimization": {"stage": 3, "offload_param": {"devise": "nvme"}}})");
  CliRun r = RunStrata(Small({"--config", cfg}));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_NE(r.err.find("did you mean \"zero_optimization.offload_param.device\"?"), std::string::npos)
      << r.err;
}

TEST_F(TrainCli, SaysWhenItCreatesTheSwapDirectory) {
  CliRun r = RunStrata(Small({}, 1));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.err.find("swap directory " + swap_ + " does not exist; creating it"), std::string::npos)
      << r.err;
}

void ExpectCleanInterrupt(const CliRun& r, int sig, size_t swap_entries) {
  EXPECT_EQ(r.exit_status, 128 + sig) << r.out << r.err;
  EXPECT_LT(r.seconds_after_signal, 5.0) << "stops within about a second";
  EXPECT_NE(r.err.find(sig == SIGINT ? "SIGINT" : "SIGTERM"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("removed its swap files"), std::string::npos) << r.err;
  EXPECT_EQ(swap_entries, 0u) << "no swap or lock file is left";
}

// `bench swap` is bench step on the engine's own NVMe swap: what training moves.
TEST_F(TrainCli, BenchSwapMeasuresTheEnginesNvmeSwap) {
  nlohmann::json j = Json(RunStrata({"bench", "swap", "--params", "2M", "--depth", "2", "--steps", "1",
                                     "--chunk-size", "1MiB", "--nvme-path", swap_, "--json"}));
  EXPECT_EQ(j["config"]["zero_optimization"]["stage"], 3) << j["config"].dump();
  EXPECT_GT(j["run"]["bytes"]["nvme_read"].get<double>(), 0) << j["run"].dump();
  EXPECT_GT(j["run"]["bytes"]["nvme_write"].get<double>(), 0);
  EXPECT_GT(j["speedup"].get<double>(), 0) << "the overlap-off run and the model's bound come with it";
  CliRun r = RunStrata({"bench", "swap", "--stage", "3", "--offload-optimizer", "cpu", "--offload-param",
                        "cpu", "--params", "2M", "--depth", "2", "--nvme-path", swap_});
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_NE(r.err.find("bench swap: nothing is offloaded to NVMe"), std::string::npos) << r.err;
}

TEST_F(TrainCli, InterruptRemovesSwapFilesAndExitsConventionally) {
  for (int sig : {SIGINT, SIGTERM}) {
    CliRun r = RunStrata(Small(OnDisk(), 100000), "step     2/", sig);
    ExpectCleanInterrupt(r, sig, SwapEntries());
    EXPECT_NE(r.out.find("step     2/"), std::string::npos) << "the steps that ended were shown";
  }
}

// The reference MLP saves and resumes too: three steps and a save, then a run resumed to
// six steps gives the unbroken run's last three losses bit for bit (all of it on NVMe).
TEST_F(TrainCli, TheMlpSavesAndResumesBitForBit) {
  const std::string ck = (dir_ / "ck").string();
  const nlohmann::json whole = Json(RunStrata(Small(OnDisk({"--json"}), 6)));
  CliRun r = RunStrata(Small(OnDisk({"--save", ck}), 3));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("checkpoint " + ck + "/step-000000003 saved"), std::string::npos) << r.out;
  const nlohmann::json rest = Json(RunStrata(Small(OnDisk({"--json", "--resume", ck}), 6)));
  ASSERT_EQ(rest["steps"].size(), 3u) << rest.dump();
  ASSERT_EQ(whole["steps"].size(), 6u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rest["steps"][i]["step"], 4 + i);
    EXPECT_EQ(rest["steps"][i]["loss"], whole["steps"][3 + i]["loss"]) << "step " << 4 + i;
  }
  r = RunStrata(Small(OnDisk({"--resume", ck, "--params", "3M"}), 6));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_NE(r.err.find("does not fit this engine"), std::string::npos) << r.err;
  r = RunStrata(Small({"--save-every", "2"}));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_NE(r.err.find("--save-every needs --save DIR"), std::string::npos) << r.err;
}

TEST_F(TrainCli, KeepSwapKeepsAndNamesTheFiles) {
  CliRun r = RunStrata(Small(OnDisk({"--keep-swap"}), 100000), "step     2/", SIGINT);
  EXPECT_EQ(r.exit_status, 130) << r.err;
  EXPECT_NE(r.err.find("kept its swap files"), std::string::npos) << r.err;
  const size_t rm = r.err.find("delete them with: rm -f ");
  ASSERT_NE(rm, std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" " + swap_ + "/strata-optim-r0.swap", rm), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" " + swap_ + "/strata-optim-r0.lock", rm), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(swap_ + "/strata-optim-r0.swap"));
}

TEST_F(TrainCli, RemovesSwapFilesThatACrashedRankLeft) {
  fs::create_directories(swap_);
  // An earlier two-rank run's rank 1, killed: its files stay, and no process holds the lock.
  std::ofstream(swap_ + "/strata-optim-r1.swap") << std::string(1 << 20, 'x');
  std::ofstream(swap_ + "/strata-optim-r1.lock") << "999999";
  // A live store of another process (this test holds its lock): left alone.
  std::ofstream(swap_ + "/strata-param-r2.swap") << "y";
  std::ofstream(swap_ + "/strata-param-r2.lock") << ::getpid();
  const int fd = ::open((swap_ + "/strata-param-r2.lock").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX | LOCK_NB), 0);
  CliRun r = RunStrata(Small({}, 1));
  ::close(fd);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.err.find("removed swap files that an earlier run left behind"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1.00 MiB in 2 files: " + swap_ + "/strata-optim-r1.swap, " + swap_ +
                       "/strata-optim-r1.lock"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(swap_ + "/strata-optim-r1.swap"));
  EXPECT_TRUE(fs::exists(swap_ + "/strata-param-r2.swap")) << "a live store is never removed";
  EXPECT_NE(r.err.find("belong to another live process"), std::string::npos) << r.err;
}

// Under mpirun, a rank killed mid-run: the survivor names it in strata's words and
// leaves none of its own swap files.
TEST_F(TrainCli, APeerKilledUnderMpirunIsNamed) {
  std::vector<std::string> args{"--oversubscribe", "--bind-to", "none", "-np", "2"};
  if (::geteuid() == 0) args.insert(args.begin(), "--allow-run-as-root");
  args.push_back(STRATA_BINARY);
  for (const std::string& a : Small(OnDisk(), 100000)) args.push_back(a);
  int victim = 0;
  CliRun r = testing::RunProgram("mpirun", args, "step     2/", [&](pid_t) {
    std::ifstream(swap_ + "/strata-optim-r1.lock") >> victim;
    if (victim > 0) ::kill(victim, SIGKILL);
  });
  ASSERT_GT(victim, 0) << "rank 1's pid from its lock file";
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.err.find("strata: rank 0: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 (pid " + std::to_string(victim) + ") has died (killed or crashed)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(swap_ + "/strata-optim-r0.swap")) << r.err;
  EXPECT_FALSE(fs::exists(swap_ + "/strata-optim-r0.lock")) << r.err;
  // The killed rank's files stay until the next run, which removes them at start.
  EXPECT_TRUE(fs::exists(swap_ + "/strata-optim-r1.swap"));
  CliRun next = RunStrata(Small({}, 1));
  ASSERT_EQ(next.exit_status, 0) << next.err;
  EXPECT_NE(next.err.find("removed swap files that an earlier run left behind"), std::string::npos)
      << next.err;
  EXPECT_EQ(SwapEntries(), 0u);
}

}  // namespace
}  // namespace strata
