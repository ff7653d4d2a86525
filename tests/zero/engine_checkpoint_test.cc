// Checkpoints at world size 1: a resumed run equals the unbroken one bit for bit in every
// stage x offload combination (with fp16 loss scaling, bf16, clipping and gradient
// accumulation too, and across stages), and every way a checkpoint can be wrong or a save
// can fail is refused with a message that names it, leaving the previous checkpoint.
#include <gmock/gmock.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "checkpoint_checks.h"
#include "single_world.h"
#include "strata/host_arena.h"
#include "tiering/io_fault.h"

namespace strata::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

TEST(EngineCheckpoint, EveryStageAndOffloadResumesBitExact) { CheckEveryComboResumes(World(), AllCombos()); }

TEST(EngineCheckpoint, Fp16ResumesBitExactWithTheLossScaler) {
  // Saved after three steps taken, the scale raised once: the next two overflow (the first
  // only spends the hysteresis), then one is taken at half the scale. And saved after
  // two skipped steps and one taken: skipped steps do not count for Adam's bias correction.
  for (int power : {18, 20}) {
    CheckEveryComboResumes(World(), ResumeCombos(),
                           R"({"fp16": {"enabled": true, "loss_scale_window": 1, "initial_scale_power": )" +
                               std::to_string(power) + "}}");
  }
}

TEST(EngineCheckpoint, Bf16ResumesBitExact) {
  CheckEveryComboResumes(World(), ResumeCombos(), R"({"bf16": {"enabled": true}})");
}

TEST(EngineCheckpoint, ClippingAndAccumulationResumeBitExact) {
  CheckEveryComboResumes(World(), ResumeCombos(),
                         R"({"gradient_clipping": 0.05, "gradient_accumulation_steps": 2})");
}

TEST(EngineCheckpoint, ChainModelsResumeBitExact) { CheckChainResumes(World(), ResumeCombos()); }

TEST(EngineCheckpoint, LoadsIntoAnotherStageAndOffload) {
  // At world size 1 every stage's shard is the whole chunk: the state moves between tiers.
  CheckResumeBitExact(World(), {3, "nvme", "nvme"}, {1, "cpu", "none"});
  CheckResumeBitExact(World(), {1, "none", "none"}, {3, "nvme", "nvme", "auto", kPiecedSubGroup});
  CheckResumeBitExact(World(), {2, "cpu", "none"}, {0, "none", "none"});
  // Chunks whose state was on the device go to the host and back (offload_optimizer.ratio).
  CheckResumeBitExact(World(), {2, "cpu", "none", "auto", 0, 0, 0.5}, {3, "cpu", "cpu"});
  CheckResumeBitExact(World(), {3, "nvme", "nvme"}, {1, "cpu", "none", "auto", 0, 0, 0.25});
}

// A save started after step 3 and finished two steps later captures step 3: training
// goes on while the files are written, the optimizer's later writes wait for the blocks
// the save has not read, and a run resumed from it equals the unbroken one.
TEST(EngineCheckpoint, AnAsynchronousSaveCapturesItsStepWhileTrainingGoesOn) {
  const ResumeSubject mlp = MlpSubject(World(), SmallSpec());
  for (Combo c : ResumeCombos()) {
    SCOPED_TRACE(ComboName(c));
    const std::string dir =
        CheckpointRoot("async") + "/" + std::to_string(std::hash<std::string>()(ComboName(c)));
    auto a = TrainSaveAndGoOn(mlp, MakeConfig(c), dir, 3, 4, /*finish_after=*/2);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    auto b = LoadAndGoOn(mlp, MakeConfig(c), dir, 3, 4);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ExpectSameRun(*a, *b);
  }
}

// Checkpoint writes held up (10 ms a request of 256 KiB or more: the stream buffers'
// pieces, not the 192 KiB optimizer pieces of a 16384-element sub-group): the save is still reading
// the state when the optimizer would overwrite it, so the optimizer waits, and what was
// saved is step 3.
class SlowWrites : public IoFaultHook {
 public:
  int64_t OnResult(const IoFaultPoint& point, int64_t result) override {
    if (point.op == IoOp::kWrite && point.length >= (256u << 10))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return result;
  }
};

