// Checkpoints under mpirun -np 2 and -np 4 (label mpi): every rank saves its shards and
// a resumed run equals the unbroken one bit for bit; a checkpoint of another world size or
// sharding is refused on every rank; a file corrupt on one rank fails the load on all.
#include <gmock/gmock.h>

#include <filesystem>
#include <fstream>

#include "checkpoint_checks.h"
#include "mpi_world.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

Communicator& World() { return MpiWorld(); }

TEST(EngineCheckpointMpi, EveryTierResumesBitExact) { CheckEveryComboResumes(World(), ResumeCombos()); }

TEST(EngineCheckpointMpi, ChainModelsResumeBitExact) {
  CheckChainResumes(World(), {{1, "cpu", "none"}, {3, "nvme", "nvme"}});
}

TEST(EngineCheckpointMpi, LoadsIntoAnotherShardedStageAndOffload) {
  CheckResumeBitExact(World(), {3, "nvme", "nvme"}, {1, "cpu", "none"});
  CheckResumeBitExact(World(), {2, "none", "none"}, {3, "cpu", "nvme"});
}

// Saved at stage 0 by every rank together (rank 0 writes the replicated state).
std::string SaveStage0(const std::string& name) {
  const std::string dir = CheckpointRoot(name) + "/ckpt";
  const Config config = MakeConfig({0, "none", "none"});
  auto box = MlpSubject(World(), SmallSpec()).make(config, false);
  EXPECT_TRUE(box.ok()) << box.status().ToString();
  if (!box.ok()) return dir;
  std::vector<double> losses;
  EXPECT_TRUE(TrainSteps(*box->engine, World(), config, SmallSpec(), 0, 1, &losses).ok());
  Status st = box->engine->SaveCheckpoint(dir, CheckpointMeta{});
  EXPECT_TRUE(st.ok()) << st.ToString();
  return dir;
}

TEST(EngineCheckpointMpi, OtherShardingOrWorldSizeIsRefused) {
  const std::string dir = SaveStage0("refused");
  {
    auto box = MlpSubject(World(), SmallSpec()).make(MakeConfig({1, "cpu", "none"}), true);
    ASSERT_TRUE(box.ok()) << box.status().ToString();
    Status st = box->engine->LoadCheckpoint(dir, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("saved at stage 0"));
  }
  // Every rank alone, a world of its own.
  auto alone = World().Split(/*colour=*/World().rank(), /*key=*/0);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  auto box = MlpSubject(**alone, SmallSpec()).make(MakeConfig({1, "cpu", "none"}), true);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  Status st = box->engine->LoadCheckpoint(dir, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(),
              HasSubstr("saved by " + std::to_string(World().size()) + " ranks, this engine has 1"));
}

TEST(EngineCheckpointMpi, ACorruptFileOfOneRankFailsTheLoadOnEveryRank) {
  const std::string dir = CheckpointRoot("corrupt") + "/ckpt";
  const Config config = MakeConfig({2, "cpu", "none"});
  const ResumeSubject subject = MlpSubject(World(), SmallSpec());
  {
    auto box = subject.make(config, false);
    ASSERT_TRUE(box.ok()) << box.status().ToString();
    std::vector<double> losses;
    ASSERT_TRUE(subject.train(*box->engine, config, 0, 1, &losses).ok());
    ASSERT_TRUE(box->engine->SaveCheckpoint(dir, CheckpointMeta{}).ok());
  }
  const int bad = World().size() - 1;
  if (World().rank() == 0) {
    std::fstream f(dir + "/master-r0000" + std::to_string(bad) + ".bin",
                   std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f);
    f.seekp(8);
    f.put('\x7f');
  }
  ASSERT_TRUE(World().Barrier().Wait().ok());
  auto box = subject.make(config, true);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  Status st = box->engine->LoadCheckpoint(dir, nullptr);
  if (World().rank() == bad) {
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("master-r0000" + std::to_string(bad) + ".bin: chunk 0"));
  } else {
    EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("rank " + std::to_string(bad) + " failed"));
  }
  EXPECT_EQ(box->engine->BeginMicroBatch().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace strata::testing
