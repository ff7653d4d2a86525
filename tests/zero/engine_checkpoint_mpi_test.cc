// Checkpoints under mpirun -np 2 and -np 4 (label mpi): every rank saves its shards and
// a resumed run equals the unbroken one bit for bit; a checkpoint of another world size or
// sharding is resharded on load; a file corrupt on one rank fails the load on all.
#include <gmock/gmock.h>

#include <algorithm>
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

// Tensors of three chunks (runs): saved sharded, resumed, and loaded into one rank's
// layout (another chunk size, so the runs are gone) and back.
TEST(EngineCheckpointMpi, TensorsLargerThanAChunkResumeBitExact) {
  const ResumeSubject runs =
      ChainSubject(World(), ChainSetup{ChainWithRuns(World().size()), Always(Sequential(12))});
  for (const Combo& c : {Combo{3, "nvme", "nvme"}, Combo{2, "cpu", "none"}})
    CheckResumeBitExact(runs, c, c, kRunChunks);
  CheckLoadBitExact(runs, {3, "cpu", "nvme"}, kRunChunks, {1, "cpu", "none"},
                    R"({"strata": {"chunk_size": "1MiB"}})");
}

TEST(EngineCheckpointMpi, LoadsIntoAnotherShardedStageAndOffload) {
  CheckResumeBitExact(World(), {3, "nvme", "nvme"}, {1, "cpu", "none"});
  CheckResumeBitExact(World(), {2, "none", "none"}, {3, "cpu", "nvme"});
}

// Saved by every rank; loaded by the first half of them, or by rank 0 alone (a world of
// their own, with another chunk size, stage and tier) and saved again; then loaded by
// every rank. The
// state comes back whole through both reshardings, so the run goes on bit for bit.
TEST(EngineCheckpointMpi, ReshardsToFewerRanksAndBackBitExact) {
  struct Case {
    Combo save, middle, load;
  };
  const Case cases[] = {
      {{3, "nvme", "nvme"}, {1, "cpu", "none"}, {2, "none", "none"}},
      {{0, "none", "none"}, {3, "nvme", "nvme", "auto", kPiecedSubGroup}, {0, "none", "none"}},
      {{2, "cpu", "none"}, {0, "none", "none"}, {3, "cpu", "nvme"}},
  };
  // The middle world: half the ranks, then rank 0 alone (2 -> 1 -> 2, 4 -> 2 -> 4, 4 -> 1 -> 4).
  std::vector<int> middles{std::max(1, World().size() / 2)};
  if (middles[0] > 1) middles.push_back(1);
  const zero::TrainSpec spec = SmallSpec();
  for (int middle : middles) {
    const bool first_half = World().rank() < middle;
    auto sub = World().Split(/*colour=*/first_half ? 0 : 1, /*key=*/World().rank());
    ASSERT_TRUE(sub.ok()) << sub.status().ToString();
    for (const Case& c : cases) {
      const std::string name = ComboName(c.save) + " -> " + std::to_string(middle) + " rank(s) " +
                               ComboName(c.middle) + " -> " + ComboName(c.load);
      SCOPED_TRACE(name);
      const std::string root =
          CheckpointRoot("reshard") + "/" + std::to_string(std::hash<std::string>()(name));
      auto a = TrainSaveAndGoOn(MlpSubject(World(), spec), MakeConfig(c.save), root + "/a", 3, 3);
      ASSERT_TRUE(a.ok()) << a.status().ToString();
      if (first_half) {
        auto box = MlpSubject(**sub, spec)
                       .make(MakeConfig(c.middle, R"({"strata": {"chunk_size": "64KiB"}})"),
                             /*other_init=*/true);
        Status st = box.status();
        CheckpointMeta meta;
        if (st.ok()) st = box->engine->LoadCheckpoint(root + "/a", &meta);
        if (st.ok()) st = box->engine->SaveCheckpoint(root + "/b", meta);
        EXPECT_TRUE(st.ok()) << st.ToString();  // no ASSERT: every rank must reach the barrier
      }
      ASSERT_TRUE(World().Barrier().Wait().ok());
      auto b = LoadAndGoOn(MlpSubject(World(), spec), MakeConfig(c.load), root + "/b", 3, 3);
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      ExpectSameRun(*a, *b);
    }
  }
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

// Every rank alone (a world of its own) loads what every rank saved at stage 0, into a
// sharded stage: each gets the whole master.
TEST(EngineCheckpointMpi, EveryRankAloneLoadsTheWholeState) {
  const std::string dir = SaveStage0("alone");
  auto saved = MlpSubject(World(), SmallSpec()).make(MakeConfig({0, "none", "none"}), true);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  ASSERT_TRUE(saved->engine->LoadCheckpoint(dir, nullptr).ok());
  auto want = Masters(*saved->engine, model::MlpModules(SmallSpec().model).tensors.size());
  ASSERT_TRUE(want.ok()) << want.status().ToString();
  auto alone = World().Split(/*colour=*/World().rank(), /*key=*/0);
  ASSERT_TRUE(alone.ok()) << alone.status().ToString();
  // Not NVMe: every rank alone is rank 0 of its world, and their swap files would clash.
  auto box = MlpSubject(**alone, SmallSpec()).make(MakeConfig({3, "cpu", "cpu"}), true);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  Status st = box->engine->LoadCheckpoint(dir, nullptr);
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto got = Masters(*box->engine, want->size());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*want, *got);
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