TEST(EngineCheckpoint, TheOptimizerWaitsForASlowSaveToReadWhatItOverwrites) {
  zero::TrainSpec spec = SmallSpec();
  spec.model.hidden = {1536, 1536};  // 10 MB of each state kind: more than two stream buffers
  ResumeSubject subject = MlpSubject(World(), spec);
  const auto hook = std::make_shared<SlowWrites>();
  const ResumeSubject plain = subject;
  subject.make = [&](const Config& config, bool other_init) -> Result<EngineBox> {
    zero::TrainSpec init = spec;
    if (other_init) init.model.seed += 1000;
    return MakeEngine(World(), config, init, other_init ? nullptr : hook);
  };
  // Memory state stepped in place and through spares, and NVMe slots (written two steps on).
  for (const Combo& c :
       {Combo{1, "cpu", "none"}, Combo{3, "cpu", "cpu"}, Combo{3, "nvme", "cpu", "host", 16384}}) {
    SCOPED_TRACE(ComboName(c));
    const std::string dir =
        CheckpointRoot("slow") + "/" + std::to_string(std::hash<std::string>()(ComboName(c)));
    CheckpointTimes times;
    auto a = TrainSaveAndGoOn(subject, MakeConfig(c), dir, 3, 4, /*finish_after=*/3, &times);
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    EXPECT_GT(times.optimizer_wait_s, 0.05) << "the steps outran the save";
    EXPECT_LT(times.started_s, 0.05) << "the files are written behind";
    auto b = LoadAndGoOn(plain, MakeConfig(c), dir, 3, 4);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    ExpectSameRun(*a, *b);
  }
}

// A training loop that goes back to its last checkpoint (after a bad step, say) loads it
// into the engine it runs: the steps after it are the same again.
TEST(EngineCheckpoint, TheSavingEngineCanGoBackToItsCheckpoint) {
  for (const Combo& c : ResumeCombos()) {
    SCOPED_TRACE(ComboName(c));
    const std::string dir = CheckpointRoot("back") + "/ckpt";
    const Config config = MakeConfig(c);
    const zero::TrainSpec spec = SmallSpec(5);
    auto box = MakeEngine(World(), config, spec);
    ASSERT_TRUE(box.ok()) << box.status().ToString();
    Engine& e = *box->engine;
    std::vector<double> first, again;
    ASSERT_TRUE(TrainSteps(e, World(), config, spec, 0, 2, &first).ok());
    ASSERT_TRUE(e.SaveCheckpoint(dir, CheckpointMeta{}).ok());
    ASSERT_TRUE(TrainSteps(e, World(), config, spec, 2, 3, &first).ok());
    auto after_first = Masters(e, model::MlpModules(spec.model).tensors.size());
    ASSERT_TRUE(after_first.ok()) << after_first.status().ToString();
    CheckpointMeta meta;
    Status st = e.LoadCheckpoint(dir, &meta);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(meta.step_calls, 2);
    ASSERT_TRUE(TrainSteps(e, World(), config, spec, 2, 3, &again).ok());
    EXPECT_EQ(std::vector<double>(first.begin() + 2, first.end()), again);
    auto after_again = Masters(e, model::MlpModules(spec.model).tensors.size());
    ASSERT_TRUE(after_again.ok()) << after_again.status().ToString();
    EXPECT_EQ(*after_first, *after_again);
  }
}

// The host memory a save adds is its stream buffers (two of 4 MiB per file) and two
// optimizer pieces it reads the NVMe state into, however large the state: measured on an
// arena the engine shares, which the buffers come from.
TEST(EngineCheckpoint, SaveAddsAFixedAmountOfHostMemory) {
  HostArenaOptions ao;
  ao.bytes = 96ull << 20;
  auto arena = HostArena::Create(ao);
  ASSERT_TRUE(arena.ok()) << arena.status().ToString();
  const Config config = MakeConfig({3, "nvme", "nvme"});
  const zero::TrainSpec spec = SmallSpec(1);
  auto dev = EngineDevice(config);
  ASSERT_TRUE(dev.ok()) << dev.status().ToString();
  EngineResources res{&World(), dev->get()};
  res.host_arena = arena->get();
  auto engine = Engine::Create(config, model::MlpModules(spec.model), MlpInit(spec), res);
  ASSERT_TRUE(engine.ok()) << engine.status().ToString();
  std::vector<double> losses;
  ASSERT_TRUE(TrainSteps(**engine, World(), config, spec, 0, 1, &losses).ok());
  const uint64_t allocated = (*arena)->allocated(), high = (*arena)->high_water();
  ASSERT_TRUE((*engine)->SaveCheckpoint(CheckpointRoot("memory") + "/ckpt", CheckpointMeta{}).ok());
  const uint64_t piece = (3 * (*engine)->layout_info().optimizer_piece_elems * 4 + 4095) / 4096 * 4096;
  EXPECT_EQ((*arena)->high_water() - std::max(high, allocated), 3 * 2 * (4ull << 20) + 2 * piece);
  EXPECT_EQ((*arena)->allocated(), allocated) << "the buffers go back after the save";
}

