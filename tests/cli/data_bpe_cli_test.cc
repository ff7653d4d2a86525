// `strata data prepare --bpe` and training on its tokens, as a user meets them: the
// default corpus in GPT-2 BPE tokens (tokenizers' count, tests/data/bpe/golden.json), a
// tiny GPT trained on them that prompts and samples in text, and refusals that name the
// file and the fix.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "cli/cli_runner.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing::CliRun;
using ::testing::HasSubstr;
using testing::RunStrata;

const std::string kBpe = std::string(STRATA_TEST_DATA_DIR) + "/bpe";

class DataBpeCli : public testing::ScratchDirTest {
 protected:
  DataBpeCli() : ScratchDirTest("strata-bpe-cli-test-") {}
  void SetUp() override {
    ScratchDirTest::SetUp();
    text_ = (dir_ / "text.txt").string();
    std::ofstream out(text_);
    const char* words[] = {"the cat", "sat on", "the mat", "and then"};
    for (int i = 0; i < 3000; ++i) out << words[i % 4] << (i % 9 == 8 ? ".\n" : " ");
  }
  // `strata train` of a GPT of `layers` blocks of width 16 on `data`, swapping in dir_.
  std::vector<std::string> TinyGpt(const std::string& data, int layers) const {
    return {"train",
            "--data",
            data,
            "--n-layer",
            std::to_string(layers),
            "--n-head",
            "2",
            "--n-embd",
            "16",
            "--seq",
            "16",
            "--micro-batch",
            "2",
            "--nvme-path",
            (dir_ / "swap").string()};
  }
  std::string text_;
};

// Each file is encoded on its own; on this corpus that gives the tokens tokenizers gives
// the whole stream (every file ends in a newline).
TEST_F(DataBpeCli, TheDefaultCorpusHasTheReferenceTokenCount) {
  std::ifstream g(kBpe + "/golden.json");
  const nlohmann::json corpus = nlohmann::json::parse(g)["corpus"];
  if (!fs::is_directory(corpus["dir"].get<std::string>())) GTEST_SKIP() << "no default corpus here";
  const std::string out = (dir_ / "data").string();
  CliRun r = RunStrata({"data", "prepare", "--bpe", kBpe, "--out", out});
  ASSERT_EQ(r.exit_status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("GPT-2 BPE tokens (vocab 2000, 1744 merges, kept in " + out + "/tokenizer)"));
  EXPECT_THAT(r.out, HasSubstr("(" + std::to_string(corpus["bytes"].get<int64_t>()) + " bytes)"));
  int64_t tokens = 0;
  for (const char* split : {"train", "val"}) {
    CliRun info = RunStrata({"data", "info", out + "/" + split + ".tokens"});
    ASSERT_EQ(info.exit_status, 0) << info.err;
    EXPECT_THAT(info.out, HasSubstr("GPT-2 BPE, " + out + "/tokenizer/vocab.json"));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(info.out, m, std::regex(R"(tokens\s*\|?\s*(\d+))"))) << info.out;
    tokens += std::stoll(m[1]);
  }
  EXPECT_EQ(tokens, corpus["tokens"].get<int64_t>());
}

TEST_F(DataBpeCli, ATinyGptTrainsOnBpeTokensAndSamplesText) {
  const std::string data = (dir_ / "data").string(), log = (dir_ / "run.jsonl").string();
  ASSERT_EQ(RunStrata({"data", "prepare", text_, "--bpe", kBpe, "--out", data}).exit_status, 0);
  std::vector<std::string> args = TinyGpt(data, 1);
  for (const char* a : {"--steps", "2", "--sample", "12", "--prompt", "the cat", "--log"}) args.push_back(a);
  args.push_back(log);
  CliRun r = RunStrata(args);
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("vocab 2000"));
  EXPECT_THAT(r.out, HasSubstr("sample (temperature 0.8):\nthe cat"));
  std::ifstream in(log);
  bool sampled = false;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("sample")) continue;
    sampled = true;
    EXPECT_EQ(j["sample_tokens"].size(), 12u);
    for (int id : j["sample_tokens"]) EXPECT_LT(id, 2000);
    EXPECT_FALSE(j["sample"].get<std::string>().empty());
  }
  EXPECT_TRUE(sampled);
}

// Four blocks of width 16 beside a 2000 x 16 token embedding: the embedding and its tied
// head are outliers, so the embedding takes a run of chunks (zero/layout.h) instead of
// setting the chunk's size; stage 3 with both planes on NVMe trains through it.
TEST_F(DataBpeCli, AnEmbeddingLargerThanAChunkTakesARun) {
  const std::string data = (dir_ / "data").string();
  ASSERT_EQ(RunStrata({"data", "prepare", text_, "--bpe", kBpe, "--out", data}).exit_status, 0);
  std::vector<std::string> args = TinyGpt(data, 4);
  for (const char* a : {"--steps", "3", "--stage", "3", "--offload-optimizer", "nvme", "--offload-param",
                        "nvme", "--chunk-size", "8KiB"})
    args.push_back(a);
  CliRun r = RunStrata(args);
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  // The chunk: the 2,048 values asked for, raised to the blocks' largest module (the MLP
  // half, 2,160) and rounded to 2,048s: 4,096. The embedding's 32,000 values take 8.
  EXPECT_THAT(r.out, HasSubstr("12 chunks of 16.0 KiB, 8 of them held by tensors larger than a chunk"))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("step     3/3")) << r.out;
}

TEST_F(DataBpeCli, RefusalsNameTheFileAndTheFix) {
  const std::string data = (dir_ / "data").string();
  CliRun none = RunStrata({"data", "prepare", text_, "--bpe", dir_.string(), "--out", data});
  EXPECT_NE(none.exit_status, 0);
  EXPECT_THAT(none.err,
              HasSubstr("--bpe " + dir_.string() + ": the directory has neither vocab.json nor merges.txt"));

  const std::string latin1 = (dir_ / "latin1.txt").string();
  std::ofstream(latin1) << std::string(3000, 'a') << "caf\xe9 au lait";
  CliRun bad = RunStrata({"data", "prepare", latin1, "--bpe", kBpe, "--out", data});
  EXPECT_NE(bad.exit_status, 0);
  EXPECT_THAT(bad.err, HasSubstr("input file \"" + latin1 + "\""));
  EXPECT_THAT(bad.err, HasSubstr("not valid UTF-8 at byte 3003"));
  EXPECT_FALSE(fs::exists(data + "/train.tokens"));

  // Byte-level tokens beside a tokenizer that is not theirs.
  ASSERT_EQ(RunStrata({"data", "prepare", text_, "--out", data}).exit_status, 0);
  EXPECT_FALSE(fs::exists(data + "/tokenizer/vocab.json"));
  fs::create_directories(data + "/tokenizer");
  fs::copy_file(kBpe + "/vocab.json", data + "/tokenizer/vocab.json");
  fs::copy_file(kBpe + "/merges.txt", data + "/tokenizer/merges.txt");
  CliRun mismatch = RunStrata({"train", "--data", data, "--n-layer", "1", "--n-head", "2", "--n-embd", "16",
                               "--seq", "16", "--steps", "1", "--nvme-path", (dir_ / "swap").string()});
  EXPECT_NE(mismatch.exit_status, 0);
  EXPECT_THAT(mismatch.err,
              HasSubstr("has a vocabulary of 2000 tokens, but \"" + data +
                        "/train.tokens\" has 256: they are not from one `strata data prepare`"));
}

}  // namespace
}  // namespace strata
