// How busy a disk was over an interval, from the kernel's per-device I/O counters
// (/sys/class/block/NAME/stat, Documentation/block/stat.rst).
//
// `strata bench step` reads them around its measured steps to tell a step that waits on
// the disk from one that leaves it idle: the fraction of the interval with at least one
// request in flight (io_ticks), the mean number in flight (time_in_queue over the
// interval) and the bytes moved. The counters are the device's, so they include every
// process's I/O to it, not only strata's.
//
// Plain data and a read of one sysfs file; every function is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "strata/status.h"

namespace strata {

// One reading of a device's counters (sectors are 512 bytes, whatever the device's
// block size).
struct DiskCounters {
  uint64_t reads = 0, read_sectors = 0;    // completed read requests, sectors read
  uint64_t writes = 0, write_sectors = 0;  // completed write requests, sectors written
  uint64_t io_ticks_ms = 0;                // ms with at least one request in flight
  uint64_t time_in_queue_ms = 0;           // sum over requests of their ms in flight
  std::chrono::steady_clock::time_point at;
};

// Parses the text of a stat file: at least the 11 fields every kernel since 2.6 writes
// (later kernels add discard and flush fields, which are ignored). InvalidArgument
// naming the text when it has fewer fields or a field is not a number.
Result<DiskCounters> ParseDiskStat(std::string_view text);

// What happened on the device between two readings.
struct DiskActivity {
  double seconds = 0;         // wall time between the readings
  double busy_fraction = 0;   // io_ticks over the interval, at most 1
  double mean_in_flight = 0;  // time_in_queue over the interval
  uint64_t reads = 0, writes = 0;
  uint64_t read_bytes = 0, write_bytes = 0;
  double bytes_per_s() const { return seconds > 0 ? (read_bytes + write_bytes) / seconds : 0; }
};
// `later` must have been read after `earlier` from the same device; a counter that went
// backwards (the device was removed and added again) counts as zero.
DiskActivity ActivityBetween(const DiskCounters& earlier, const DiskCounters& later);

// The device that holds a path, and reads of its counters.
class DiskMonitor {
 public:
  // NotFound when the path does not exist, or lives on a file system without a block
  // device (tmpfs, overlay, a network file system): the message names the path and the
  // file system. Other errors from stat or sysfs as ErrnoError.
  static Result<DiskMonitor> ForPath(const std::string& path);

  // Reads the counters now. IoError/ErrnoError when the stat file cannot be read (the
  // device went away), InvalidArgument when its text does not parse.
  Result<DiskCounters> Read() const;

  const std::string& name() const { return name_; }  // kernel name: "vda", "nvme0n1p2"

 private:
  DiskMonitor(std::string name, std::string stat_path)
      : name_(std::move(name)), stat_path_(std::move(stat_path)) {}
  std::string name_;
  std::string stat_path_;
};

}  // namespace strata