// A checkpoint of a few steps of stage 1 with the optimizer in pinned memory.
struct Saved {
  std::string dir;
  Config config;
  zero::TrainSpec spec = SmallSpec(2);
};

Saved SaveOne(const std::string& name, const Combo& combo = {1, "cpu", "none"}) {
  Saved s;
  s.dir = CheckpointRoot(name) + "/ckpt";
  fs::remove_all(CheckpointRoot(name));
  s.config = MakeConfig(combo);
  auto box = MakeEngine(World(), s.config, s.spec);
  EXPECT_TRUE(box.ok()) << box.status().ToString();
  if (!box.ok()) return s;
  std::vector<double> losses;
  Status st = TrainSteps(*box->engine, World(), s.config, s.spec, 0, 2, &losses);
  if (st.ok()) st = box->engine->SaveCheckpoint(s.dir, CheckpointMeta{});
  EXPECT_TRUE(st.ok()) << st.ToString();
  return s;
}

Status LoadInto(const Saved& s, const Config& config, CheckpointMeta* meta = nullptr) {
  STRATA_ASSIGN_OR_RETURN(EngineBox box, MakeEngine(World(), config, s.spec));
  return box.engine->LoadCheckpoint(s.dir, meta);
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(offset);
  f.write(&c, 1);
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void WriteJson(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(1); }

TEST(EngineCheckpoint, ManifestDescribesTheSave) {
  Saved s = SaveOne("manifest");
  auto info = ReadCheckpointInfo(s.dir);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->world_size, 1);
  EXPECT_EQ(info->stage, 1);
  EXPECT_EQ(info->offload_optimizer, "cpu");
  EXPECT_EQ(info->step_calls, 2);
  EXPECT_EQ(info->optimizer_steps, 2);
  EXPECT_EQ(info->files.size(), 3u);
  for (const auto& f : info->files) EXPECT_EQ(f.bytes, info->chunk_bytes * info->num_chunks) << f.path;
  std::vector<std::string> lines;
  Status v = VerifyCheckpoint(s.dir, [&](const std::string& l) { lines.push_back(l); });
  EXPECT_TRUE(v.ok()) << v.ToString();
  EXPECT_EQ(lines.size(), 3u);
}

TEST(EngineCheckpoint, FlippedByteIsCorruptionNamingFileAndChunk) {
  Saved s = SaveOne("flip");
  auto info = ReadCheckpointInfo(s.dir);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_GT(info->num_chunks, 1);
  const std::string file = s.dir + "/exp_avg-r00000.bin";
  FlipByte(file, info->chunk_bytes + 100);  // chunk 1
  Status v = VerifyCheckpoint(s.dir);
  EXPECT_EQ(v.code(), StatusCode::kCorruption) << v.ToString();
  EXPECT_THAT(v.message(), HasSubstr("exp_avg-r00000.bin: chunk 1"));

  auto box = MakeEngine(World(), s.config, s.spec);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  Status st = box->engine->LoadCheckpoint(s.dir, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("exp_avg-r00000.bin: chunk 1"));
  // The state is part old, part new: the engine refuses to train on it.
  EXPECT_EQ(box->engine->BeginMicroBatch().code(), StatusCode::kFailedPrecondition);
}

TEST(EngineCheckpoint, MissingManifestOrFileIsAClearError) {
  Saved s = SaveOne("missing");
  fs::remove(s.dir + "/master-r00000.bin");
  Status st = LoadInto(s, s.config);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("rank 0's master file"));

  fs::remove(s.dir + "/manifest.json");
  auto box = MakeEngine(World(), s.config, s.spec);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  st = box->engine->LoadCheckpoint(s.dir, nullptr);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("no manifest.json"));
  // Refused before anything changed: the engine trains on.
  std::vector<double> losses;
  EXPECT_TRUE(TrainSteps(*box->engine, World(), s.config, s.spec, 0, 1, &losses).ok());
}

TEST(EngineCheckpoint, TruncatedFileIsCorruption) {
  Saved s = SaveOne("truncated");
  fs::resize_file(s.dir + "/exp_avg_sq-r00000.bin", 4096);
  Status st = LoadInto(s, s.config);
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("exp_avg_sq-r00000.bin is 4096 bytes"));
  EXPECT_THAT(st.message(), HasSubstr("truncated"));
}

// strata.chunk_size of 64 KiB: two of SmallSpec's modules per chunk instead of one.
constexpr char kBigChunks[] = R"({"strata": {"chunk_size": "64KiB"}})";

