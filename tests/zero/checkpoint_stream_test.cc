// The checkpoint file streams (zero/checkpoint_stream.h) over files many times their two
// buffers: sections of awkward sizes written and read back in pieces of random sizes give
// the same bytes and checksums; a wrong size, an I/O error and a file system without
// direct I/O are handled.
#include "zero/checkpoint_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "tiering/io_fault.h"

namespace strata::ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string ScratchFile(const std::string& dir, const std::string& name) {
  fs::create_directories(dir);
  return dir + "/" + name;
}

std::string TempDir() {
  return (fs::temp_directory_path() / ("strata-stream-test-" + std::to_string(getpid()))).string();
}

// Sections that start and end inside buffers, span several, and fill one exactly.
const std::vector<uint64_t> kSections = {kStreamBufferBytes * 2 + 12, 4096, 3 << 20, 1, kStreamBufferBytes};

std::vector<uint8_t> Pattern(uint64_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

struct Written {
  std::vector<std::vector<uint8_t>> data;
  std::vector<uint64_t> offsets, sums;
  uint64_t bytes = 0, xxh3 = 0;
};

Written WriteSections(IoEngine& io, const std::string& path) {
  Written w;
  auto writer = FileWriter::Create(io, nullptr, path);
  EXPECT_TRUE(writer.ok()) << writer.status().ToString();
  if (!writer.ok()) return w;
  std::mt19937 rng(5);
  for (size_t s = 0; s < kSections.size(); ++s) {
    w.data.push_back(Pattern(kSections[s], static_cast<uint32_t>(s)));
    w.offsets.push_back((*writer)->bytes());
    (*writer)->BeginSection();
    for (uint64_t done = 0; done < kSections[s];) {
      const uint64_t want = std::min<uint64_t>(kSections[s] - done, 1 + rng() % (3 << 20));
      if (rng() % 2) {
        EXPECT_TRUE((*writer)->Append(w.data[s].data() + done, want).ok());
        done += want;
      } else {
        auto room = (*writer)->Space(want);
        EXPECT_TRUE(room.ok());
        std::memcpy(room->data(), w.data[s].data() + done, room->size());
        (*writer)->Commit(room->size());
        done += room->size();
      }
    }
    auto sum = (*writer)->EndSection();
    EXPECT_TRUE(sum.ok());
    w.sums.push_back(*sum);
  }
  Status st = (*writer)->Finish();
  EXPECT_TRUE(st.ok()) << st.ToString();
  w.bytes = (*writer)->bytes();
  w.xxh3 = (*writer)->xxh3();
  return w;
}

void ReadBack(IoEngine& io, const std::string& path, const Written& w) {
  auto reader = FileReader::Open(io, nullptr, path, w.bytes);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::mt19937 rng(9);
  for (size_t s = 0; s < kSections.size(); ++s) {
    ASSERT_TRUE((*reader)->BeginSection(w.offsets[s], kSections[s]).ok());
    std::vector<uint8_t> got;
    while (got.size() < kSections[s]) {
      auto v = (*reader)->Next(1 + rng() % (5 << 20));
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      ASSERT_FALSE(v->empty());
      got.insert(got.end(), v->begin(), v->end());
    }
    EXPECT_TRUE(got == w.data[s]) << "section " << s;
    auto sum = (*reader)->EndSection();
    ASSERT_TRUE(sum.ok());
    EXPECT_EQ(*sum, w.sums[s]);
    EXPECT_EQ(*sum, Xxh3(w.data[s].data(), w.data[s].size()));
  }
  EXPECT_TRUE((*reader)->contiguous());
  EXPECT_EQ((*reader)->read_end(), w.bytes);
  EXPECT_EQ((*reader)->file_xxh3(), w.xxh3);
}

TEST(CheckpointStream, SectionsRoundTripThroughBothBuffers) {
  auto io = IoEngine::Create(IoEngineOptions{});
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  const std::string path = ScratchFile(TempDir(), "sections.bin");
  const Written w = WriteSections(**io, path);
  uint64_t expected = 0;
  for (uint64_t s : kSections) expected += AlignUp(s);
  EXPECT_EQ(w.bytes, expected);
  EXPECT_EQ(fs::file_size(path), expected);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(w.xxh3, Xxh3(all.data(), all.size())) << "the file checksum covers the padding too";
  ReadBack(**io, path, w);
  // Reading one section alone is not contiguous: no file checksum is claimed.
  auto reader = FileReader::Open(**io, nullptr, path, w.bytes);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->BeginSection(w.offsets[2], kSections[2]).ok());
  ASSERT_TRUE((*reader)->Skip(kSections[2]).ok());
  EXPECT_FALSE((*reader)->contiguous());
  fs::remove_all(TempDir());
}

TEST(CheckpointStream, WrongSizeAndIoErrorsAreNamed) {
  auto faults = std::make_shared<ScriptedFaults>();
  IoEngineOptions options;
  options.fault_hook = faults;
  auto io = IoEngine::Create(options);
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  const std::string path = ScratchFile(TempDir(), "faults.bin");
  const Written w = WriteSections(**io, path);
  auto shorter = FileReader::Open(**io, nullptr, path, w.bytes + 4096);
  EXPECT_EQ(shorter.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(shorter.status().message(), HasSubstr("truncated"));
  EXPECT_EQ(FileReader::Open(**io, nullptr, path + ".none", 1).status().code(), StatusCode::kNotFound);

  faults->Add({ScriptedFaults::Kind::kError, EIO, /*attempt=*/-1, /*offset=*/-1, /*op=*/0, /*times=*/1});
  auto reader = FileReader::Open(**io, nullptr, path, w.bytes);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->BeginSection(0, kSections[0]).ok());
  Status st = (*reader)->Skip(kSections[0]);
  EXPECT_EQ(st.code(), StatusCode::kIoError) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(path));

  faults->Add({ScriptedFaults::Kind::kError, ENOSPC, /*attempt=*/-1, /*offset=*/-1, /*op=*/1, /*times=*/1});
  auto writer = FileWriter::Create(**io, nullptr, path);
  ASSERT_TRUE(writer.ok());
  std::vector<uint8_t> data(3 * kStreamBufferBytes, 1);
  st = (*writer)->Append(data.data(), data.size());
  if (st.ok()) st = (*writer)->Finish();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  fs::remove_all(TempDir());
}

TEST(CheckpointStream, WorksWithoutDirectIo) {
  struct statfs sfs {};
  if (statfs("/dev/shm", &sfs) != 0 || sfs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
    GTEST_SKIP() << "no tmpfs at /dev/shm";
  }
  auto io = IoEngine::Create(IoEngineOptions{});
  ASSERT_TRUE(io.ok()) << io.status().ToString();
  const std::string dir = "/dev/shm/strata-stream-test-" + std::to_string(getpid());
  const std::string path = ScratchFile(dir, "buffered.bin");
  const Written w = WriteSections(**io, path);
  ReadBack(**io, path, w);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata::ckpt
