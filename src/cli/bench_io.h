// Internal to `strata bench io`: one measured point and the fio runner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/host_arena.h"
#include "strata/status.h"

namespace strata::cli::benchio {

enum class Mode { kSeqRead, kSeqWrite, kRandRead, kRandWrite };
const char* ModeName(Mode m);
inline bool IsWrite(Mode m) { return m == Mode::kSeqWrite || m == Mode::kRandWrite; }

struct Figures {
  bool ran = false;
  double bytes_per_s = 0;
  double p50_us = 0, p99_us = 0;  // per request, submit to completion
  double cpu_pct = 0;             // process CPU time / wall time (100 = one core)
  std::string error;              // why it did not run, when !ran
};

struct FioJob {
  std::vector<std::string> files;  // same files strata used
  uint64_t size = 0;               // bytes per file
  Mode mode = Mode::kSeqRead;
  uint64_t bs = 0;
  int qd = 0;
  std::string hugetlbfs;  // a hugetlbfs mount for fio's buffers; "" = malloc
  bool thp = false;       // malloc on transparent huge pages (when no hugetlbfs)
};

// How the IoEngine of a pass is configured.
struct PassConfig {
  std::string backend = "auto";  // auto | io_uring | psync
  int threads = 1;
  bool sqpoll = false;
  bool huge_pages = true;  // buffers on transparent huge pages, as the host arena maps them
};

// The test files and the buffers of `strata bench io` (src/cli/bench_io_pass.cc).
class IoBench {
 public:
  IoBench(const PassConfig& config, std::vector<std::string> files, uint64_t per_file, uint64_t buffer_bytes)
      : config_(config), files_(std::move(files)), per_file_(per_file), buffer_bytes_(buffer_bytes) {}
  ~IoBench();
  IoBench(const IoBench&) = delete;
  IoBench& operator=(const IoBench&) = delete;

  // Maps the buffers (HostPages, as the host arena does), creates and fills the files,
  // and flushes them.
  Status Setup();
  // Re-creates the files' extents as fresh fallocated (unwritten) space.
  Status Refresh();
  // fsync of every file, so data written by one pass is not written back during the next.
  Status Sync();
  // One sequential or random pass over the files, qd requests of bs in flight.
  Result<Figures> Pass(Mode mode, uint64_t bs, int qd, bool checksum, std::string* backend);
  // The buffers' mapping and how much of it the kernel put on 2 MiB pages (after Setup).
  uint64_t buffer_size() const { return pages_ ? pages_->size() : 0; }
  uint64_t huge_page_bytes() const { return huge_page_bytes_; }

 private:
  Status Allocate(const std::string& path, bool fresh);

  PassConfig config_;
  std::vector<std::string> files_;
  uint64_t per_file_;
  uint64_t buffer_bytes_;
  std::unique_ptr<HostPages> pages_;
  char* data_ = nullptr;  // pages_->data()
  uint64_t huge_page_bytes_ = 0;
};

// The run with the median bandwidth among those that ran (else the first's error).
Figures Median(std::vector<Figures> runs);

// "" when fio is not on PATH, else its version line.
std::string FioVersion();
// Runs fio with ioengine=io_uring, fixedbufs, registerfiles, direct=1 over the files.
Figures RunFio(const FioJob& job);
// A mounted hugetlbfs with at least `bytes` of free huge pages (fio's buffers can only
// be on huge pages that way), or "" when there is none.
std::string HugetlbfsWithRoom(uint64_t bytes);

}  // namespace strata::cli::benchio
