// `strata train --model gpt` (the default model) as a user meets it: what a run prints
// and logs, that its validation loss falls, that a run is repeatable bit for bit, that
// mpirun runs it on two ranks, and refusals that name the flag or file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "cli/cli_runner.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using ::testing::HasSubstr;
using testing::RunStrata;

class GptTrainCli : public testing::ScratchDirTest {
 protected:
  GptTrainCli() : ScratchDirTest("strata-gpt-cli-test-") {}

  void SetUp() override {
    ScratchDirTest::SetUp();
    swap_ = (dir_ / "swap").string();
    data_ = (dir_ / "data").string();
    testing::PrepareWordData(dir_, data_);
  }

  // A tiny GPT at stage 3 with both planes on NVMe (the default placement); a flag in
  // `extra` replaces the default one.
  std::vector<std::string> Tiny(std::vector<std::string> extra, int steps) {
    const std::vector<std::pair<std::string, std::string>> base = {
        {"--data", data_},         {"--n-layer", "1"},
        {"--n-head", "2"},         {"--n-embd", "16"},
        {"--seq", "16"},           {"--micro-batch", "4"},
        {"--chunk-size", "16KiB"}, {"--nvme-path", swap_},
        {"--sample", "0"},         {"--steps", std::to_string(steps)}};
    std::vector<std::string> a{"train"};
    for (const auto& [flag, value] : base) {
      if (std::find(extra.begin(), extra.end(), flag) == extra.end()) a.insert(a.end(), {flag, value});
    }
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  std::vector<nlohmann::json> ReadLog(const std::string& path) {
    std::vector<nlohmann::json> lines;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  std::string swap_, data_;
};

TEST_F(GptTrainCli, PrintsStepsValidationAndSampleAndLogsEachLine) {
  const std::string log = (dir_ / "run.jsonl").string();
  CliRun r = RunStrata(Tiny({"--eval-every", "2", "--eval-batches", "2", "--log", log, "--sample", "24"}, 3));
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  for (const char* s :
       {"strata train: GPT", "1 layers, 2 heads, n_embd 16, block 16, vocab 256, tied head", "ZeRO stage 3",
        "optimizer state: nvme", "parameters: nvme", "sequences of 16 tokens per rank per micro-batch",
        "validation loss", "sample (temperature 0.8):"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
  const std::regex step(R"(step +(\d+)/3  loss \d+\.\d+  lr 0\.001  [0-9.]+ tokens/s  .+/step)");
  EXPECT_EQ(std::distance(std::sregex_iterator(r.out.begin(), r.out.end(), step), std::sregex_iterator()), 3)
      << r.out;
  std::vector<int> val_steps, train_steps;
  nlohmann::json throughput;
  for (const nlohmann::json& j : ReadLog(log)) {
    if (j.contains("val_loss")) val_steps.push_back(j["step"]);
    if (j.contains("loss")) {
      train_steps.push_back(j["step"]);
      EXPECT_GT(j["tokens_per_s"].get<double>(), 0);
      EXPECT_EQ(j["lr"].get<double>(), 0.001);
    }
    if (j.contains("sample")) {
      EXPECT_EQ(j["sample_tokens"].size(), 24u);
      EXPECT_FALSE(j["sample"].get<std::string>().empty());
    }
    if (j.contains("throughput")) throughput = j["throughput"];
  }
  // The model flops are the tokens' at 6 per parameter and attention's 12 L T C per
  // token: 7,664 parameters (tied, vocab 256, block 16, 1 layer, n_embd 16), T = 16.
  ASSERT_FALSE(throughput.empty()) << "the log ends with the throughput";
  EXPECT_THAT(r.out, HasSubstr("throughput: "));
  EXPECT_THAT(r.out, HasSubstr("of steps 1-3"));  // three steps: none are left out
  const double per_token = 6.0 * 7664 + 12.0 * 1 * 16 * 16;
  EXPECT_NEAR(throughput["model_flops_per_s"].get<double>(),
              throughput["tokens_per_s"].get<double>() * per_token,
              1e-9 * throughput["model_flops_per_s"].get<double>());
  EXPECT_GT(throughput["gemm_flops_per_s"].get<double>(), 1e8) << "any CPU of this century";
  EXPECT_NEAR(throughput["mfu"].get<double>(),
              throughput["model_flops_per_s"].get<double>() / throughput["gemm_flops_per_s"].get<double>(),
              1e-12);
  EXPECT_EQ(throughput["gemm_shape"], "[64 x 16] x [16 x 64]");  // micro-batch 4 x seq 16, n_embd 16
  EXPECT_EQ(throughput["gemm_library"], "Gemm");                 // the sim device: the CPU's products
  EXPECT_THAT(r.out, HasSubstr("Gemm's best on [64 x 16] x [16 x 64] here now"));
  EXPECT_EQ(train_steps, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(val_steps, (std::vector<int>{0, 2, 3}));
  // The memory line counts the token files, which opening them reads whole: their bytes
  // less the headers, to FormatBytes's three digits.
  std::smatch data_files;
  ASSERT_TRUE(std::regex_search(r.out, data_files, std::regex(R"(data files ([0-9.]+) (B|KiB|MiB)\))")))
      << r.out;
  const double unit = data_files[2] == "MiB" ? 1 << 20 : data_files[2] == "KiB" ? 1 << 10 : 1;
  const double files =
      static_cast<double>(fs::file_size(data_ + "/train.tokens") + fs::file_size(data_ + "/val.tokens"));
  EXPECT_NEAR(std::stod(data_files[1]) * unit, files, 0.01 * files + 256) << r.out;
  // The optimizer state is resident (the default host budget holds it), so there may
  // have been no swap at all; any that was is gone.
  if (fs::exists(swap_)) {
    EXPECT_EQ(std::distance(fs::directory_iterator(swap_), fs::directory_iterator()), 0)
        << "swap files removed";
  }
}

TEST_F(GptTrainCli, ValidationLossFallsAndARunRepeatsBitForBit) {
  auto run = [&](const std::string& log) {
    CliRun r = RunStrata(Tiny({"--eval-every", "0", "--log", log, "--lr", "0.01", "--json"}, 40));
    EXPECT_EQ(r.exit_status, 0) << r.err;
    return ReadLog(log);
  };
  const std::vector<nlohmann::json> a = run((dir_ / "a.jsonl").string()),
                                    b = run((dir_ / "b.jsonl").string());
  ASSERT_EQ(a.size(), 43u);  // 40 steps, validation before and after, the throughput
  const double first = a.front()["val_loss"], last = a[41]["val_loss"];
  EXPECT_NEAR(first, std::log(256.0), 0.3) << "an untrained byte model is near uniform";
  EXPECT_LT(last, 0.6 * first) << "the words repeat: 40 steps learn much of them";
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].value("loss", -1.0), b[i].value("loss", -1.0)) << i;
    EXPECT_EQ(a[i].value("val_loss", -1.0), b[i].value("val_loss", -1.0)) << i;
  }
}

TEST_F(GptTrainCli, TwoRanksUnderMpirunMatchOneRankWithTheSameGlobalBatch) {
  std::vector<std::string> args{"--oversubscribe", "--bind-to", "none", "-np", "2"};
  if (::geteuid() == 0) args.insert(args.begin(), "--allow-run-as-root");
  args.push_back(STRATA_BINARY);
  const std::string log2 = (dir_ / "two.jsonl").string(), log1 = (dir_ / "one.jsonl").string();
  for (const std::string& a : Tiny({"--micro-batch", "2", "--log", log2}, 3)) args.push_back(a);
  CliRun two = testing::RunProgram("mpirun", args, "", [](pid_t) {});
  ASSERT_EQ(two.exit_status, 0) << two.out << two.err;
  EXPECT_THAT(two.out, HasSubstr("world size 2"));
  CliRun one = RunStrata(Tiny({"--micro-batch", "4", "--log", log1}, 3));
  ASSERT_EQ(one.exit_status, 0) << one.err;
  const std::vector<nlohmann::json> a = ReadLog(log2), b = ReadLog(log1);
  ASSERT_EQ(a.size(), b.size());
  // The same samples; per-rank partial sums are added in another order: rounding only.
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].contains("throughput")) continue;  // each run's own machine time
    const char* key = a[i].contains("loss") ? "loss" : "val_loss";
    EXPECT_NEAR(a[i][key].get<double>(), b[i][key].get<double>(), 1e-5) << i;
  }
}

