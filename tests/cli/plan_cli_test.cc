// `strata plan` as a user runs it: a saved profile or measured rates, the text and JSON
// reports, and the refusals of bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "zero/safetensors_writer.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::RunStrata;

class PlanCli : public testing::ScratchDirTest {
 protected:
  PlanCli() : ScratchDirTest("strata-plan-cli-") {}
  std::string Dir() const { return dir_.string(); }
  std::string Profile() const;
  std::vector<std::string> Args(std::vector<std::string> more) const;
};

// Rates as `strata plan --save-profile` writes them, chosen so the test does not depend
// on this machine's speed.
std::string PlanCli::Profile() const {
  const std::string path = Dir() + "/profile.json";
  nlohmann::json engine = {
      {"optimizer_params_per_s", 1e9}, {"other_s_per_param", 1e-9}, {"overlap_factor", 1.2}};
  nlohmann::json j = {
      {"adam_params_per_s", 2e9},      {"copy_bytes_per_s", 10e9},      {"nvme_read_bytes_per_s", 2e9},
      {"nvme_write_bytes_per_s", 2e9}, {"nvme_mixed_bytes_per_s", 3e9}, {"compute_flops_per_s", 1e11},
      {"device_optimizer", engine},    {"host_optimizer", engine},      {"nvme_optimizer", engine}};
  std::ofstream(path) << j.dump();
  return path;
}

