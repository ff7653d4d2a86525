// Injected faults against both backends: every case ends in the right Status or a
// correct retry, and no request is lost or completed twice.
#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "strata/io.h"
#include "tiering/io_fault.h"
#include "tiering/io_test_util.h"

namespace strata {
namespace {

using testing_io::Alloc;
using testing_io::Fill;
using Rule = ScriptedFaults::Rule;
using Kind = ScriptedFaults::Kind;

class IoFaultTest : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    if (testing_io::SkipIfUnavailable(GetParam())) GTEST_SKIP() << "io_uring refused on this machine";
    dir_ = testing_io::ScratchDir("iofault");
    faults_ = std::make_shared<ScriptedFaults>();
    IoEngineOptions o;
    o.backend = GetParam();
    o.block_size = 64 << 10;
    o.queue_depth = 8;
    o.fault_hook = faults_;
    engine_ = std::move(IoEngine::Create(o)).value();
    file_ = *engine_->RegisterFile(dir_ + "/f", true);
    data_ = Alloc(kSize);
    Fill(data_.get(), kSize, 42);
  }
  void TearDown() override {
    engine_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // Writes the whole pattern without faults (rules are added after).
  void WriteAll() { ASSERT_TRUE(engine_->Write(file_, 0, kSize, data_.get())->Wait().ok()); }
  bool ReadMatches() {
    auto r = Alloc(kSize);
    Status s = engine_->Read(file_, 0, kSize, r.get())->Wait();
    return s.ok() && std::memcmp(r.get(), data_.get(), kSize) == 0;
  }

  static constexpr uint64_t kSize = 1 << 20;  // 16 pieces of 64 KiB
  std::string dir_;
  std::shared_ptr<ScriptedFaults> faults_;
  std::unique_ptr<IoEngine> engine_;
  int file_ = -1;
  testing_io::AlignedBuf data_;
};

TEST_P(IoFaultTest, EioIsIoErrorNamingFileOffsetAndLength) {
  WriteAll();
  faults_->Add(Rule{Kind::kError, EIO, -1, 5 * 65536, 0, 1});
  auto r = Alloc(kSize);
  Status s = engine_->Read(file_, 0, kSize, r.get())->Wait();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("Input/output error"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset 327680"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("65536 bytes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(dir_ + "/f"), std::string::npos) << s.message();
  EXPECT_EQ(faults_->fired(), 1u);
  EXPECT_TRUE(ReadMatches());  // the engine keeps working after a failed request
}

TEST_P(IoFaultTest, EnospcIsResourceExhausted) {
  faults_->Add(Rule{Kind::kError, ENOSPC, -1, -1, 1, 1});
  Status s = engine_->Write(file_, 0, kSize, data_.get())->Wait();
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("No space left"), std::string::npos) << s.message();
}

TEST_P(IoFaultTest, ShortTransfersAreResubmittedForTheRemainder) {
  faults_->Add(Rule{Kind::kShort, 0, -1, -1, -1, 40});
  WriteAll();
  EXPECT_TRUE(ReadMatches());
  EXPECT_GE(engine_->stats().short_retries, 30u);
  EXPECT_EQ(faults_->fired(), 40u);
}

TEST_P(IoFaultTest, EagainAndEintrAreRetried) {
  faults_->Add(Rule{Kind::kError, EAGAIN, -1, -1, 1, 3});
  faults_->Add(Rule{Kind::kError, EINTR, -1, -1, 0, 2});
  WriteAll();
  EXPECT_TRUE(ReadMatches());
  EXPECT_EQ(engine_->stats().again_retries, 5u);
}

TEST_P(IoFaultTest, EndlessEagainGivesUp) {
  faults_->Add(Rule{Kind::kError, EAGAIN, -1, 0, 1, -1});
  Status s = engine_->Write(file_, 0, 65536, data_.get())->Wait();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("gave up"), std::string::npos) << s.message();
}

TEST_P(IoFaultTest, FailedPieceFailsOnlyItsRequestAndEachCompletesOnce) {
  WriteAll();
  // Request 3 (offset 3 * 128 KiB) fails on its second piece; everything else succeeds.
  faults_->Add(Rule{Kind::kError, EIO, -1, 3 * 131072 + 65536, 0, 1});
  faults_->Add(Rule{Kind::kShort, 0, -1, 6 * 131072, 0, 1});
  auto r = Alloc(kSize);
  std::vector<IoRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back({IoOp::kRead, file_, uint64_t(i) * 131072, 131072, r.get() + i * 131072});
  std::vector<std::atomic<int>> calls(8);
  std::vector<StatusCode> codes(8, StatusCode::kInternal);
  auto h = engine_->Submit(reqs, [&](size_t i, const Status& s) {
    calls[i].fetch_add(1);
    codes[i] = s.code();
    return OkStatus();
  });
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->Wait().code(), StatusCode::kIoError);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(calls[i].load(), 1) << i;
    EXPECT_EQ(codes[i], i == 3 ? StatusCode::kIoError : StatusCode::kOk) << i;
    if (i != 3) {
      EXPECT_EQ(std::memcmp(r.get() + i * 131072, data_.get() + i * 131072, 131072), 0) << i;
    }
  }
  EXPECT_EQ(engine_->stats().requests, 1u + 8u);
}

TEST_P(IoFaultTest, RandomFaultsNeverLoseOrDuplicateCompletions) {
  WriteAll();
  for (int k = 0; k < 50; ++k) {
    faults_->Add(Rule{k % 3 == 0 ? Kind::kShort : Kind::kError, k % 3 == 1 ? EAGAIN : EIO, 7 + 13 * k, -1, -1, 1});
  }
  const int n = 300;
  auto r = Alloc(n * 4096);
  std::vector<std::atomic<int>> calls(n);
  std::vector<IoHandle> hs;
  for (int i = 0; i < n; ++i) {
    IoRequest req{IoOp::kRead, file_, uint64_t(i % 256) * 4096, 4096, r.get() + uint64_t(i) * 4096};
    hs.push_back(*engine_->Submit({&req, 1}, [&calls, i](size_t, const Status&) {
      calls[i].fetch_add(1);
      return OkStatus();
    }));
  }
  int failed = 0;
  for (int i = 0; i < n; ++i) {
    Status s = hs[i].Wait();
    if (!s.ok()) {
      ++failed;
      EXPECT_EQ(s.code(), StatusCode::kIoError);
    } else {
      EXPECT_EQ(std::memcmp(r.get() + i * 4096, data_.get() + (i % 256) * 4096, 4096), 0) << i;
    }
    EXPECT_EQ(calls[i].load(), 1) << i;
  }
  // EIO rules at attempts below the number of attempts made fired; 4 KiB pieces cannot be
  // shortened (the short rule skips them), EAGAIN ones are retried.
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, n);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoFaultTest, ::testing::Values(IoBackendKind::kIoUring, IoBackendKind::kPsync),
                         testing_io::BackendParamName);

}  // namespace
}  // namespace strata