TEST_F(GptTrainCli, FollowsTheSchedulerAndRecomputesWithTheSameBits) {
  const std::string cfg = (dir_ / "ds.json").string();
  std::ofstream(cfg) << R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0,
      "warmup_max_lr": 0.01, "warmup_num_steps": 4, "warmup_type": "linear"}}})";
  const std::string plain = (dir_ / "plain.jsonl").string(), ckpt = (dir_ / "ckpt.jsonl").string();
  CliRun r = RunStrata(Tiny({"--config", cfg, "--log", plain, "--eval-every", "0"}, 6));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("lr schedule: WarmupLR, linear warmup over 4 steps"));
  EXPECT_THAT(r.out, HasSubstr("activation checkpointing off"));
  std::vector<double> lrs;
  for (const nlohmann::json& j : ReadLog(plain)) {
    if (j.contains("lr")) lrs.push_back(j["lr"]);
  }
  ASSERT_EQ(lrs.size(), 6u);
  // DeepSpeed's constructor and its first scheduler.step() both set iteration 0's rate,
  // warmup_min_lr; then the linear warmup reaches warmup_max_lr at iteration 4.
  EXPECT_EQ(lrs[0], 0.0);
  EXPECT_EQ(lrs[1], 0.0);
  for (int i = 2; i < 6; ++i) EXPECT_DOUBLE_EQ(lrs[i], 0.01 * (i - 1) / 4) << i;

  std::ofstream(cfg, std::ios::trunc) << R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0,
      "warmup_max_lr": 0.01, "warmup_num_steps": 4, "warmup_type": "linear"}},
      "activation_checkpointing": {"partition_activations": false}})";
  r = RunStrata(Tiny({"--config", cfg, "--log", ckpt, "--eval-every", "0"}, 6));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("activation checkpointing on"));
  const std::vector<nlohmann::json> a = ReadLog(plain), b = ReadLog(ckpt);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].value("loss", -1.0), b[i].value("loss", -1.0)) << i;
    EXPECT_EQ(a[i].value("val_loss", -1.0), b[i].value("val_loss", -1.0)) << i;
  }
  r = RunStrata({"train", "--model", "mlp", "--config", cfg, "--steps", "1"});
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("the reference MLP (--model mlp, bench step) has no activation recompute"));
}

