// NvmeStore: striping, slots, checksums, corrupted and truncated swap files, stale and
// live-owned swap directories, run against both IoEngine backends.
#include "strata/nvme_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>

#include "tiering/io_fault.h"
#include "tiering/io_test_util.h"

namespace strata {
namespace {

namespace fs = std::filesystem;
using testing_io::Alloc;
using testing_io::Fill;

constexpr uint64_t kStripe = 64 << 10;

// XORs the byte at `offset` of `path` behind the store's back (through the page cache:
// the store's O_DIRECT reads see it once it is synced).
void FlipByte(const std::string& path, uint64_t offset) {
  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, static_cast<off_t>(offset)), 1);
  c ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(offset)), 1);
  ::fsync(fd);
  ::close(fd);
}

class NvmeStoreTest : public ::testing::TestWithParam<IoBackendKind> {
 protected:
  void SetUp() override {
    if (testing_io::SkipIfUnavailable(GetParam())) GTEST_SKIP() << "io_uring refused on this machine";
    dir_ = testing_io::ScratchDir("nvme");
    faults_ = std::make_shared<ScriptedFaults>();
    IoEngineOptions o;
    o.backend = GetParam();
    o.block_size = kStripe;
    o.queue_depth = 8;
    o.fault_hook = faults_;
    engine_ = std::move(IoEngine::Create(o)).value();
  }
  void TearDown() override {
    engine_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  NvmeStoreOptions Opts(int paths, uint64_t slot_size, uint64_t slots) {
    NvmeStoreOptions o;
    for (int i = 0; i < paths; ++i) o.paths.push_back(dir_ + "/d" + std::to_string(i));
    o.slot_size = slot_size;
    o.slot_count = slots;
    return o;
  }
  std::unique_ptr<NvmeStore> Open(const NvmeStoreOptions& o) {
    auto s = NvmeStore::Open(*engine_, o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  std::string dir_;
  std::shared_ptr<ScriptedFaults> faults_;
  std::unique_ptr<IoEngine> engine_;
};

TEST_P(NvmeStoreTest, RoundTripsSlotsStripedOverPaths) {
  // 200 KiB slots: not a multiple of the stripe, so slots straddle stripes and files.
  auto store = Open(Opts(3, 200 << 10, 12));
  ASSERT_TRUE(store);
  EXPECT_EQ(store->files().size(), 3u);
  const uint64_t n = store->slot_size();
  std::vector<SlotId> slots;
  std::vector<testing_io::AlignedBuf> data;
  std::vector<IoHandle> hs;
  for (int i = 0; i < 12; ++i) {
    slots.push_back(*store->Allocate());
    data.push_back(Alloc(n));
    Fill(data.back().get(), n, 100 + i);
    hs.push_back(*store->Write(slots.back(), data.back().get(), n));
  }
  for (auto& h : hs) ASSERT_TRUE(h.Wait().ok());
  auto back = Alloc(n);
  for (int i = 11; i >= 0; --i) {
    ASSERT_TRUE(store->Read(slots[i], back.get(), n)->Wait().ok()) << i;
    ASSERT_EQ(std::memcmp(back.get(), data[i].get(), n), 0) << i;
  }
  EXPECT_EQ(store->free_slots(), 0u);
  EXPECT_EQ(store->Allocate().status().code(), StatusCode::kOutOfBudget);
}

TEST_P(NvmeStoreTest, OneSlotIsStripedOverEveryPath) {
  auto store = Open(Opts(3, 3 * kStripe, 2));
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  ASSERT_EQ(s, 0u);
  auto data = Alloc(3 * kStripe);
  Fill(data.get(), 3 * kStripe, 5);
  ASSERT_TRUE(store->Write(s, data.get(), 3 * kStripe)->Wait().ok());
  // Stripe k of slot 0 is at offset 0 of file k.
  for (int k = 0; k < 3; ++k) {
    std::ifstream f(store->files()[k], std::ios::binary);
    std::string got(kStripe, '\0');
    f.read(got.data(), kStripe);
    EXPECT_EQ(std::memcmp(got.data(), data.get() + k * kStripe, kStripe), 0) << k;
  }
}

TEST_P(NvmeStoreTest, BoundarySizes) {
  auto store = Open(Opts(2, 5 * kStripe, 4));
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  for (uint64_t len : {kStripe, kStripe + 4096, 3 * kStripe + 8192, uint64_t{4096}, 5 * kStripe}) {
    auto w = Alloc(len), r = Alloc(len);
    Fill(w.get(), len, len);
    ASSERT_TRUE(store->Write(s, w.get(), len)->Wait().ok()) << len;
    ASSERT_TRUE(store->Read(s, r.get(), len)->Wait().ok()) << len;
    EXPECT_EQ(std::memcmp(w.get(), r.get(), len), 0) << len;
  }
  auto big = Alloc(6 * kStripe);
  EXPECT_EQ(store->Write(s, big.get(), 6 * kStripe).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Read(s, big.get(), 4096 * 2).status().code(), StatusCode::kInvalidArgument);
}

// A slot written with a prefix reads back whole or as that prefix alone, each verified
// (the engine reads the master part of an optimizer slot as a parameter shard).
TEST_P(NvmeStoreTest, PrefixReadsBackAloneAndVerified) {
  auto store = Open(Opts(2, 4 * kStripe, 2));
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  const uint64_t len = 3 * kStripe + 8192;
  auto w = Alloc(len), r = Alloc(len);
  Fill(w.get(), len, 7);
  // Prefixes inside a stripe, on a stripe boundary, and in the last partial stripe.
  for (uint64_t prefix : {uint64_t{4096}, kStripe + 12288, 2 * kStripe, 3 * kStripe + 4096}) {
    ASSERT_TRUE(store->Write(s, w.get(), len, prefix)->Wait().ok()) << prefix;
    std::memset(r.get(), 0, len);
    ASSERT_TRUE(store->Read(s, r.get(), prefix)->Wait().ok()) << prefix;
    EXPECT_EQ(std::memcmp(w.get(), r.get(), prefix), 0) << prefix;
    EXPECT_EQ(static_cast<unsigned char>(r.get()[prefix]), 0) << "read past the prefix " << prefix;
    ASSERT_TRUE(store->Read(s, r.get(), len)->Wait().ok()) << prefix;
    EXPECT_EQ(std::memcmp(w.get(), r.get(), len), 0) << prefix;
    // Only the whole slot and the prefix are readable lengths.
    const uint64_t other = prefix + 4096 == len ? prefix - 4096 : prefix + 4096;
    EXPECT_EQ(store->Read(s, r.get(), other).status().code(), StatusCode::kInvalidArgument) << prefix;
  }
  // Rewritten without a prefix, the old prefix is no longer a readable length.
  ASSERT_TRUE(store->Write(s, w.get(), len)->Wait().ok());
  EXPECT_EQ(store->Read(s, r.get(), 4096).status().code(), StatusCode::kInvalidArgument);
  for (uint64_t bad : {len, len + 4096, uint64_t{100}}) {
    Status st = store->Write(s, w.get(), len, bad).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("prefix"), std::string::npos) << st.message();
  }
}

// A flipped byte inside the prefix fails the prefix read; one past it fails only the
// whole read.
TEST_P(NvmeStoreTest, PrefixReadDetectsCorruptionInsideItOnly) {
  auto store = Open(Opts(1, 2 * kStripe, 1));
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  const uint64_t len = 2 * kStripe, prefix = kStripe / 2;
  auto w = Alloc(len), r = Alloc(len);
  Fill(w.get(), len, 3);
  auto flip = [&](uint64_t offset) { FlipByte(store->files()[0], offset); };
  ASSERT_TRUE(store->Write(s, w.get(), len, prefix)->Wait().ok());
  flip(prefix + 10);  // in the first stripe, after the cut
  EXPECT_TRUE(store->Read(s, r.get(), prefix)->Wait().ok());
  EXPECT_EQ(store->Read(s, r.get(), len)->Wait().code(), StatusCode::kCorruption);
  ASSERT_TRUE(store->Write(s, w.get(), len, prefix)->Wait().ok());
  flip(prefix - 10);
  Status st = store->Read(s, r.get(), prefix)->Wait();
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
}

// ReadInRanges reads the whole write back in parts, all in flight at once, each a run of
// whole segments (cut also at the prefix): they tile the slot in order and never number
// more than asked; with more asked than there are segments, one per segment.
TEST_P(NvmeStoreTest, RangesTileTheWriteAtItsSegmentBoundaries) {
  auto store = Open(Opts(2, 4 * kStripe, 2));
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  const uint64_t len = 3 * kStripe + 8192, prefix = kStripe + 4096;
  auto w = Alloc(len), r = Alloc(len);
  Fill(w.get(), len, 11);
  ASSERT_TRUE(store->Write(s, w.get(), len, prefix)->Wait().ok());
  // Every boundary of this write: 0, the stripes, the prefix cut, the end.
  const std::set<uint64_t> cuts = {0, kStripe, prefix, 2 * kStripe, 3 * kStripe, len};
  for (int asked : {1, 2, 3, 5, 100}) {
    std::memset(r.get(), 0, len);
    auto ranges = store->ReadInRanges(s, r.get(), asked);
    ASSERT_TRUE(ranges.ok()) << asked << ": " << ranges.status().ToString();
    EXPECT_GE(ranges->size(), 1u) << asked;
    EXPECT_LE(ranges->size(), static_cast<size_t>(asked));
    if (asked == 1 || asked == 100) {
      EXPECT_EQ(ranges->size(), asked == 1 ? 1u : cuts.size() - 1) << asked;
    }
    uint64_t next = 0;
    for (NvmeStore::Range& range : *ranges) {
      EXPECT_TRUE(range.read.Wait().ok());
      EXPECT_EQ(range.offset, next) << asked;
      EXPECT_TRUE(cuts.count(range.offset + range.length))
          << asked << ": ends at " << range.offset + range.length;
      next = range.offset + range.length;
    }
    EXPECT_EQ(next, len) << asked;
    EXPECT_EQ(std::memcmp(w.get(), r.get(), len), 0) << asked;
  }
  Status none = store->ReadInRanges(s, r.get(), 0).status();
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("at least 1"), std::string::npos) << none.message();
  SlotId never = *store->Allocate();
  EXPECT_EQ(store->ReadInRanges(never, r.get(), 2).status().code(), StatusCode::kFailedPrecondition);
}

// A slot need not start on a stripe: its parts end on its own segment boundaries.
TEST_P(NvmeStoreTest, RangesOfASlotOffTheStripeEndOnItsOwnBoundaries) {
  const uint64_t slot_size = 2 * kStripe + 12288;  // slot 1 starts 12 KiB into a stripe
  auto store = Open(Opts(2, slot_size, 2));
  ASSERT_TRUE(store);
  SlotId first = *store->Allocate(), s = *store->Allocate();
  ASSERT_EQ(first, 0u);
  auto w = Alloc(slot_size), r = Alloc(slot_size);
  Fill(w.get(), slot_size, 23);
  ASSERT_TRUE(store->Write(s, w.get(), slot_size)->Wait().ok());
  std::memset(r.get(), 0, slot_size);
  auto ranges = store->ReadInRanges(s, r.get(), 8);
  ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
  const uint64_t shift = kStripe - 12288;  // slot 1's first stripe boundary
  std::vector<uint64_t> offsets;
  for (NvmeStore::Range& range : *ranges) {
    EXPECT_TRUE(range.read.Wait().ok());
    offsets.push_back(range.offset);
  }
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, shift, shift + kStripe}));
  EXPECT_EQ(std::memcmp(w.get(), r.get(), slot_size), 0);
}

