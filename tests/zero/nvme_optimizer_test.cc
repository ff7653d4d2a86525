// NvmeOptimizer against real NVMe swap files in a temporary directory: steps equal the
// plain CPU Adam (AdamOnHost) on an in-memory copy, a speculative step shows only once
// committed, a failed write rolls its whole step back, and reads ahead and staging sets
// follow their limits. I/O faults and write delays come from the I/O engine's fault hook.
#include "zero/nvme_optimizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "tiering/io_fault.h"
#include "tiering/io_test_util.h"
#include "tmp_on_disk.h"
#include "zero/device_ops.h"

namespace strata::zero {
namespace {

const bool kOnDisk = testing::MoveTmpOffTmpfs();  // O_DIRECT needs a real file system

constexpr int kChunks = 3;
constexpr int kPieces = 3;

// Counts the bytes read; holds writes back while told to, then fails them or not.
class TestFaults : public IoFaultHook {
 public:
  int64_t OnResult(const IoFaultPoint& point, int64_t result) override {
    if (point.op == IoOp::kRead) {
      if (result > 0) read_bytes += result;
      return result;
    }
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !hold_; });
    return fail_writes ? -EIO : result;
  }
  void HoldWrites(bool hold) {
    std::lock_guard lock(mu_);
    hold_ = hold;
    cv_.notify_all();
  }
  std::atomic<uint64_t> read_bytes{0};
  std::atomic<bool> fail_writes{false};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hold_ = false;
};

// Values of N(0, 1); from `positive` on, small and >= 0 (as v is).
std::vector<float> Random(int64_t n, uint32_t seed, int64_t positive = INT64_MAX) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = i < positive ? normal(rng) : std::abs(normal(rng)) * 1e-2f;
  return x;
}

OptimizerStep At(int chunk, int64_t epoch, DType compute = DType::kF32, bool speculative = false) {
  OptimizerStep s;
  s.chunk = chunk;
  s.adam.lr = 1e-2f;
  s.adam.weight_decay = 0.01f;
  s.adam.step = s.epoch = epoch;
  s.adam.grad_scale = 0.5f;
  s.compute = compute;
  s.speculative = speculative;
  return s;
}