// Steps and validation losses of a log, by step (checkpoint and sample lines left out).
std::map<std::pair<int, std::string>, double> Losses(const std::vector<nlohmann::json>& log) {
  std::map<std::pair<int, std::string>, double> out;
  for (const nlohmann::json& j : log) {
    for (const char* key : {"loss", "val_loss"}) {
      if (j.contains(key)) out[{j["step"].get<int>(), key}] = j[key];
    }
  }
  return out;
}

TEST_F(GptTrainCli, ASaveKillAndResumeContinuesBitForBit) {
  const std::string whole = (dir_ / "whole.jsonl").string(), parts = (dir_ / "parts.jsonl").string();
  const std::string ck = (dir_ / "ck").string();
  const std::vector<std::string> sched = {"--eval-every", "2", "--lr", "0.01"};
  auto with = [&](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  CliRun r = RunStrata(Tiny(with(sched, {"--log", whole}), 8));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  // Killed (no chance to clean up) after the save of step 3, while training on.
  r = RunStrata(Tiny(with(sched, {"--log", parts, "--save", ck, "--save-every", "3", "--keep", "5"}), 100000),
                "step-000000003 saved", SIGKILL);
  EXPECT_EQ(r.exit_status, 128 + SIGKILL);
  r = RunStrata(Tiny(with(sched, {"--log", parts, "--resume", ck + "/step-000000003"}), 8));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("resumed from " + ck + "/step-000000003 after 3 steps"));
  const auto a = Losses(ReadLog(whole)), b = Losses(ReadLog(parts));
  for (const auto& [key, loss] : a) {
    ASSERT_TRUE(b.count(key)) << key.second << " of step " << key.first;
    EXPECT_EQ(b.at(key), loss) << key.second << " of step " << key.first;
  }
  // A resume with another sequence length would not continue the same run.
  r = RunStrata(Tiny({"--resume", ck, "--seq", "8", "--block-size", "16"}, 8));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("saved by a run with seq 16, this run has 8"));
}