// A flipped byte fails the part that holds it, naming its segment of the write and its
// file offset, and no other part.
TEST_P(NvmeStoreTest, RangeReadDetectsCorruptionInsideItOnly) {
  auto store = Open(Opts(1, 4 * kStripe, 1));
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  const uint64_t len = 4 * kStripe;
  auto w = Alloc(len), r = Alloc(len);
  Fill(w.get(), len, 5);
  ASSERT_TRUE(store->Write(s, w.get(), len)->Wait().ok());
  FlipByte(store->files()[0], 2 * kStripe + 100);
  auto ranges = store->ReadInRanges(s, r.get(), 4);
  ASSERT_TRUE(ranges.ok()) << ranges.status().ToString();
  ASSERT_EQ(ranges->size(), 4u);
  for (size_t k = 0; k < 4; ++k) {
    Status st = (*ranges)[k].read.Wait();
    if (k != 2) {
      EXPECT_TRUE(st.ok()) << k << ": " << st.ToString();
      continue;
    }
    ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find("segment 2 ("), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("offset " + std::to_string(2 * kStripe) + ","), std::string::npos)
        << st.message();
  }
}

TEST_P(NvmeStoreTest, SpeculativeTwoSlotUpdate) {
  auto store = Open(Opts(1, 128 << 10, 2));
  ASSERT_TRUE(store);
  SlotId a = *store->Allocate(), b = *store->Allocate();
  auto v1 = Alloc(128 << 10), v2 = Alloc(128 << 10), r = Alloc(128 << 10);
  Fill(v1.get(), 128 << 10, 1);
  Fill(v2.get(), 128 << 10, 2);
  ASSERT_TRUE(store->Write(a, v1.get(), 128 << 10)->Wait().ok());  // committed version
  ASSERT_TRUE(store->Write(b, v2.get(), 128 << 10)->Wait().ok());  // speculative version
  // Rollback: the committed slot is untouched.
  ASSERT_TRUE(store->Read(a, r.get(), 128 << 10)->Wait().ok());
  EXPECT_EQ(std::memcmp(r.get(), v1.get(), 128 << 10), 0);
  ASSERT_TRUE(store->Read(b, r.get(), 128 << 10)->Wait().ok());
  EXPECT_EQ(std::memcmp(r.get(), v2.get(), 128 << 10), 0);
}