// Another strata.chunk_size lays the tensors out in other chunks: the load reshards, and
// with no clipping (whose norm is summed chunk by chunk) the run goes on bit for bit.
TEST(EngineCheckpoint, LoadsIntoAnotherChunkSizeBitExact) {
  const ResumeSubject mlp = MlpSubject(World(), SmallSpec());
  for (const Combo& c : ResumeCombos()) CheckLoadBitExact(mlp, c, "", c, kBigChunks);
  CheckLoadBitExact(mlp, {3, "nvme", "nvme", "auto", kPiecedSubGroup}, kBigChunks, {1, "cpu", "none"}, "");
  CheckLoadBitExact(mlp, {2, "cpu", "none", "auto", 0, 0, 0.5}, kBigChunks, {3, "nvme", "nvme"}, "");
  // A tied weight, shared by the first and the last module.
  ModelDecl tied = PlainChain(4);
  AddSharedLinear(&tied, /*weight=*/0, /*bias=*/-1);
  const ResumeSubject chain = ChainSubject(World(), ChainSetup{tied, Always(Sequential(5))});
  CheckLoadBitExact(chain, {3, "nvme", "nvme"}, "", {1, "cpu", "none"}, kBigChunks);
}

// Tensors of three chunks (runs, layout.h) resume bit for bit from every tier, and load
// into a chunk size that holds them whole, and back.
TEST(EngineCheckpoint, TensorsLargerThanAChunkResumeAndReshardBitExact) {
  const ResumeSubject runs = ChainSubject(World(), ChainSetup{ChainWithRuns(1), Always(Sequential(12))});
  for (const Combo& c : ResumeCombos()) CheckResumeBitExact(runs, c, c, kRunChunks);
  CheckLoadBitExact(runs, {3, "nvme", "nvme"}, kRunChunks, {1, "cpu", "none"}, kBigChunks);
  CheckLoadBitExact(runs, {2, "cpu", "none"}, kBigChunks, {3, "cpu", "nvme"}, kRunChunks);
}

// A resharding load checks every saved section it takes values from before it changes
// anything: a corrupt one is named, and the engine trains on as it was.
TEST(EngineCheckpoint, AReshardingLoadChecksWhatItReadsBeforeItChangesAnything) {
  Saved s = SaveOne("reshard-flip");
  auto info = ReadCheckpointInfo(s.dir);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_GT(info->num_chunks, 1);
  FlipByte(s.dir + "/exp_avg-r00000.bin", info->chunk_bytes + 100);  // chunk 1
  const Config config = MakeConfig({3, "nvme", "nvme"}, kBigChunks);
  {
    auto box = MakeEngine(World(), config, s.spec);
    ASSERT_TRUE(box.ok()) << box.status().ToString();
    Status st = box->engine->LoadCheckpoint(s.dir, nullptr);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_THAT(st.message(), HasSubstr("exp_avg-r00000.bin: chunk 1"));
    std::vector<double> losses;
    EXPECT_TRUE(TrainSteps(*box->engine, World(), config, s.spec, 0, 1, &losses).ok());
  }
  fs::remove(s.dir + "/master-r00000.bin");
  Status st = LoadInto(s, config);
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("rank 0's master file"));
}

TEST(EngineCheckpoint, AnotherModelOrFormatIsRefusedNamingTheDifference) {
  Saved s = SaveOne("mismatch");
  const std::string manifest = s.dir + "/manifest.json";
  const nlohmann::json original = ReadJson(manifest);
  nlohmann::json reshaped = original;
  reshaped["layout"]["tensors"][0]["shape"] = {1, reshaped["layout"]["tensors"][0]["numel"]};
  WriteJson(manifest, reshaped);
  Status st = LoadInto(s, s.config);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("tensor 0 is"));

  nlohmann::json renamed = original;
  renamed["layout"]["tensors"][1]["name"] = "something.else";
  WriteJson(manifest, renamed);
  // Into another chunk size too: a resharding load takes tensors by name, never by place.
  st = LoadInto(s, MakeConfig({1, "cpu", "none"}, kBigChunks));
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("tensor 1 is \"something.else\""));

  nlohmann::json newer = original;
  newer["version"] = 99;
  WriteJson(manifest, newer);
  st = LoadInto(s, s.config);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("version 99"));
}