// Killed (SIGKILL) at seeded random moments of a run that saves after every step (its
// files are written during the next step, so most kills land inside a save: 5 and 8 of
// the 8 in two runs here): each time,
// the newest complete checkpoint verifies, and the next run resumes from it.
TEST_F(GptTrainCli, KilledAtRandomPointsOfItsSavesItAlwaysResumes) {
  const std::string ck = (dir_ / "ck").string();
  const std::vector<std::string> run = Tiny({"--save", ck, "--save-every", "1", "--keep", "2", "--resume",
                                             "auto", "--eval-every", "0", "--lr", "0.01"},
                                            100000);
  std::mt19937 rng(20261204);
  int inside_a_save = 0, resumed = 0;
  for (int round = 0; round < 8; ++round) {
    const int delay_ms = std::uniform_int_distribution<int>(20, 400)(rng);
    SCOPED_TRACE("round " + std::to_string(round) + ", killed " + std::to_string(delay_ms) + " ms in");
    std::thread killer;
    // Counted from the run's first finished save, so there is always one to resume.
    CliRun r = testing::RunProgram(STRATA_BINARY, run, " saved in ", [&](pid_t pid) {
      killer = std::thread([pid, delay_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
        ::kill(pid, SIGKILL);
      });
    });
    if (killer.joinable()) killer.join();
    ASSERT_EQ(r.exit_status, 128 + SIGKILL) << r.out << r.err;
    if (r.out.find("resumed from") != std::string::npos) ++resumed;
    std::string newest;
    for (const auto& entry : fs::directory_iterator(ck)) {
      const std::string name = entry.path().filename().string();
      if (name.find(".tmp-") != std::string::npos) {
        ++inside_a_save;
      } else if (name > fs::path(newest).filename().string()) {
        newest = entry.path().string();
      }
    }
    ASSERT_FALSE(newest.empty()) << "no complete checkpoint after " << delay_ms << " ms";
    CliRun v = RunStrata({"ckpt", "verify", newest});
    EXPECT_EQ(v.exit_status, 0) << v.out << v.err;
  }
  EXPECT_EQ(resumed, 7) << "every run after the first resumes";
  EXPECT_GT(inside_a_save, 0) << "no kill landed inside a save";
}

// Saved by two ranks under mpirun, resumed by one with the same global batch: the load
// reshards the state, and the run goes on as the one-rank run does (to rounding: the two
// ranks' partial sums were added in another order before the save).
TEST_F(GptTrainCli, ASaveOfTwoRanksResumesOnOne) {
  const std::string whole = (dir_ / "whole.jsonl").string(), parts = (dir_ / "parts.jsonl").string();
  const std::string ck = (dir_ / "ck").string();
  CliRun r = RunStrata(Tiny({"--log", whole, "--eval-every", "2", "--lr", "0.01"}, 6));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  std::vector<std::string> args{"--oversubscribe", "--bind-to", "none", "-np", "2"};
  if (::geteuid() == 0) args.insert(args.begin(), "--allow-run-as-root");
  args.push_back(STRATA_BINARY);
  for (const std::string& a : Tiny({"--micro-batch", "2", "--log", parts, "--eval-every", "2", "--lr", "0.01",
                                    "--save", ck, "--save-every", "3"},
                                   3)) {
    args.push_back(a);
  }
  r = testing::RunProgram("mpirun", args, "", [](pid_t) {});
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  r = RunStrata(
      Tiny({"--log", parts, "--eval-every", "2", "--lr", "0.01", "--stage", "1", "--resume", ck}, 6));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("after 3 steps (saved by 2 ranks at stage 3, loaded by 1 at stage 1)"));
  const auto a = Losses(ReadLog(whole)), b = Losses(ReadLog(parts));
  for (const auto& [key, loss] : a) {
    ASSERT_TRUE(b.count(key)) << key.second << " of step " << key.first;
    EXPECT_NEAR(b.at(key), loss, 1e-6) << key.second << " of step " << key.first;
  }
}