class NvmeOptimizerTest : public ::testing::Test {
 protected:
  // 5000 elements in pieces of 2048, 2048 and 904; `sets` staging sets.
  void Open(int sets, std::vector<uint8_t> live = {}, NvmeOptimizer::Hooks hooks = {}) {
    shape_ = PieceShape{5000, 2048, kPieces, std::move(live)};
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '-');
    dir_ = std::filesystem::temp_directory_path() /
           ("strata-nvme-opt-" + std::to_string(::getpid()) + "-" + name);
    std::filesystem::create_directories(dir_);
    IoEngineOptions io;
    io.backend = IoBackendKind::kPsync;
    io.fault_hook = faults_;
    engine_ = std::move(IoEngine::Create(io)).value();
    hooks.lost = [this](int c, bool version_changed) { lost_.emplace(c, version_changed); };
    // No master prefix: the last piece's master (904 floats) does not end on 4 KiB.
    opt_ = std::make_unique<NvmeOptimizer>(shape_, kChunks, /*master_prefix=*/false, &gate_, hooks);
    for (int i = 0; i < sets; ++i) {
      sets_.push_back(testing_io::Alloc(shape_.Bytes(0)));
      opt_->AddStagingSet(sets_.back().get());
    }
    int on_disk = 0;
    for (int c = 0; c < kChunks; ++c) on_disk += !(hooks.resident && hooks.resident(c));
    NvmeStoreOptions so;
    so.paths = {dir_.string()};
    so.slot_size = shape_.Bytes(0);
    so.slot_count = 2 * kPieces * on_disk;  // AttachStore must not want more
    auto store = NvmeStore::Open(*engine_, so);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE(opt_->AttachStore(std::move(store).value()).ok());
    auto buf = testing_io::Alloc(shape_.Bytes(0));
    for (int c = 0; c < kChunks; ++c) {
      for (int p = 0; p < kPieces; ++p) {
        const int64_t n = shape_.Elems(p);
        ref_[c].push_back(std::vector<float>(3 * n, 0.0f));  // a dead piece's state stays zero
        if (hooks.resident && hooks.resident(c)) continue;
        // Dead pieces' zeros are written too, so that a read of one would succeed and count.
        if (shape_.Live(c, p)) ref_[c][p] = Random(3 * n, 10 * c + p, /*positive=*/2 * n);
        std::memcpy(buf.get(), ref_[c][p].data(), 3 * n * 4);
        ASSERT_TRUE(opt_->WriteCommitted(c, p, reinterpret_cast<float*>(buf.get())).ok());
      }
    }
    opt_->TakeCounters();
    faults_->read_bytes = 0;
  }
  void TearDown() override {
    faults_->HoldWrites(false);
    if (opt_) {
      (void)opt_->DropReads();
      (void)opt_->WaitWrites(false);
    }
    opt_.reset();
    engine_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // The reference step, piece by piece as the pieces are cut (master | m | v each).
  std::vector<uint8_t> RefStep(const OptimizerStep& s, const std::vector<float>& grad) {
    const size_t csize = DTypeSize(s.compute);
    std::vector<uint8_t> out(shape_.opt_elems * csize, 0);
    for (int p = 0; p < kPieces; ++p) {
      if (!shape_.Live(s.chunk, p)) continue;
      EXPECT_TRUE(AdamOnHost(s.adam, ref_[s.chunk][p].data(), shape_.Elems(p),
                             grad.data() + p * shape_.piece_elems, s.compute,
                             out.data() + p * shape_.piece_elems * csize, nullptr)
                      .ok());
    }
    return out;
  }
  std::vector<float> RefMaster(int c) const {
    std::vector<float> master;
    for (int p = 0; p < kPieces; ++p)
      master.insert(master.end(), ref_[c][p].begin(), ref_[c][p].begin() + shape_.Elems(p));
    return master;
  }
  std::vector<float> Master(int c) {
    std::vector<float> master(shape_.opt_elems, -1.0f);
    Status st = opt_->ReadMaster(c, master.data());
    EXPECT_TRUE(st.ok()) << st.ToString();
    return master;
  }
  uint64_t LiveBytes(int c) const {
    uint64_t bytes = 0;
    for (int p = 0; p < kPieces; ++p) bytes += shape_.Live(c, p) ? shape_.Bytes(p) : 0;
    return bytes;
  }
  // Steps chunk c (a gradient of its own per epoch) and checks `out` against the reference.
  void StepAndCheck(const OptimizerStep& s) {
    const std::vector<float> grad = Random(shape_.opt_elems, 1000 * s.epoch + s.chunk);
    std::vector<uint8_t> out(shape_.opt_elems * DTypeSize(s.compute), 0xAB);
    auto stepped = opt_->Step(s, grad.data(), out.data());
    ASSERT_TRUE(stepped.ok()) << stepped.status().ToString();
    EXPECT_TRUE(out == RefStep(s, grad)) << "out of chunk " << s.chunk << " at epoch " << s.epoch;
  }

  std::shared_ptr<TestFaults> faults_ = std::make_shared<TestFaults>();
  std::filesystem::path dir_;
  PieceShape shape_;
  SaveGate gate_;
  std::vector<testing_io::AlignedBuf> sets_;
  std::unique_ptr<IoEngine> engine_;
  std::unique_ptr<NvmeOptimizer> opt_;
  std::vector<std::vector<float>> ref_[kChunks];  // by chunk and piece: master | m | v
  std::set<std::pair<int, bool>> lost_;           // hooks.lost calls
};

TEST_F(NvmeOptimizerTest, ReadMasterReturnsWhatWriteCommittedWrote) {
  ASSERT_NO_FATAL_FAILURE(Open(/*sets=*/2));
  for (int c = 0; c < kChunks; ++c) EXPECT_TRUE(Master(c) == RefMaster(c)) << "chunk " << c;
}

class NvmeOptimizerStepTest : public NvmeOptimizerTest, public ::testing::WithParamInterface<DType> {};

