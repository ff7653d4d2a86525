// Internal to `strata bench io`: one measured point and the fio runner.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
};

// "" when fio is not on PATH, else its version line.
std::string FioVersion();
// Runs fio with ioengine=io_uring, fixedbufs, registerfiles, direct=1 over the files.
Figures RunFio(const FioJob& job);

}  // namespace strata::cli::benchio
