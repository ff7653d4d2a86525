// ExportSafetensors (checkpoint.h) at world size 1: checkpoints saved at stages 0 and 3
// export, as fp32, bf16 and fp16, to files a strict reader accepts, equal to the engine's
// masters (checkpoint_export_checks.h); a corrupt chunk or a missing file exports nothing
// and leaves an earlier export as it was.
// Suite EngineCheckpoint: scripts/test.sh runs it, as every engine test that starts MPI,
// without leak checks.
#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "checkpoint_export_checks.h"
#include "single_world.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(EngineCheckpoint, ExportsEveryTensorOnceAsSafetensors) {
  // Stage 0 and stage 3 with the parameters on NVMe: the master files hold the same
  // layout whatever tier the state came from.
  for (const Combo& c : {Combo{0, "none", "none"}, Combo{3, "cpu", "nvme"}}) {
    SCOPED_TRACE(ComboName(c));
    const std::string name = "export-stage" + std::to_string(c.stage);
    fs::remove_all(CheckpointRoot(name));
    const ExportSubject s = SaveForExport(World(), name, c);
    for (DType d : {DType::kF32, DType::kBf16, DType::kFp16}) {
      CheckExport(s, d, CheckpointRoot(name) + "/weights-" + std::string(DTypeName(d)) + ".safetensors");
    }
  }
}

// Tensors of three chunks (runs, layout.h): each is written whole, from three chunks'
// sections of every rank's file.
TEST(EngineCheckpoint, ExportsTensorsLargerThanAChunk) {
  for (const Combo& c : {Combo{0, "none", "none"}, Combo{3, "nvme", "nvme"}}) {
    SCOPED_TRACE(ComboName(c));
    const std::string name = "export-runs-stage" + std::to_string(c.stage);
    fs::remove_all(CheckpointRoot(name));
    const ExportSubject s = SaveForExport(World(), name, c, /*runs=*/true);
    CheckExport(s, DType::kF32, CheckpointRoot(name) + "/weights.safetensors");
    CheckExport(s, DType::kBf16, CheckpointRoot(name) + "/weights-bf16.safetensors");
  }
}

TEST(EngineCheckpoint, ExportOfACorruptCheckpointWritesNothing) {
  const std::string root = CheckpointRoot("export-corrupt");
  fs::remove_all(root);
  const ExportSubject s = SaveForExport(World(), "export-corrupt", {3, "cpu", "cpu"});
  const std::string out = root + "/weights.safetensors", fresh = root + "/fresh.safetensors";
  CheckExport(s, DType::kF32, out);
  const std::string before = ReadAll(out);
  auto info = ReadCheckpointInfo(s.dir);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_GT(info->num_chunks, 1);
  {
    std::fstream f(s.dir + "/master-r00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f);
    f.seekp(static_cast<std::streamoff>(info->chunk_bytes + 100));  // chunk 1
    f.put('\x7f');
  }
  for (const std::string& path : {out, fresh}) {
    Status st = ExportSafetensors(s.dir, path, DType::kBf16);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("master-r00000.bin: chunk 1"));
    EXPECT_FALSE(fs::exists(path + ".tmp"));
  }
  EXPECT_EQ(ReadAll(out), before) << "an earlier export is left as it was";
  EXPECT_FALSE(fs::exists(fresh));

  fs::remove(s.dir + "/master-r00000.bin");
  Status st = ExportSafetensors(s.dir, fresh, DType::kF32);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("rank 0's master file"));
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_FALSE(fs::exists(fresh + ".tmp"));

  st = ExportSafetensors(root + "/nothing-here", fresh, DType::kF32);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("no manifest.json"));
}

}  // namespace
}  // namespace strata::testing