// The weights of an exported checkpoint start a new run where the saved one stood (its
// validation loss, to the bit); a file that does not fit the model is refused naming every
// tensor that differs.
TEST_F(GptTrainCli, StartsFromExportedWeightsAndNamesEveryMismatch) {
  const std::string ck = (dir_ / "ck").string(), a = (dir_ / "a.jsonl").string(),
                    b = (dir_ / "b.jsonl").string();
  const std::string weights = (dir_ / "w.safetensors").string();
  CliRun r = RunStrata(Tiny({"--log", a, "--save", ck, "--lr", "0.01"}, 5));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  r = RunStrata({"ckpt", "export", ck + "/step-000000005", "--out", weights});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  r = RunStrata(Tiny({"--log", b, "--init-from", weights, "--stage", "1"}, 1));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("initial weights: " + weights));
  const auto saved = Losses(ReadLog(a)), started = Losses(ReadLog(b));
  ASSERT_TRUE(saved.count({5, "val_loss"}) && started.count({0, "val_loss"}));
  EXPECT_EQ(started.at({0, "val_loss"}), saved.at({5, "val_loss"}));

  r = RunStrata(Tiny({"--init-from", weights, "--n-embd", "32"}, 1));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("does not fit the model"));
  EXPECT_THAT(r.err, HasSubstr("\"wte\": [256, 16] in the file, the model's is [256, 32]"));
  r = RunStrata(Tiny({"--init-from", weights, "--untied"}, 1));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("not in the file"));
  std::ofstream(dir_ / "junk.safetensors") << "not a safetensors file at all";
  r = RunStrata(Tiny({"--init-from", (dir_ / "junk.safetensors").string()}, 1));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("not a safetensors file"));
  r = RunStrata(Tiny({"--init-from", weights, "--resume", ck}, 1));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("--init-from and --resume"));
}

TEST_F(GptTrainCli, RefusesFlagsOfTheOtherModelAndBadDataWithTheirNames) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"train", "--params", "2M"}, "--params is a flag of --model mlp"},
      {{"train", "--model", "mlp", "--n-layer", "2"}, "--n-layer is a flag of --model gpt"},
      {{"train", "--data", (dir_ / "nowhere").string()}, "strata data prepare"},
      {Tiny({"--seq", "32", "--block-size", "16"}, 1), "--block-size 16 is below --seq 32"},
      {Tiny({"--n-embd", "10", "--n-head", "4"}, 1), "--n-embd 10 is not a multiple of --n-head 4"},
      {Tiny({"--temperature", "0"}, 1), "--temperature must be above 0"},
      {Tiny({"--log", (dir_ / "no-such-dir" / "log.jsonl").string()}, 1), "cannot be opened for writing"},
  };
  for (const Case& c : cases) {
    CliRun r = RunStrata(c.args);
    EXPECT_EQ(r.exit_status, 1) << c.message;
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
  std::ofstream(data_ + "/val.tokens", std::ios::binary | std::ios::trunc) << "not tokens";
  CliRun r = RunStrata(Tiny({}, 1));
  EXPECT_EQ(r.exit_status, 1);
  EXPECT_THAT(r.err, HasSubstr("val.tokens"));
}

}  // namespace
}  // namespace strata
