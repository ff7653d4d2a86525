// IoEngine round trips, boundaries, concurrency and validation, run against both
// backends (io_uring and the pread/pwrite pool).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <random>
#include <vector>

#include "strata/io.h"
#include "tiering/io_test_util.h"

namespace strata {
namespace {

using testing_io::Alloc;
using testing_io::Fill;

class IoEngineTest : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    if (testing_io::SkipIfUnavailable(GetParam())) GTEST_SKIP() << "io_uring refused on this machine";
    dir_ = testing_io::ScratchDir("io");
  }
  void TearDown() override {
    engine_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  IoEngine& Make(uint64_t block = 256 * KiB(), int qd = 8, int threads = 1) {
    IoEngineOptions o;
    o.backend = GetParam();
    o.block_size = block;
    o.queue_depth = qd;
    o.threads = threads;
    auto e = IoEngine::Create(o);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    engine_ = std::move(e).value();
    return *engine_;
  }
  int Open(const std::string& name) {
    auto id = engine_->RegisterFile(dir_ + "/" + name, true);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return *id;
  }
  static constexpr uint64_t KiB() { return 1024; }

  std::string dir_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(IoEngineTest, ReportsBackend) {
  IoEngine& e = Make();
  EXPECT_EQ(e.backend_name(), GetParam() == IoBackendKind::kPsync ? "psync" : "io_uring");
}

TEST_P(IoEngineTest, RoundTripRandomOffsetsAndSizes) {
  IoEngine& e = Make(64 * KiB(), 8, 2);
  int f = Open("rt");
  const uint64_t file_size = 16 << 20;
  auto data = Alloc(file_size);
  Fill(data.get(), file_size, 7);
  ASSERT_TRUE(e.Write(f, 0, file_size, data.get())->Wait().ok());
  std::mt19937_64 rng(1);
  for (int i = 0; i < 60; ++i) {
    uint64_t pages = 1 + rng() % 200;
    uint64_t off = (rng() % (file_size / 4096 - pages)) * 4096;
    uint64_t len = pages * 4096;
    auto buf = Alloc(len);
    auto h = e.Read(f, off, len, buf.get());
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    ASSERT_TRUE(h->Wait().ok());
    ASSERT_EQ(std::memcmp(buf.get(), data.get() + off, len), 0) << "offset " << off << " len " << len;
    EXPECT_EQ(h->bytes_done(), len);
  }
}

TEST_P(IoEngineTest, BoundarySizes) {
  const uint64_t bs = 128 * KiB();
  IoEngine& e = Make(bs, 4);
  int f = Open("bounds");
  for (uint64_t len : {bs, bs + 4 * KiB(), 3 * bs + 12 * KiB(), 4 * KiB(), 7 * bs}) {
    auto w = Alloc(len), r = Alloc(len);
    Fill(w.get(), len, len);
    std::memset(r.get(), 0, len);
    ASSERT_TRUE(e.Write(f, bs, len, w.get())->Wait().ok()) << len;
    ASSERT_TRUE(e.Read(f, bs, len, r.get())->Wait().ok()) << len;
    EXPECT_EQ(std::memcmp(w.get(), r.get(), len), 0) << len;
  }
}

TEST_P(IoEngineTest, ThousandsOfConcurrentRequests) {
  IoEngine& e = Make(64 * KiB(), 16, 2);
  int f = Open("many");
  const int n = 3000;
  auto w = Alloc(n * 4096), r = Alloc(n * 4096);
  Fill(w.get(), n * 4096, 3);
  std::vector<IoHandle> hs;
  // Scattered order: request i writes page perm[i].
  std::vector<int> perm(n);
  for (int i = 0; i < n; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(5));
  for (int i = 0; i < n; ++i) {
    auto h = e.Write(f, uint64_t(perm[i]) * 4096, 4096, w.get() + uint64_t(perm[i]) * 4096);
    ASSERT_TRUE(h.ok());
    hs.push_back(*h);
  }
  for (auto& h : hs) ASSERT_TRUE(h.Wait().ok());
  hs.clear();
  for (int i = 0; i < n; ++i)
    hs.push_back(*e.Read(f, uint64_t(i) * 4096, 4096, r.get() + uint64_t(i) * 4096));
  for (auto& h : hs) ASSERT_TRUE(h.Wait().ok());
  EXPECT_EQ(std::memcmp(w.get(), r.get(), n * 4096), 0);
  EXPECT_EQ(e.stats().requests, uint64_t(2 * n + 0));
}

TEST_P(IoEngineTest, BatchCallsBackOncePerRequest) {
  IoEngine& e = Make(32 * KiB(), 4);
  int f = Open("batch");
  const int n = 200;
  auto w = Alloc(n * 64 * KiB());
  Fill(w.get(), n * 64 * KiB(), 9);
  std::vector<IoRequest> reqs;
  for (int i = 0; i < n; ++i)
    reqs.push_back({IoOp::kWrite, f, uint64_t(i) * 64 * KiB(), 64 * KiB(), w.get() + i * 64 * KiB()});
  std::vector<std::atomic<int>> calls(n);
  auto h = e.Submit(reqs, [&](size_t i, const Status& s) {
    EXPECT_TRUE(s.ok());
    calls[i].fetch_add(1);
    return OkStatus();
  });
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(h->Wait().ok());
  for (int i = 0; i < n; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  EXPECT_EQ(h->bytes_done(), uint64_t(n) * 64 * KiB());
}

// With one piece in flight at a time, an urgent request submitted behind a long queue
// of normal ones completes long before the queue does; a normal one completes after it
// (the control: the order is the queue's, not luck).
TEST_P(IoEngineTest, UrgentRequestsOvertakeQueuedNormalOnes) {
  IoEngine& e = Make(4 * KiB(), 1, 1);
  int f = Open("prio");
  const int n = 256;
  auto w = Alloc((n + 1) * 4 * KiB());
  Fill(w.get(), (n + 1) * 4 * KiB(), 11);
  for (IoPriority late : {IoPriority::kUrgent, IoPriority::kNormal}) {
    std::atomic<int> done{0};
    std::vector<IoRequest> queue;
    for (int i = 0; i < n; ++i)
      queue.push_back({IoOp::kWrite, f, uint64_t(i) * 4 * KiB(), 4 * KiB(), w.get() + i * 4 * KiB()});
    auto count = [&](size_t, const Status&) {
      done.fetch_add(1);
      return OkStatus();
    };
    auto queued = e.Submit(queue, count);
    ASSERT_TRUE(queued.ok());
    int finished_before = -1;
    IoRequest one{IoOp::kWrite, f, uint64_t(n) * 4 * KiB(), 4 * KiB(), w.get() + n * 4 * KiB(), late};
    auto h = e.Submit({&one, 1}, [&](size_t, const Status&) {
      finished_before = done.load();
      return OkStatus();
    });
    ASSERT_TRUE(h.ok());
    ASSERT_TRUE(h->Wait().ok());
    ASSERT_TRUE(queued->Wait().ok());
    if (late == IoPriority::kUrgent) {
      EXPECT_LT(finished_before, n / 2) << "the urgent write waited for most of the queue";
    } else {
      EXPECT_EQ(finished_before, n) << "a normal write overtook the queue";
    }
  }
}

TEST_P(IoEngineTest, MisalignedInputIsInvalidArgumentNamingTheValue) {
  IoEngine& e = Make();
  int f = Open("misaligned");
  auto buf = Alloc(64 * KiB());
  auto off = e.Read(f, 100, 4096, buf.get());
  ASSERT_FALSE(off.ok());
  EXPECT_EQ(off.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(off.status().message().find("offset 100"), std::string::npos) << off.status().message();
  EXPECT_NE(off.status().message().find("4096"), std::string::npos);
  auto len = e.Read(f, 0, 1000, buf.get());
  ASSERT_FALSE(len.ok());
  EXPECT_NE(len.status().message().find("length 1000"), std::string::npos);
  auto addr = e.Write(f, 0, 4096, buf.get() + 512);
  ASSERT_FALSE(addr.ok());
  EXPECT_NE(addr.status().message().find("buffer address"), std::string::npos);
  EXPECT_FALSE(e.Read(f, 0, 0, buf.get()).ok());
  EXPECT_FALSE(e.Read(f + 17, 0, 4096, buf.get()).ok());
  // One bad request rejects the whole batch, nothing queued.
  std::vector<IoRequest> reqs = {{IoOp::kWrite, f, 0, 4096, buf.get()},
                                 {IoOp::kWrite, f, 3, 4096, buf.get()}};
  EXPECT_FALSE(e.Submit(reqs).ok());
  EXPECT_EQ(e.stats().requests, 0u);
}

TEST_P(IoEngineTest, ReadPastEndOfFileIsIoError) {
  IoEngine& e = Make();
  int f = Open("short");
  auto buf = Alloc(64 * KiB());
  ASSERT_TRUE(e.Write(f, 0, 8 * KiB(), buf.get())->Wait().ok());
  Status s = e.Read(f, 0, 64 * KiB(), buf.get())->Wait();
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.message().find("end of file"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("offset 8192"), std::string::npos) << s.message();
}

TEST_P(IoEngineTest, RegisteredBuffersAreUsed) {
  IoEngine& e = Make(64 * KiB(), 4);
  int f = Open("fixed");
  const uint64_t n = 1 << 20;
  auto arena = Alloc(n);
  IoBufferRegion region{arena.get(), n};
  ASSERT_TRUE(e.RegisterBuffers({&region, 1}).ok());
  Fill(arena.get(), n, 11);
  ASSERT_TRUE(e.Write(f, 0, n, arena.get())->Wait().ok());
  auto copy = Alloc(n);
  std::memcpy(copy.get(), arena.get(), n);
  std::memset(arena.get(), 0, n);
  ASSERT_TRUE(e.Read(f, 0, n, arena.get())->Wait().ok());
  EXPECT_EQ(std::memcmp(copy.get(), arena.get(), n), 0);
  if (GetParam() == IoBackendKind::kIoUring) {
    EXPECT_EQ(e.stats().fixed_pieces, 2 * n / (64 * KiB()));
  }
  // An unregistered buffer still works (plain read).
  ASSERT_TRUE(e.Read(f, 0, 64 * KiB(), copy.get())->Wait().ok());
  ASSERT_TRUE(e.UnregisterFile(f).ok());
  EXPECT_FALSE(e.Read(f, 0, 4096, copy.get()).ok());
}

// io_uring registers at most 1 GiB per buffer, so a region beyond that is several; a
// host block may lie across two of them (the arena keeps no gaps at the boundaries),
// and its pieces must still round-trip, each through fixed buffers only.
TEST_P(IoEngineTest, PiecesAcrossOneGiBRegistrationsGoFixedInTwoTransfers) {
  if (GetParam() != IoBackendKind::kIoUring) GTEST_SKIP() << "fixed buffers are io_uring's";
  const uint64_t region_bytes = (1ull << 30) + (2 << 20);
  void* raw = mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(raw, MAP_FAILED);
  std::unique_ptr<void, std::function<void(void*)>> unmap(raw, [&](void* p) { munmap(p, region_bytes); });
  IoEngine& e = Make(1 << 20, 4);
  IoBufferRegion region{raw, region_bytes};
  Status reg = e.RegisterBuffers({&region, 1});
  if (!reg.ok()) GTEST_SKIP() << "cannot register 1 GiB here (memlock limit?): " << reg.ToString();
  int f = Open("across");
  // 2 MiB from 512 KiB before the first buffer's end: the first 1 MiB piece crosses it.
  const uint64_t n = 2 << 20;
  char* buf = static_cast<char*>(raw) + (1ull << 30) - (512 << 10);
  Fill(buf, n, 23);
  auto copy = Alloc(n);
  std::memcpy(copy.get(), buf, n);
  ASSERT_TRUE(e.Write(f, 0, n, buf)->Wait().ok());
  std::memset(buf, 0, n);
  ASSERT_TRUE(e.Read(f, 0, n, buf)->Wait().ok());
  EXPECT_EQ(std::memcmp(copy.get(), buf, n), 0);
  const IoEngineStats s = e.stats();
  // Two pieces each way, the crossing one in two transfers: six, every one fixed.
  EXPECT_EQ(s.pieces, 6u);
  EXPECT_EQ(s.fixed_pieces, s.pieces);
  EXPECT_EQ(s.short_retries, 0u);
}

// Large pieces go to the kernel one per io_uring_enter, so no block plug merges them into
// fewer, larger requests (fewer in flight at the disk); small pieces stay batched.
// The submission batching is io_uring's alone: this suite runs on that backend only.
class IoUringSubmitTest : public IoEngineTest {};

TEST_P(IoUringSubmitTest, LargePiecesAreSubmittedOnePerEnterSmallOnesBatched) {
  const uint64_t n = 8 << 20;
  auto buf = Alloc(n);
  Fill(buf.get(), n, 5);
  {
    IoEngine& e = Make(1 << 20, 8);
    int f = Open("large");
    ASSERT_TRUE(e.Write(f, 0, n, buf.get())->Wait().ok());
    ASSERT_TRUE(e.Read(f, 0, n, buf.get())->Wait().ok());
    EXPECT_EQ(e.stats().pieces, 16u);
    EXPECT_EQ(e.stats().submits, e.stats().pieces);
  }
  IoEngine& e = Make(64 * KiB(), 16);
  int f = Open("small");
  ASSERT_TRUE(e.Write(f, 0, 1 << 20, buf.get())->Wait().ok());
  EXPECT_EQ(e.stats().pieces, 16u);
  EXPECT_LT(e.stats().submits, e.stats().pieces);
}

TEST_P(IoEngineTest, EmptyHandleWaitFails) {
  IoHandle h;
  EXPECT_FALSE(h.valid());
  EXPECT_EQ(h.Wait().code(), StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoEngineTest,
                         ::testing::Values(IoBackendKind::kIoUring, IoBackendKind::kPsync),
                         testing_io::BackendParamName);
INSTANTIATE_TEST_SUITE_P(Backends, IoUringSubmitTest, ::testing::Values(IoBackendKind::kIoUring),
                         testing_io::BackendParamName);

TEST(IoEngineOptions, BadOptionsNameTheKey) {
  IoEngineOptions o;
  o.block_size = 1000;
  auto e = IoEngine::Create(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("aio.block_size"), std::string::npos);
  o = IoEngineOptions{};
  o.queue_depth = 0;
  EXPECT_NE(IoEngine::Create(o).status().message().find("aio.queue_depth"), std::string::npos);
}

TEST(IoEngineOptions, AutoPicksIoUringWhereUsable) {
  IoUringProbe p = ProbeIoUring();
  auto e = IoEngine::Create(IoEngineOptions{});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ((*e)->backend_name(), p.usable ? "io_uring" : "psync") << p.reason;
  if (!p.usable) GTEST_SKIP() << "io_uring unusable here: " << p.reason;
  EXPECT_FALSE(p.kernel.empty());
}

}  // namespace
}  // namespace strata
