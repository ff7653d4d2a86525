#include "strata/disk_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>

#include "strata/topology.h"

namespace strata {

Result<DiskCounters> ParseDiskStat(std::string_view text) {
  // Fields 1-11: reads, read merges, read sectors, read ticks, writes, write merges,
  // write sectors, write ticks, in flight, io_ticks, time_in_queue.
  std::array<uint64_t, 11> f{};
  size_t n = 0;
  size_t pos = 0;
  while (n < f.size()) {
    pos = text.find_first_not_of(" \t\n", pos);
    if (pos == std::string_view::npos) break;
    const size_t end = std::min(text.find_first_of(" \t\n", pos), text.size());
    const std::string_view field = text.substr(pos, end - pos);
    auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), f[n]);
    if (ec != std::errc() || ptr != field.data() + field.size()) {
      return InvalidArgumentError("block device stat: field " + std::to_string(n + 1) + " is '" +
                                  std::string(field) + "', not a number, in '" + std::string(text) + "'");
    }
    ++n;
    pos = end;
  }
  if (n < f.size()) {
    return InvalidArgumentError("block device stat: " + std::to_string(n) +
                                " fields, expected at least 11, in '" + std::string(text) + "'");
  }
  DiskCounters c;
  c.reads = f[0];
  c.read_sectors = f[2];
  c.writes = f[4];
  c.write_sectors = f[6];
  c.io_ticks_ms = f[9];
  c.time_in_queue_ms = f[10];
  c.at = std::chrono::steady_clock::now();
  return c;
}

DiskActivity ActivityBetween(const DiskCounters& earlier, const DiskCounters& later) {
  auto delta = [](uint64_t a, uint64_t b) { return b >= a ? b - a : 0; };
  DiskActivity a;
  a.seconds = std::max(0.0, std::chrono::duration<double>(later.at - earlier.at).count());
  a.reads = delta(earlier.reads, later.reads);
  a.writes = delta(earlier.writes, later.writes);
  a.read_bytes = delta(earlier.read_sectors, later.read_sectors) * 512;
  a.write_bytes = delta(earlier.write_sectors, later.write_sectors) * 512;
  if (a.seconds > 0) {
    const double ms = a.seconds * 1e3;
    // io_ticks advances in whole jiffies, so a saturated interval can read a hair over 1.
    a.busy_fraction = std::min(1.0, delta(earlier.io_ticks_ms, later.io_ticks_ms) / ms);
    a.mean_in_flight = delta(earlier.time_in_queue_ms, later.time_in_queue_ms) / ms;
  }
  return a;
}

Result<DiskMonitor> DiskMonitor::ForPath(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(BlockDevice b, BlockDeviceForPath(path));
  if (!b.has_device) {
    return NotFoundError(path + " is on a file system without a block device (" +
                         (b.fs_type.empty() ? std::string("unknown") : b.fs_type) +
                         "): there are no disk counters to read");
  }
  DiskMonitor m(b.name, "/sys/class/block/" + b.name + "/stat");
  STRATA_RETURN_IF_ERROR(m.Read().status());
  return m;
}

Result<DiskCounters> DiskMonitor::Read() const {
  // One read(2) of a sysfs file returns the whole line, written by the kernel at once.
  const int fd = ::open(stat_path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "opening " + stat_path_);
  char buf[512];
  const ssize_t got = ::read(fd, buf, sizeof(buf) - 1);
  const int err = errno;
  ::close(fd);
  if (got < 0) return ErrnoError(err, "reading " + stat_path_);
  Result<DiskCounters> c = ParseDiskStat(std::string_view(buf, static_cast<size_t>(got)));
  if (!c.ok()) return c.status().WithContext(stat_path_);
  return c;
}

}  // namespace strata
