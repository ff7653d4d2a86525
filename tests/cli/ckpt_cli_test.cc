// `strata ckpt info`, `verify` and `export` as a user meets them, on a checkpoint of
// format version 1 written here byte by byte (include/strata/checkpoint.h): the summary,
// a clean verify, an export a strict safetensors reader accepts, and a flipped byte or a
// missing manifest named, with exit status 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_runner.h"
#include "strata/checksum.h"
#include "zero/safetensors_reader.h"

namespace strata {
namespace {

using testing::CliRun;
using ::testing::HasSubstr;
using testing::RunStrata;

class CkptCli : public testing::ScratchDirTest {
 protected:
  CkptCli() : ScratchDirTest("strata-ckpt-cli-test-") {}

  // One rank, stage 1, two chunks of 2048 fp32 elements (8 KiB per chunk and file).
  std::string WriteCheckpoint() {
    const std::string ckpt = (dir_ / "step-000000007").string();
    std::filesystem::create_directories(ckpt);
    constexpr int kChunks = 2;
    constexpr size_t kChunkBytes = 2048 * 4;
    nlohmann::json files = nlohmann::json::array();
    const char* kinds[] = {"master", "exp_avg", "exp_avg_sq"};
    for (int k = 0; k < 3; ++k) {
      std::vector<float> data(kChunks * 2048);
      for (size_t i = 0; i < data.size(); ++i) data[i] = 0.001f * static_cast<float>(i) * (k + 1);
      const std::string name = std::string(kinds[k]) + "-r00000.bin";
      std::ofstream(ckpt + "/" + name, std::ios::binary)
          .write(reinterpret_cast<const char*>(data.data()), data.size() * 4);
      nlohmann::json chunks = nlohmann::json::array();
      for (int c = 0; c < kChunks; ++c)
        chunks.push_back(ChecksumHex(Xxh3(data.data() + c * 2048, kChunkBytes)));
      files.push_back({{"path", name},
                       {"rank", 0},
                       {"kind", kinds[k]},
                       {"bytes", kChunks * kChunkBytes},
                       {"xxh3", ChecksumHex(Xxh3(data.data(), data.size() * 4))},
                       {"chunk_xxh3", chunks}});
    }
    nlohmann::json manifest = {
        {"format", "strata-checkpoint"},
        {"version", 1},
        {"world_size", 1},
        {"stage", 1},
        {"state_ranks", 1},
        {"compute_dtype", "fp32"},
        {"offload_optimizer", "cpu"},
        {"offload_param", "none"},
        {"layout",
         {{"num_params", 3000},
          {"num_chunks", kChunks},
          {"chunk_elems", 2048},
          {"shard_elems", 2048},
          {"chunk_bytes", kChunkBytes},
          {"tensors",
           {{{"name", "w"}, {"shape", {50, 40}}, {"chunk", 0}, {"offset", 0}, {"numel", 2000}},
            {{"name", "b"}, {"shape", {1000}}, {"chunk", 1}, {"offset", 0}, {"numel", 1000}}}}}},
        {"state",
         {{"step_calls", 7},
          {"optimizer_steps", 6},
          {"lr", 0.001},
          {"loss_scaler",
           {{"dynamic", false}, {"scale", 1.0}, {"iter", 7}, {"last_overflow_iter", -1}, {"hysteresis", 2}}},
          {"call_order", nlohmann::json::array()}}},
        {"files", files},
        {"config", nlohmann::json::object()},
        {"meta", {{"next_step", 7}}}};
    std::ofstream(ckpt + "/manifest.json") << manifest.dump(1);
    return ckpt;
  }
};

TEST_F(CkptCli, InfoSummarisesTheManifest) {
  const std::string ckpt = WriteCheckpoint();
  CliRun r = RunStrata({"ckpt", "info", ckpt});
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("1 rank(s), ZeRO stage 1, fp32 compute"));
  EXPECT_THAT(r.out, HasSubstr("7 (6 optimizer steps taken)"));
  EXPECT_THAT(r.out, HasSubstr(R"({"next_step":7})"));
  r = RunStrata({"ckpt", "info", ckpt, "--json"});
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["step_calls"], 7);
  EXPECT_EQ(j["files"].size(), 3u);
  EXPECT_EQ(j["meta"]["next_step"], 7);
}

TEST_F(CkptCli, VerifyChecksEveryFileAndNamesACorruptChunk) {
  const std::string ckpt = WriteCheckpoint();
  CliRun r = RunStrata({"ckpt", "verify", ckpt});
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("master-r00000.bin: ok"));
  EXPECT_THAT(r.out, HasSubstr("every file matches the manifest"));
  {
    std::fstream f(ckpt + "/exp_avg-r00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 17);
    f.put('\x55');
  }
  r = RunStrata({"ckpt", "verify", ckpt});
  EXPECT_EQ(r.exit_status, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("exp_avg-r00000.bin: 1 of 2 chunks corrupt"));
  EXPECT_THAT(r.err, HasSubstr("exp_avg-r00000.bin: chunk 1 (bytes 8192 to 16384)"));
}

TEST_F(CkptCli, AMissingManifestOrFileIsNamed) {
  const std::string ckpt = WriteCheckpoint();
  std::filesystem::remove(ckpt + "/exp_avg_sq-r00000.bin");
  CliRun r = RunStrata({"ckpt", "verify", ckpt});
  EXPECT_EQ(r.exit_status, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 0's exp_avg_sq file"));
  std::filesystem::remove(ckpt + "/manifest.json");
  r = RunStrata({"ckpt", "info", ckpt});
  EXPECT_EQ(r.exit_status, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("no manifest.json"));
}

TEST_F(CkptCli, ExportWritesSafetensorsAndRefusesACorruptChunk) {
  const std::string ckpt = WriteCheckpoint();
  const std::string out = (dir_ / "weights.safetensors").string();
  CliRun r = RunStrata({"ckpt", "export", ckpt, "--out", out, "--dtype", "bf16"});
  ASSERT_EQ(r.exit_status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("master-r00000.bin: 2 chunks checked"));
  EXPECT_THAT(r.out, HasSubstr(out + ": 2 tensors"));
  auto file = testing::ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ(file->tensors.size(), 2u);
  // WriteCheckpoint's master: element i is 0.001 i; "w" is chunk 0's first 2000, "b"
  // chunk 1's first 1000.
  std::vector<float> w(2000), b(1000);
  for (int i = 0; i < 2000; ++i) w[i] = 0.001f * static_cast<float>(i);
  for (int i = 0; i < 1000; ++i) b[i] = 0.001f * static_cast<float>(2048 + i);
  EXPECT_EQ(file->tensors["w"].shape, (std::vector<int64_t>{50, 40}));
  EXPECT_EQ(file->tensors["w"].bytes, testing::Expected16(w, /*bf16=*/true));
  EXPECT_EQ(file->tensors["b"].bytes, testing::Expected16(b, /*bf16=*/true));
  EXPECT_EQ(file->metadata.value("step_calls", ""), "7");

  r = RunStrata({"ckpt", "export", ckpt, "--out", out, "--dtype", "fp64"});
  EXPECT_NE(r.exit_status, 0) << r.out << r.err;
  {
    std::fstream f(ckpt + "/master-r00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8192 + 17);
    f.put('\x55');
  }
  std::filesystem::remove(out);
  r = RunStrata({"ckpt", "export", ckpt, "--out", out});
  EXPECT_EQ(r.exit_status, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("master-r00000.bin: chunk 1 (bytes 8192 to 16384)"));
  EXPECT_FALSE(std::filesystem::exists(out));
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
}

}  // namespace
}  // namespace strata
