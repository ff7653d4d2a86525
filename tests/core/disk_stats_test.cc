// The block device counters behind `strata bench step`'s disk line: parsing, the
// arithmetic between two readings, and a live reading around a direct write.
#include "strata/disk_stats.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

namespace strata {
namespace {

// A line as kernel 6.x writes it: 17 fields (discard and flush after the first 11).
constexpr char kStat6[] =
    "   31152        0  62840000    20950    37785       40  75200000    18000        0     9500    39000"
    "        0        0        0        0      120       30\n";

TEST(DiskStats, ParsesTheFieldsItUses) {
  auto c = ParseDiskStat(kStat6);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->reads, 31152u);
  EXPECT_EQ(c->read_sectors, 62840000u);
  EXPECT_EQ(c->writes, 37785u);
  EXPECT_EQ(c->write_sectors, 75200000u);
  EXPECT_EQ(c->io_ticks_ms, 9500u);
  EXPECT_EQ(c->time_in_queue_ms, 39000u);
  // Kernels before 4.18 write the first 11 only.
  auto old = ParseDiskStat("1 2 3 4 5 6 7 8 9 10 11");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(old->io_ticks_ms, 10u);
  EXPECT_EQ(old->time_in_queue_ms, 11u);
}

TEST(DiskStats, RejectsTextThatIsNotAStatLine) {
  auto short_line = ParseDiskStat("1 2 3 4 5 6 7 8 9 10");
  EXPECT_EQ(short_line.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_line.status().message().find("10 fields, expected at least 11"), std::string::npos)
      << short_line.status().ToString();
  auto word = ParseDiskStat("1 2 3 x 5 6 7 8 9 10 11");
  EXPECT_EQ(word.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(word.status().message().find("field 4 is 'x'"), std::string::npos) << word.status().ToString();
  EXPECT_FALSE(ParseDiskStat("").ok());
  EXPECT_FALSE(ParseDiskStat("1 2 3 4 5 6 7 8 9 10 -11").ok());
}

TEST(DiskStats, ActivityBetweenTwoReadings) {
  DiskCounters a, b;
  a.reads = 10;
  a.read_sectors = 2048;
  a.writes = 5;
  a.write_sectors = 1024;
  a.io_ticks_ms = 100;
  a.time_in_queue_ms = 1000;
  b = a;
  b.reads += 4;
  b.read_sectors += 8192;  // 4 MiB
  b.writes += 2;
  b.write_sectors += 4096;  // 2 MiB
  b.io_ticks_ms += 150;
  b.time_in_queue_ms += 4800;
  b.at = a.at + std::chrono::milliseconds(200);
  DiskActivity d = ActivityBetween(a, b);
  EXPECT_DOUBLE_EQ(d.seconds, 0.2);
  EXPECT_EQ(d.reads, 4u);
  EXPECT_EQ(d.writes, 2u);
  EXPECT_EQ(d.read_bytes, 4u << 20);
  EXPECT_EQ(d.write_bytes, 2u << 20);
  EXPECT_DOUBLE_EQ(d.busy_fraction, 0.75);
  EXPECT_DOUBLE_EQ(d.mean_in_flight, 24.0);
  EXPECT_DOUBLE_EQ(d.bytes_per_s(), (6u << 20) / 0.2);

  // io_ticks counts whole jiffies: a saturated interval may read a little over its length.
  b.io_ticks_ms = a.io_ticks_ms + 204;
  EXPECT_DOUBLE_EQ(ActivityBetween(a, b).busy_fraction, 1.0);
  // A device removed and added again starts its counters over: nothing, not a huge delta.
  DiskCounters restarted;
  restarted.at = b.at;
  DiskActivity r = ActivityBetween(a, restarted);
  EXPECT_EQ(r.read_bytes, 0u);
  EXPECT_EQ(r.writes, 0u);
  EXPECT_DOUBLE_EQ(r.busy_fraction, 0.0);
}

TEST(DiskStats, PathsWithoutADiskAreNamed) {
  auto proc = DiskMonitor::ForPath("/proc");
  EXPECT_EQ(proc.status().code(), StatusCode::kNotFound);
  EXPECT_NE(proc.status().message().find("/proc is on a file system without a block device (proc)"),
            std::string::npos)
      << proc.status().ToString();
  auto missing = DiskMonitor::ForPath("/nonexistent/swap");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/nonexistent/swap"), std::string::npos);
}

// A direct write of 16 MiB, synced, must show in the counters of the device the monitor
// found for the file's directory: a wrong device would not move.
TEST(DiskStats, ADirectWriteShowsInTheCountersOfItsDisk) {
  const std::string dir = std::filesystem::current_path().string();
  auto monitor = DiskMonitor::ForPath(dir);
  if (!monitor.ok()) GTEST_SKIP() << "no disk counters for " << dir << ": " << monitor.status().ToString();
  const std::string path = dir + "/strata-disk-stats-test.tmp";
  const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EINVAL) GTEST_SKIP() << dir << " does not take O_DIRECT";
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const size_t bytes = 16u << 20;
  void* buf = nullptr;
  ASSERT_EQ(posix_memalign(&buf, 4096, bytes), 0);
  std::memset(buf, 0x5a, bytes);
  auto before = monitor->Read();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  const ssize_t wrote = ::pwrite(fd, buf, bytes, 0);
  const int sync = ::fdatasync(fd);
  auto after = monitor->Read();
  ::close(fd);
  ::unlink(path.c_str());
  free(buf);
  ASSERT_EQ(wrote, static_cast<ssize_t>(bytes));
  ASSERT_EQ(sync, 0);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  DiskActivity d = ActivityBetween(*before, *after);
  EXPECT_GE(d.write_bytes, bytes) << "device " << monitor->name();
  EXPECT_GE(d.writes, 1u);
  EXPECT_GT(d.seconds, 0.0);
  EXPECT_GE(d.busy_fraction, 0.0);
  EXPECT_LE(d.busy_fraction, 1.0);
  EXPECT_GE(d.mean_in_flight, 0.0);
}

}  // namespace
}  // namespace strata