TEST(EngineCheckpoint, UnfinishedSavesAreIgnoredAndCleaned) {
  const std::string parent = CheckpointRoot("keep");
  fs::remove_all(parent);
  const Config config = MakeConfig({3, "nvme", "nvme"});
  const zero::TrainSpec spec = SmallSpec(3);
  auto box = MakeEngine(World(), config, spec);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  // What a crash mid-save leaves: a temporary directory without a manifest.
  const std::string crashed = CheckpointPath(parent, 2) + ".tmp-0123456789abcdef";
  fs::create_directories(crashed);
  std::ofstream(crashed + "/master-r00000.bin") << "partial";
  std::vector<double> losses;
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(TrainSteps(*box->engine, World(), config, spec, step, 1, &losses).ok());
    Status st = box->engine->SaveCheckpoint(CheckpointPath(parent, step + 1), CheckpointMeta{});
    ASSERT_TRUE(st.ok()) << st.ToString();
    if (step == 1) {
      EXPECT_FALSE(fs::exists(crashed)) << "a save into the same name removes what a crash left";
    }
  }
  fs::create_directories(CheckpointPath(parent, 9) + ".tmp-fedcba9876543210");
  auto latest = LatestCheckpoint(parent);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(*latest, CheckpointPath(parent, 3));
  ASSERT_TRUE(KeepNewestCheckpoints(parent, 2).ok());
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(parent)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"step-000000002", "step-000000003"}));
  EXPECT_EQ(KeepNewestCheckpoints(parent, 0).code(), StatusCode::kInvalidArgument);
}

TEST(EngineCheckpoint, FailedSaveLeavesThePreviousCheckpointAndTrainingGoesOn) {
  for (int error : {EIO, ENOSPC}) {
    SCOPED_TRACE(error);
    const std::string parent = CheckpointRoot("failed-save");
    fs::remove_all(parent);
    const std::string dir = parent + "/ckpt";
    const Config config = MakeConfig({2, "cpu", "none"});
    const zero::TrainSpec spec = SmallSpec(3);
    auto faults = std::make_shared<ScriptedFaults>();
    auto box = MakeEngine(World(), config, spec, faults);
    ASSERT_TRUE(box.ok()) << box.status().ToString();
    std::vector<double> losses;
    ASSERT_TRUE(TrainSteps(*box->engine, World(), config, spec, 0, 1, &losses).ok());
    ASSERT_TRUE(box->engine->SaveCheckpoint(dir, CheckpointMeta{}).ok());
    ASSERT_TRUE(TrainSteps(*box->engine, World(), config, spec, 1, 1, &losses).ok());
    faults->Add({ScriptedFaults::Kind::kError, error, /*attempt=*/-1, /*offset=*/-1, /*op=*/1, /*times=*/1});
    Status st = box->engine->SaveCheckpoint(dir, CheckpointMeta{});
    EXPECT_EQ(st.code(), error == EIO ? StatusCode::kIoError : StatusCode::kResourceExhausted)
        << st.ToString();
    auto info = ReadCheckpointInfo(dir);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->step_calls, 1) << "the previous checkpoint is intact";
    EXPECT_TRUE(VerifyCheckpoint(dir).ok());
    for (const auto& e : fs::directory_iterator(parent)) EXPECT_EQ(e.path().filename(), "ckpt");
    // Training goes on, and the next save replaces the checkpoint.
    ASSERT_TRUE(TrainSteps(*box->engine, World(), config, spec, 2, 1, &losses).ok());
    ASSERT_TRUE(box->engine->SaveCheckpoint(dir, CheckpointMeta{}).ok());
    info = ReadCheckpointInfo(dir);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(info->step_calls, 3);
  }
}

TEST(EngineCheckpoint, SaveRefusesWhatItMustNotOverwriteOrCannotSave) {
  const std::string parent = CheckpointRoot("refuse");
  fs::remove_all(parent);
  const Config config = MakeConfig({1, "none", "none"});
  const zero::TrainSpec spec = SmallSpec(1);
  auto box = MakeEngine(World(), config, spec);
  ASSERT_TRUE(box.ok()) << box.status().ToString();
  Engine& e = *box->engine;
  fs::create_directories(parent + "/theirs");
  std::ofstream(parent + "/theirs/notes.txt") << "keep me";
  Status st = e.SaveCheckpoint(parent + "/theirs", CheckpointMeta{});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_TRUE(fs::exists(parent + "/theirs/notes.txt"));

  CheckpointMeta bad;
  bad.json = "{not json";
  st = e.SaveCheckpoint(parent + "/a", bad);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_FALSE(fs::exists(parent + "/a"));

  ASSERT_TRUE(e.BeginMicroBatch().ok());
  st = e.SaveCheckpoint(parent + "/b", CheckpointMeta{});
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("inside a micro-batch"));
}

}  // namespace
}  // namespace strata::testing