TEST_P(NvmeStoreTest, SlotStateErrors) {
  auto store = Open(Opts(1, 64 << 10, 2));
  ASSERT_TRUE(store);
  auto buf = Alloc(64 << 10);
  SlotId s = *store->Allocate();
  EXPECT_EQ(store->Read(s, buf.get(), 64 << 10).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Free(s).ok());
  EXPECT_EQ(store->Free(s).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Write(s, buf.get(), 64 << 10).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->Write(99, buf.get(), 64 << 10).status().code(), StatusCode::kFailedPrecondition);
}

TEST_P(NvmeStoreTest, CorruptedSwapFileIsCorruptionNamingPathSlotOffset) {
  auto store = Open(Opts(2, 4 * kStripe, 3));
  ASSERT_TRUE(store);
  SlotId s0 = *store->Allocate(), s1 = *store->Allocate();
  auto w = Alloc(4 * kStripe), r = Alloc(4 * kStripe);
  Fill(w.get(), 4 * kStripe, 9);
  ASSERT_TRUE(store->Write(s0, w.get(), 4 * kStripe)->Wait().ok());
  ASSERT_TRUE(store->Write(s1, w.get(), 4 * kStripe)->Wait().ok());
  // Slot 1 = stripes 4..7; stripe 5 is in file 1 at offset 2 * stripe. Flip a byte there.
  FlipByte(store->files()[1], 2 * kStripe + 100);
  ASSERT_TRUE(store->Read(s0, r.get(), 4 * kStripe)->Wait().ok());
  Status st = store->Read(s1, r.get(), 4 * kStripe)->Wait();
  EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("slot 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(store->files()[1]), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("offset " + std::to_string(2 * kStripe)), std::string::npos) << st.message();
}

TEST_P(NvmeStoreTest, WithoutChecksumsCorruptionGoesUnnoticed) {
  auto o = Opts(1, kStripe, 1);
  o.checksum = false;
  auto store = Open(o);
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  auto w = Alloc(kStripe), r = Alloc(kStripe);
  Fill(w.get(), kStripe, 3);
  ASSERT_TRUE(store->Write(s, w.get(), kStripe)->Wait().ok());
  {
    int fd = ::open(store->files()[0].c_str(), O_RDWR);
    char c = 1;
    ASSERT_EQ(::pwrite(fd, &c, 1, 7), 1);
    ::close(fd);
  }
  ASSERT_TRUE(store->Read(s, r.get(), kStripe)->Wait().ok());
  EXPECT_NE(std::memcmp(w.get(), r.get(), kStripe), 0);
}

TEST_P(NvmeStoreTest, TruncatedSwapFileIsIoError) {
  auto store = Open(Opts(1, 2 * kStripe, 4));
  ASSERT_TRUE(store);
  SlotId s0 = *store->Allocate();
  SlotId s1 = *store->Allocate();
  auto w = Alloc(2 * kStripe);
  ASSERT_TRUE(store->Write(s0, w.get(), 2 * kStripe)->Wait().ok());
  ASSERT_TRUE(store->Write(s1, w.get(), 2 * kStripe)->Wait().ok());
  ASSERT_EQ(::truncate(store->files()[0].c_str(), 2 * kStripe), 0);
  Status st = store->Read(s1, w.get(), 2 * kStripe)->Wait();
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_NE(st.message().find("end of file"), std::string::npos) << st.message();
}

TEST_P(NvmeStoreTest, FailedWriteLeavesSlotUnreadable) {
  auto store = Open(Opts(1, 2 * kStripe, 2));
  ASSERT_TRUE(store);
  SlotId s = *store->Allocate();
  auto w = Alloc(2 * kStripe);
  faults_->Add(ScriptedFaults::Rule{ScriptedFaults::Kind::kError, ENOSPC, -1, -1, 1, 1});
  EXPECT_EQ(store->Write(s, w.get(), 2 * kStripe)->Wait().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(store->Read(s, w.get(), 2 * kStripe).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->Write(s, w.get(), 2 * kStripe)->Wait().ok());
  EXPECT_TRUE(store->Read(s, w.get(), 2 * kStripe)->Wait().ok());
}

TEST_P(NvmeStoreTest, ZeroFillPrepare) {
  auto o = Opts(2, kStripe, 8);
  o.prepare = SwapPrepare::kZeroFill;
  auto store = Open(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(fs::file_size(store->files()[0]), store->file_size());
  SlotId s = *store->Allocate();
  auto w = Alloc(kStripe), r = Alloc(kStripe);
  Fill(w.get(), kStripe, 4);
  ASSERT_TRUE(store->Write(s, w.get(), kStripe)->Wait().ok());
  ASSERT_TRUE(store->Read(s, r.get(), kStripe)->Wait().ok());
  EXPECT_EQ(std::memcmp(w.get(), r.get(), kStripe), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, NvmeStoreTest,
                         ::testing::Values(IoBackendKind::kIoUring, IoBackendKind::kPsync),
                         testing_io::BackendParamName);

class NvmeStoreFilesTest : public NvmeStoreTest {};

TEST_P(NvmeStoreFilesTest, CloseRemovesFilesAndPreallocates) {
  auto store = Open(Opts(2, 1 << 20, 6));
  ASSERT_TRUE(store);
  auto files = store->files();
  EXPECT_EQ(store->file_size(), 3u << 20);
  for (auto& f : files) {
    EXPECT_EQ(fs::file_size(f), 3u << 20);
    struct stat st {};
    ASSERT_EQ(::stat(f.c_str(), &st), 0);
    EXPECT_GE(uint64_t(st.st_blocks) * 512, 3u << 20) << "not preallocated: " << f;
  }
  ASSERT_TRUE(store->Close().ok());
  for (auto& f : files) EXPECT_FALSE(fs::exists(f));
  EXPECT_FALSE(fs::exists(dir_ + "/d0/strata-swap.lock"));
}

TEST_P(NvmeStoreFilesTest, DiskTooSmallFailsAtOnceWithSizeNeeded) {
  auto s = NvmeStore::Open(*engine_, Opts(1, 1ull << 30, 1ull << 20));  // 1 PiB
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.status().message().find("needs 1.00 PiB"), std::string::npos) << s.status().message();
  EXPECT_FALSE(fs::exists(dir_ + "/d0/strata-swap.swap"));
}

TEST_P(NvmeStoreFilesTest, StaleFilesFromACrashedRunAreCleared) {
  fs::create_directories(dir_ + "/d0");
  std::ofstream(dir_ + "/d0/strata-swap.lock") << "999999\n";
  std::ofstream(dir_ + "/d0/strata-swap.swap") << std::string(12345, 'x');
  auto store = Open(Opts(1, kStripe, 2));
  ASSERT_TRUE(store);
  EXPECT_EQ(fs::file_size(dir_ + "/d0/strata-swap.swap"), 2 * kStripe);
  std::ifstream lock(dir_ + "/d0/strata-swap.lock");
  int pid = 0;
  lock >> pid;
  EXPECT_EQ(pid, ::getpid());
}

TEST_P(NvmeStoreFilesTest, SwapOwnedByALiveStoreIsRefused) {
  auto first = Open(Opts(2, kStripe, 2));
  ASSERT_TRUE(first);
  auto second = NvmeStore::Open(*engine_, Opts(2, kStripe, 2));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("pid " + std::to_string(::getpid())), std::string::npos)
      << second.status().message();
  // The owner's files are untouched and still work.
  SlotId s = *first->Allocate();
  auto w = Alloc(kStripe);
  ASSERT_TRUE(first->Write(s, w.get(), kStripe)->Wait().ok());
  ASSERT_TRUE(first->Read(s, w.get(), kStripe)->Wait().ok());
  // Another name in the same directory (another rank) is fine.
  auto o = Opts(2, kStripe, 2);
  o.name = "rank1";
  EXPECT_TRUE(Open(o));
}

TEST_P(NvmeStoreFilesTest, SwapOwnedByAnotherLiveProcessIsRefused) {
  fs::create_directories(dir_ + "/d0");
  int ready[2], release[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(release), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int fd = ::open((dir_ + "/d0/strata-swap.lock").c_str(), O_RDWR | O_CREAT, 0600);
    ::flock(fd, LOCK_EX);
    std::string pid = std::to_string(::getpid()) + "\n";
    (void)!::write(fd, pid.data(), pid.size());
    (void)!::write(ready[1], "x", 1);
    char c;
    (void)!::read(release[0], &c, 1);
    ::_exit(0);
  }
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  auto s = NvmeStore::Open(*engine_, Opts(1, kStripe, 2));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("pid " + std::to_string(child)), std::string::npos)
      << s.status().message();
  ASSERT_EQ(::write(release[1], "x", 1), 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  // The owner is gone: its lock is free and the directory can be taken over.
  EXPECT_TRUE(Open(Opts(1, kStripe, 2)));
  for (int fd : {ready[0], ready[1], release[0], release[1]}) ::close(fd);
}

INSTANTIATE_TEST_SUITE_P(Backends, NvmeStoreFilesTest, ::testing::Values(IoBackendKind::kIoUring),
                         testing_io::BackendParamName);

}  // namespace
}  // namespace strata
