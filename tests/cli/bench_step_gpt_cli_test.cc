// `strata bench step --model gpt`: the GPT's training step under the bench's report (the
// same fields as the MLP's), its bytes beside what `strata plan` predicts for the layout,
// and the refusal of the other model's flags.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli/cli_runner.h"

namespace strata {
namespace {

using testing::CliRun;
using testing::RunStrata;

class BenchStepGptCli : public testing::ScratchDirTest {
 protected:
  BenchStepGptCli() : ScratchDirTest("strata-bench-gpt-cli-test-") {}

  void SetUp() override {
    ScratchDirTest::SetUp();
    swap_ = (dir_ / "swap").string();
    data_ = (dir_ / "data").string();
    testing::PrepareWordData(dir_, data_);
    // Every chunk's state and shard on the disk: a model this small would otherwise keep
    // them all in host memory and move nothing.
    config_ = (dir_ / "all-on-nvme.json").string();
    std::ofstream(config_) << R"({"strata": {"optimizer_resident": 0, "param_resident": 0}})";
  }

  // Two measured steps at stage 3 with the optimizer and the parameters on NVMe.
  std::vector<std::string> Args(std::vector<std::string> model) const {
    std::vector<std::string> a = {
        "bench",           "step", "--config",    config_, "--stage", "3", "--offload-optimizer", "nvme",
        "--offload-param", "nvme", "--nvme-path", swap_,   "--steps", "2"};
    a.insert(a.end(), model.begin(), model.end());
    return a;
  }
  std::vector<std::string> TinyGpt() const {
    return {"--model",  "gpt", "--data", data_, "--n-layer",     "1", "--n-head",     "2",
            "--n-embd", "16",  "--seq",  "16",  "--micro-batch", "4", "--chunk-size", "16KiB"};
  }

  static nlohmann::json Json(const CliRun& r) {
    EXPECT_EQ(r.exit_status, 0) << r.err;
    try {
      return nlohmann::json::parse(r.out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what() << "\n" << r.out << r.err;
      return nlohmann::json::object();
    }
  }

  static std::set<std::string> Keys(const nlohmann::json& j) {
    std::set<std::string> keys;
    for (auto it = j.begin(); it != j.end(); ++it) keys.insert(it.key());
    return keys;
  }

  std::string swap_, data_, config_;
};

TEST_F(BenchStepGptCli, ReportsTheGptStepWithTheMlpsFields) {
  std::vector<std::string> gpt_args = Args(TinyGpt());
  gpt_args.push_back("--json");
  const nlohmann::json gpt = Json(RunStrata(gpt_args));
  const nlohmann::json mlp =
      Json(RunStrata(Args({"--params", "2M", "--depth", "2", "--chunk-size", "1MiB", "--json"})));
  ASSERT_TRUE(gpt.contains("run") && mlp.contains("run")) << gpt.dump() << mlp.dump();
  EXPECT_EQ(Keys(gpt), Keys(mlp));
  EXPECT_EQ(Keys(gpt["run"]), Keys(mlp["run"]));
  EXPECT_EQ(Keys(gpt["serial_run"]), Keys(mlp["serial_run"]));
  EXPECT_EQ(Keys(gpt["run"]["bytes"]), Keys(mlp["run"]["bytes"]));
  for (const char* k :
       {"overlap_efficiency", "speedup", "predicted_speedup", "model_time", "rates", "predicted_bytes"}) {
    EXPECT_TRUE(gpt.contains(k)) << k;
  }

  const nlohmann::json& m = gpt["model"];
  EXPECT_EQ(m.value("kind", ""), "gpt");
  EXPECT_EQ(m.value("n_layer", 0), 1);
  EXPECT_EQ(m.value("n_embd", 0), 16);
  EXPECT_EQ(m.value("seq", 0), 16);
  EXPECT_EQ(m.value("micro_batch", 0), 4);
  EXPECT_EQ(mlp["model"].value("kind", ""), "mlp");
  EXPECT_NE(m.value("description", "").find("GPT of "), std::string::npos) << m.dump();
  const nlohmann::json& run = gpt["run"];
  ASSERT_EQ(run["losses"].size(), 3u) << "the warm-up step and two measured";
  for (const nlohmann::json& l : run["losses"]) EXPECT_GT(l.get<double>(), 0.0);
  EXPECT_GT(run["step_s"].get<double>(), 0.0);
  EXPECT_GT(gpt["serial_run"]["step_s"].get<double>(), 0.0);

  // The step's NVMe traffic is what the planner predicts for this layout: the
  // optimizer state both ways, the parameter shards the gathers read.
  const uint64_t read = run["bytes"]["nvme_read"], written = run["bytes"]["nvme_write"];
  EXPECT_GT(read, 0u);
  EXPECT_GT(written, 0u);
  const nlohmann::json& planned = gpt["predicted_bytes"];
  EXPECT_EQ(planned["nvme_write"].get<double>(), static_cast<double>(written));
  // A chunk's first gather may find its shard still in memory from the step: up to one
  // shard either way (as the planner's own traffic test allows).
  const double slack = m["params_in_optimizer_state"].get<bool>() ? m["chunk_elems"].get<double>() * 4 : 0;
  EXPECT_NEAR(planned["nvme_read"].get<double>(), static_cast<double>(read), slack);
  EXPECT_EQ(planned["copies"].get<double>(),
            static_cast<double>(run["bytes"]["h2d"].get<uint64_t>() + run["bytes"]["d2h"].get<uint64_t>()));
  // The model's NVMe lane is timed over the step's measured bytes.
  EXPECT_GT(gpt["model_time"]["nvme_s"].get<double>(), 0.0) << gpt["model_time"].dump();
}

TEST_F(BenchStepGptCli, TextReportNamesTheGpt) {
  CliRun r = RunStrata(Args(TinyGpt()));
  ASSERT_EQ(r.exit_status, 0) << r.err;
  for (const char* line : {"  model                GPT of ", "  step time ",
                           "  plan's bytes         nvme read ", "  model: bound ", "  overlap off: step "}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
}

TEST_F(BenchStepGptCli, RefusesTheOtherModelsFlagsByName) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"bench", "step", "--model", "gpt", "--params", "2M"}, "--params is a flag of --model mlp"},
      {{"bench", "step", "--model", "gpt", "--depth", "2"}, "--depth is a flag of --model mlp"},
      {{"bench", "step", "--n-layer", "2"}, "--n-layer is a flag of --model gpt"},
      {{"bench", "step", "--model", "mlp", "--data", data_}, "--data is a flag of --model gpt"},
      {{"bench", "step", "--model", "gpt", "--data", (dir_ / "nowhere").string()}, "strata data prepare"},
  };
  for (const Case& c : cases) {
    CliRun r = RunStrata(c.args);
    EXPECT_NE(r.exit_status, 0) << c.message;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace strata