TEST_P(NvmeOptimizerStepTest, CommittedStepsAreAdamOnHostAndSkipDeadPieces) {
  // Chunk 1's last piece and all of chunk 2 are padding.
  ASSERT_NO_FATAL_FAILURE(Open(/*sets=*/4, {1, 1, 1, 1, 1, 0, 0, 0, 0}));
  for (int64_t epoch = 1; epoch <= 3; ++epoch) {
    for (int c = kChunks - 1; c >= 0; --c) {
      faults_->read_bytes = 0;
      StepAndCheck(At(c, epoch, GetParam()));
      const NvmeOptimizer::Counters k = opt_->TakeCounters();
      EXPECT_EQ(k.bytes_read, LiveBytes(c)) << "chunk " << c;
      EXPECT_EQ(k.bytes_written, LiveBytes(c)) << "chunk " << c;
      EXPECT_EQ(faults_->read_bytes.load(), LiveBytes(c)) << "chunk " << c << ": a dead piece was read";
      opt_->Commit(c, epoch);
    }
    for (int c = 0; c < kChunks; ++c) {
      ASSERT_TRUE(opt_->SettleCommit(c).ok());
      EXPECT_TRUE(Master(c) == RefMaster(c)) << "chunk " << c << " after epoch " << epoch;
    }
  }
  EXPECT_TRUE(lost_.empty());
}