std::vector<std::string> PlanCli::Args(std::vector<std::string> more) const {
  std::vector<std::string> a = {
      "plan",          "--model",         "mlp",   "--params",      "2M",    "--depth", "2", "--nvme-path",
      Dir() + "/swap", "--device-budget", "48MiB", "--host-budget", "256MiB"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST_F(PlanCli, JsonRanksWhatFitsFastestFirstWithItsMemoryAndTime) {
  CliRun r = RunStrata(Args({"--profile", Profile(), "--json"}));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& all = j["candidates"];
  ASSERT_EQ(all.size(), 14u);
  EXPECT_EQ(j["rates"]["compute_flops_per_s"], 1e11) << "the profile's rates, not measured ones";
  double last = 0;
  bool seen_misfit = false;
  int fits = 0;
  for (const auto& c : all) {
    if (!c["fits"]) {
      seen_misfit = true;
      EXPECT_FALSE(c["refusal"].get<std::string>().empty()) << c["name"];
      continue;
    }
    ++fits;
    EXPECT_FALSE(seen_misfit) << "what fits comes first: " << c["name"];
    EXPECT_GE(c["predicted_step_s"].get<double>(), last) << c["name"];
    last = c["predicted_step_s"];
    EXPECT_GT(c["memory"]["device"].get<uint64_t>(), 0u);
    EXPECT_LE(c["memory"]["device"].get<uint64_t>(), 48ull << 20) << c["name"];
    EXPECT_LE(c["memory"]["host"].get<uint64_t>(), 256ull << 20) << c["name"];
    // An NVMe optimizer's pipeline depth is in the layout: at least the fixed set.
    const int sets = c["layout"]["optimizer_staging_sets"];
    EXPECT_EQ(sets >= 1, c["offload_optimizer"] == "nvme") << c["name"] << ": " << sets << " staging sets";
  }
  EXPECT_GT(fits, 0);
  EXPECT_LT(fits, 14) << "48 MiB of device memory cannot hold the 2M model's state at stage 0";
  EXPECT_FALSE(std::filesystem::exists(Dir() + "/swap")) << "planning from a profile creates nothing";
}

// The plan's process base is the process as the run has it: `bench step` (like `train`)
// starts MPI before it measures its base, and MPI's own memory (about 10 MB with OpenMPI
// here) was missing from the plan's account until the plan started MPI too.
TEST_F(PlanCli, TheProcessBaseCountsWhatTheRunStartsBeforeItsEngine) {
  CliRun plan = RunStrata(Args({"--profile", Profile(), "--json"}));
  ASSERT_EQ(plan.exit_status, 0) << plan.err;
  std::vector<std::string> bench = Args({"--steps", "1", "--no-probes", "--json"});
  bench[0] = "step";
  bench.insert(bench.begin(), "bench");
  CliRun run = RunStrata(bench);
  ASSERT_EQ(run.exit_status, 0) << run.err;
  const nlohmann::json first = nlohmann::json::parse(plan.out)["candidates"][0];
  ASSERT_TRUE(first["fits"]) << first.dump();
  const double planned = first["memory"]["process"]["base"].get<double>();
  const double measured = nlohmann::json::parse(run.out)["run"]["process_estimate"]["base"].get<double>();
  EXPECT_NEAR(planned, measured, 3 << 20) << "the plan's base against the run's, in bytes";
}

TEST_F(PlanCli, TextNamesTheFirstChoiceAndWhyOthersDoNotFit) {
  CliRun r = RunStrata(Args({"--profile", Profile()}));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("first choice: stage"), std::string::npos) << r.out;
  // The flags that train with the choice name its overlap either way (the default is auto).
  const size_t flags = r.out.find("(--stage ", r.out.find("first choice: stage"));
  ASSERT_NE(flags, std::string::npos) << r.out;
  const std::string choice = r.out.substr(flags, r.out.find(')', flags) - flags);
  EXPECT_TRUE(choice.find(" --overlap") != std::string::npos ||
              choice.find(" --no-overlap") != std::string::npos)
      << choice;
  EXPECT_NE(r.out.find("does not fit:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the device tier cannot hold this configuration: it needs"), std::string::npos)
      << r.out;
}

TEST_F(PlanCli, MeasuresWhenNoProfileIsGivenAndSavesIt) {
  const std::string saved = Dir() + "/measured.json";
  CliRun r = RunStrata(Args({"--save-profile", saved, "--json"}));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  nlohmann::json rates = nlohmann::json::parse(std::ifstream(saved));
  EXPECT_GT(rates["compute_flops_per_s"].get<double>(), 0);
  EXPECT_GT(rates["host_optimizer"]["optimizer_params_per_s"].get<double>(), 0);
  EXPECT_GT(rates["nvme_read_bytes_per_s"].get<double>(), 0);
  CliRun again = RunStrata(Args({"--profile", saved, "--json"}));
  EXPECT_EQ(again.exit_status, 0) << again.err;
}

// A GPT-2-like checkpoint's header: two blocks of width 64, vocabulary 256.
std::string WriteHeaderModel(const std::string& path) {
  std::vector<testing::HeaderTensor> t = {{"wte.weight", "F32", {256, 64}}, {"wpe.weight", "F32", {32, 64}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (const char* ln : {"ln_1", "ln_2"})
      t.insert(t.end(), {{h + ln + ".weight", "F32", {64}}, {h + ln + ".bias", "F32", {64}}});
    t.insert(t.end(), {{h + "attn.c_attn.weight", "BF16", {64, 192}},
                       {h + "attn.c_attn.bias", "BF16", {192}},
                       {h + "attn.c_proj.weight", "BF16", {64, 64}},
                       {h + "attn.c_proj.bias", "BF16", {64}},
                       {h + "mlp.c_fc.weight", "BF16", {64, 256}},
                       {h + "mlp.c_fc.bias", "BF16", {256}},
                       {h + "mlp.c_proj.weight", "BF16", {256, 64}},
                       {h + "mlp.c_proj.bias", "BF16", {64}}});
  }
  t.insert(t.end(), {{"ln_f.weight", "F32", {64}}, {"ln_f.bias", "F32", {64}}});
  testing::WriteSafetensors(path, t);
  return path;
}

TEST_F(PlanCli, PlansASafetensorsHeaderWithItsComputeEstimated) {
  const std::string file = WriteHeaderModel(Dir() + "/gpt2-tiny.safetensors");
  std::vector<std::string> a = {
      "plan",   "--model-file",  file, "--seq",     "32",     "--nvme-path", Dir() + "/swap", "--host-budget",
      "256MiB", "--micro-batch", "2",  "--profile", Profile()};
  CliRun r = RunStrata(a);
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.out.find("plan: safetensors " + file + ": "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(
                "compute: estimated, not measured: 6 flops per parameter per token (attention's products not "
                "counted), 32 tokens a sequence"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("activations: not counted"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("first choice: stage"), std::string::npos) << r.out;
  a.push_back("--json");
  CliRun j = RunStrata(a);
  ASSERT_EQ(j.exit_status, 0) << j.err;
  nlohmann::json plan = nlohmann::json::parse(j.out);
  const int64_t params = 256 * 64 + 32 * 64 +
                         2 * (4 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64) +
                         2 * 64;
  EXPECT_EQ(plan["params"], params);
  EXPECT_EQ(plan["compute_estimated"], true);
  EXPECT_EQ(plan["activations_counted"], false);
  EXPECT_EQ(plan["micro_batch"], 2);
  const nlohmann::json& best = plan["candidates"][0];
  ASSERT_TRUE(best["fits"]) << best.dump();
  EXPECT_TRUE(best["memory"]["process"]["activations"].is_null());
  EXPECT_DOUBLE_EQ(best["work"]["compute_s"].get<double>(), 6.0 * params * 32 * 2 / 1e11)
      << "6 flops a parameter a token at the profile's compute rate";
}

TEST_F(PlanCli, ABrokenModelFileOrAFlagOfTheBuiltInModelsIsRefused) {
  const std::string bad = Dir() + "/bad.safetensors";
  testing::WriteRawSafetensors(bad, "{\"w\": {\"dtype\": \"I8\", \"shape\": [4], \"data_offsets\": [0, 4]}}",
                               4);
  CliRun r = RunStrata({"plan", "--model-file", bad, "--profile", Profile()});
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.err.find(bad + ": tensor \"w\" has dtype I8"), std::string::npos) << r.err;
  const std::string file = WriteHeaderModel(Dir() + "/gpt2-tiny.safetensors");
  CliRun layers = RunStrata({"plan", "--model-file", file, "--n-layer", "4", "--profile", Profile()});
  EXPECT_NE(layers.exit_status, 0);
  EXPECT_NE(layers.err.find("--n-layer is a flag of the built-in models"), std::string::npos) << layers.err;
  CliRun both = RunStrata({"plan", "--model-file", file, "--model", "mlp", "--profile", Profile()});
  EXPECT_NE(both.exit_status, 0);
  EXPECT_NE(both.err.find("--model and --model-file"), std::string::npos) << both.err;
}

TEST_F(PlanCli, BadInputIsRefusedByName) {
  CliRun both = RunStrata(Args({"--profile", Profile(), "--measure"}));
  EXPECT_NE(both.exit_status, 0);
  EXPECT_NE(both.err.find("--measure and --profile"), std::string::npos) << both.err;
  CliRun missing = RunStrata(Args({"--profile", Dir() + "/nothing.json"}));
  EXPECT_NE(missing.exit_status, 0);
  EXPECT_NE(missing.err.find("nothing.json"), std::string::npos) << missing.err;
  const std::string bad = Dir() + "/bad.json";
  std::ofstream(bad) << "{\"adam_params_per_s\": 1}";
  CliRun incomplete = RunStrata(Args({"--profile", bad}));
  EXPECT_NE(incomplete.exit_status, 0);
  EXPECT_NE(incomplete.err.find("copy_bytes_per_s"), std::string::npos) << incomplete.err;
  CliRun ranks = RunStrata(Args({"--profile", Profile(), "--world-size", "0"}));
  EXPECT_NE(ranks.exit_status, 0);
  EXPECT_NE(ranks.err.find("--world-size"), std::string::npos) << ranks.err;
}

std::vector<std::string> TrainArgs(const std::string& dir, std::vector<std::string> more) {
  std::vector<std::string> a = {
      "train", "--model",     "mlp",         "--params",        "2M",    "--depth",       "2",     "--steps",
      "2",     "--nvme-path", dir + "/swap", "--device-budget", "48MiB", "--host-budget", "256MiB"};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

TEST_F(PlanCli, TrainConfigAutoTrainsWithThePlansFirstChoice) {
  CliRun r = RunStrata(TrainArgs(Dir(), {"--config", "auto", "--json"}));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.err.find("--config auto: stage"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("configurations that fit"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(" the fastest predicted"), std::string::npos) << "why this one: " << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& c = j["config"];
  EXPECT_EQ(c["strata"]["plan"], "off") << "resolved before the engine starts";
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), j["budget_need"]["host"].get<uint64_t>())
      << "the measured memory beside the plan's";
  const int stage = c["zero_optimization"]["stage"];
  const std::string opt = c["zero_optimization"]["offload_optimizer"]["device"];
  // 48 MiB of device memory holds the 2M model's whole state in no configuration
  // without an offload (PlanCli.JsonRanks... shows stage 0 refused).
  EXPECT_FALSE(stage < 3 && opt == "none") << c.dump();
  std::string chosen = "--config auto: stage " + std::to_string(stage) + ", optimizer " + opt;
  if (stage == 3)
    chosen += ", params " + c["zero_optimization"]["offload_param"]["device"].get<std::string>();
  chosen += std::string(", overlap ") + (c["strata"]["overlap"].get<bool>() ? "on" : "off");
  EXPECT_NE(r.err.find(chosen), std::string::npos) << r.err << "\nthe run: " << c.dump();
}

TEST_F(PlanCli, PlansTheGptOfStrataTrainsFlags) {
  CliRun r = RunStrata({"plan", "--n-layer", "2", "--n-embd", "64", "--seq", "32", "--nvme-path",
                        Dir() + "/swap", "--host-budget", "256MiB", "--profile", Profile(), "--json"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["model"].get<std::string>().find("GPT of"), std::string::npos) << j["model"];
  EXPECT_NE(j["model"].get<std::string>().find("2 layers, n_embd 64"), std::string::npos) << j["model"];
  EXPECT_EQ(j["micro_batch"], 8) << "the GPT's default micro-batch, as strata train";
  EXPECT_TRUE(j["candidates"][0]["fits"]);
  // The token files the run will map and read whole are in the process's account.
  const nlohmann::json& process = j["candidates"][0]["memory"]["process"];
  EXPECT_GT(process["data"].get<uint64_t>(), 0u) << process;
  EXPECT_EQ(process["total"].get<uint64_t>(),
            process["base"].get<uint64_t>() + process["creation"].get<uint64_t>() +
                process["activations"].get<uint64_t>() + process["data"].get<uint64_t>());
  CliRun mlp_flag = RunStrata({"plan", "--params", "2M", "--profile", Profile()});
  EXPECT_NE(mlp_flag.exit_status, 0);
  EXPECT_NE(mlp_flag.err.find("--params"), std::string::npos) << mlp_flag.err;
}

TEST_F(PlanCli, TrainConfigAutoPlansTheGptTooWhichIsTheDefaultJob) {
  CliRun r = RunStrata({"train", "--config", "auto", "--steps", "2", "--n-layer", "2", "--n-embd", "64",
                        "--seq", "32", "--sample", "0", "--eval-every", "0", "--nvme-path", Dir() + "/swap",
                        "--host-budget", "256MiB"});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_NE(r.err.find("--config auto: stage"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("strata plan's first choice"), std::string::npos)
      << "the summary says where the stage came from\n"
      << r.out;
  EXPECT_NE(r.out.find("memory: peak RSS"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" + process "), std::string::npos) << "the process beside the tiers\n" << r.out;
  EXPECT_NE(r.out.find("activations at most "), std::string::npos) << r.out;
}

TEST_F(PlanCli, TrainConfigAutoRefusesWhatItWouldOverride) {
  CliRun stage = RunStrata(TrainArgs(Dir(), {"--config", "auto", "--stage", "2"}));
  EXPECT_NE(stage.exit_status, 0);
  EXPECT_NE(stage.err.find("zero_optimization.stage: strata.plan \"auto\""), std::string::npos) << stage.err;
  CliRun overlap = RunStrata(TrainArgs(Dir(), {"--config", "auto", "--no-overlap"}));
  EXPECT_NE(overlap.exit_status, 0);
  EXPECT_NE(overlap.err.find("strata.overlap"), std::string::npos) << overlap.err;
}

TEST_F(PlanCli, TrainConfigAutoSaysWhyNothingFits) {
  const std::string cfg = Dir() + "/auto.json";
  std::ofstream(cfg) << R"({"strata": {"plan": "auto", "device_budget": 4096, "host_budget": 4096}})";
  std::vector<std::string> a = TrainArgs(Dir(), {});
  a.resize(a.size() - 4);  // without the budget flags
  a.insert(a.end(), {"--config", cfg});
  CliRun r = RunStrata(a);
  EXPECT_NE(r.exit_status, 0);
  EXPECT_NE(r.err.find("no configuration fits the budgets"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stage 3, optimizer nvme, params nvme: the"), std::string::npos) << r.err;
  // The disk probe made the directory and removed its file; no swap file was created.
  EXPECT_TRUE(std::filesystem::is_empty(Dir() + "/swap")) << "nothing left in the swap directory";
}

}  // namespace
}  // namespace strata