INSTANTIATE_TEST_SUITE_P(Compute, NvmeOptimizerStepTest, ::testing::Values(DType::kF32, DType::kBf16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST_F(NvmeOptimizerTest, SpeculativeStepShowsOnlyOnceCommitted) {
  ASSERT_NO_FATAL_FAILURE(Open(/*sets=*/4));
  const std::vector<float> before0 = RefMaster(0), before1 = RefMaster(1);
  const auto ref1 = ref_[1];
  StepAndCheck(At(0, 1, DType::kF32, /*speculative=*/true));
  StepAndCheck(At(1, 1, DType::kF32, /*speculative=*/true));
  EXPECT_TRUE(Master(0) == before0) << "a speculative result read before Commit";
  EXPECT_EQ(opt_->ReadVersion(0), 0);

  opt_->Commit(0, 1);
  EXPECT_TRUE(Master(0) == RefMaster(0));
  EXPECT_EQ(opt_->ReadVersion(0), 1);

  // Chunk 1's speculation is discarded: the step redone from the committed state.
  opt_->Discard(1);
  EXPECT_TRUE(Master(1) == before1);
  ref_[1] = ref1;
  StepAndCheck(At(1, 2));
  opt_->Commit(1, 2);
  EXPECT_TRUE(Master(1) == RefMaster(1));
}

TEST_F(NvmeOptimizerTest, FailedWriteRollsBackItsWholeStep) {
  ASSERT_NO_FATAL_FAILURE(Open(/*sets=*/8));  // enough that no step waits for a write
  for (int c = 0; c < kChunks; ++c) {
    StepAndCheck(At(c, 1));
    opt_->Commit(c, 1);
  }
  ASSERT_TRUE(opt_->WaitWrites(true).ok());
  const std::vector<float> epoch1[] = {RefMaster(0), RefMaster(1), RefMaster(2)};
  const auto state1_0 = ref_[0], state1_1 = ref_[1];

  // Epoch 2: chunk 0's writes reach the disk and it settles; then every write of chunk 1 fails.
  StepAndCheck(At(0, 2));
  opt_->Commit(0, 2);
  ASSERT_TRUE(opt_->SettleCommit(0).ok());
  faults_->fail_writes = true;
  StepAndCheck(At(1, 2));
  opt_->Commit(1, 2);
  Status settled = opt_->SettleCommit(1);
  EXPECT_EQ(settled.code(), StatusCode::kIoError) << settled.ToString();
  // Chunk 0's settled step of the same epoch goes back too; chunk 2 had nothing in it.
  EXPECT_EQ(lost_, (std::set<std::pair<int, bool>>{{0, true}, {1, false}, {1, true}}));
  for (int c = 0; c < kChunks; ++c) EXPECT_TRUE(Master(c) == epoch1[c]) << "chunk " << c;
  EXPECT_FALSE(opt_->WaitWrites(true).ok()) << "the failed writes are reported once more";

  // Nothing was lost: the next step goes on from epoch 1's state.
  faults_->fail_writes = false;
  ref_[0] = state1_0;
  ref_[1] = state1_1;
  for (int c = 0; c < 2; ++c) {
    StepAndCheck(At(c, 3));
    opt_->Commit(c, 3);
    ASSERT_TRUE(opt_->SettleCommit(c).ok());
    EXPECT_TRUE(Master(c) == RefMaster(c)) << "chunk " << c;
  }
}

// The bytes read are counted as reads complete: each check follows DropReads or a step.
TEST_F(NvmeOptimizerTest, ReadAheadWaitsForNoSetAndStopsAtItsLimit) {
  ASSERT_NO_FATAL_FAILURE(Open(/*sets=*/4));  // all but two may read ahead
  std::vector<float*> held;
  for (int i = 0; i < 3; ++i) held.push_back(*opt_->TakeSet());
  ASSERT_TRUE(opt_->ReadAhead(0, 0, 1, /*descending=*/false).ok());
  ASSERT_TRUE(opt_->DropReads().ok());
  EXPECT_EQ(faults_->read_bytes.exchange(0), shape_.Bytes(0)) << "one set was free";
  for (float* set : held) opt_->GiveSet(set);

  // Pieces 1 and 2 (of unequal sizes, to tell them apart) reach the limit of two.
  ASSERT_TRUE(opt_->ReadAhead(0, 1, 1, /*descending=*/false).ok());
  ASSERT_TRUE(opt_->ReadAhead(0, 1, 1, /*descending=*/false).ok());
  ASSERT_TRUE(opt_->DropReads().ok());
  EXPECT_EQ(faults_->read_bytes.exchange(0), shape_.Bytes(1) + shape_.Bytes(2))
      << "a piece read twice, or reads past the limit";

  // The pieces read ahead are the ones the step takes: each is read once.
  ASSERT_TRUE(opt_->ReadAhead(0, 0, -1, /*descending=*/false).ok());
  StepAndCheck(At(0, 1));
  EXPECT_EQ(faults_->read_bytes.load(), LiveBytes(0));
}

TEST_F(NvmeOptimizerTest, ReadAheadSkipsResidentAndSteppedChunks) {
  NvmeOptimizer::Hooks hooks;
  hooks.resident = [](int c) { return c == 1; };
  hooks.stepped = [](int c) { return c == 2; };
  // Up to 4 reads ahead; the store has slots for chunks 0 and 2 only.
  ASSERT_NO_FATAL_FAILURE(Open(/*sets=*/6, {}, hooks));
  const uint64_t chunk_bytes = shape_.Bytes(0) + shape_.Bytes(1) + shape_.Bytes(2);
  ASSERT_TRUE(opt_->ReadAhead(1, 0, 2, /*descending=*/true).ok());
  ASSERT_TRUE(opt_->DropReads().ok());
  EXPECT_EQ(faults_->read_bytes.exchange(0), chunk_bytes) << "only chunk 0 is neither resident nor stepped";
  ASSERT_TRUE(opt_->ReadAhead(1, 0, 2, /*descending=*/false).ok());
  ASSERT_TRUE(opt_->DropReads().ok());
  EXPECT_EQ(faults_->read_bytes.load(), chunk_bytes) << "going up, chunk 2 is read whatever was stepped";
}

TEST_F(NvmeOptimizerTest, TakeSetWaitsForTheOldestWrite) {
  ASSERT_NO_FATAL_FAILURE(Open(/*sets=*/3));
  faults_->HoldWrites(true);
  StepAndCheck(At(0, 1));  // its three writes hold all three sets
  const std::vector<IoHandle> writes = opt_->WritesTo(0, opt_->WriteVersion(0));
  ASSERT_EQ(writes.size(), 3u);
  EXPECT_FALSE(writes[0].Poll());

  std::atomic<bool> released{false};
  std::thread release([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    released = true;
    faults_->HoldWrites(false);
  });
  auto set = opt_->TakeSet();
  EXPECT_TRUE(released) << "TakeSet returned a set still being written";
  release.join();
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_TRUE(writes[0].Poll());
  EXPECT_EQ(opt_->WritesTo(0, opt_->WriteVersion(0)).size(), 2u);

  std::vector<float*> held = {*set, *opt_->TakeSet(), *opt_->TakeSet()};
  EXPECT_TRUE(opt_->WritesTo(0, opt_->WriteVersion(0)).empty());
  EXPECT_EQ(opt_->TakeSet().status().code(), StatusCode::kInternal) << "every set is held by the caller";
  for (float* s : held) opt_->GiveSet(s);
  opt_->Commit(0, 1);
  ASSERT_TRUE(opt_->SettleCommit(0).ok());
  EXPECT_TRUE(Master(0) == RefMaster(0));
}

}  // namespace
}  // namespace strata::zero
