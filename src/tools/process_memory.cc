#include "tools/process_memory.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "strata/mlp_kernels.h"
#include "strata/units.h"
#include "tools/step_traffic.h"

namespace strata::tools {

uint64_t PeakRssBytes() {
  // VmHWM, which ResetPeakRss can lower; getrusage's maximum never falls.
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    unsigned long long kib = 0;
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f) != nullptr)
      found = std::sscanf(line, "VmHWM: %llu kB", &kib) == 1;
    std::fclose(f);
    if (found) return kib * 1024;
  }
  struct rusage ru {};
  return getrusage(RUSAGE_SELF, &ru) == 0 ? static_cast<uint64_t>(ru.ru_maxrss) * 1024 : 0;
}

bool ResetPeakRss() {
  FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

uint64_t CurrentRssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE)) : 0;
}

CodeResidency ReadCodeResidency() {
  CodeResidency r;
  struct stat exe {};
  FILE* f = std::fopen("/proc/self/smaps", "r");
  if (stat("/proc/self/exe", &exe) != 0 || f == nullptr) {
    if (f != nullptr) std::fclose(f);
    return r;
  }
  char line[4352];
  bool code = false, own = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long v = 0, inode = 0;
    unsigned dev_major = 0, dev_minor = 0;
    char perms[8] = {};
    // A mapping's header: "start-end perms offset major:minor inode [path]".
    if (std::sscanf(line, "%*[0-9a-f]-%*[0-9a-f] %7s %*s %x:%x %llu", perms, &dev_major, &dev_minor,
                    &inode) == 4 &&
        std::strlen(perms) == 4) {
      code = perms[2] == 'x';
      own = inode == exe.st_ino && dev_major == major(exe.st_dev) && dev_minor == minor(exe.st_dev);
    } else if (code && own && std::sscanf(line, "Size: %llu kB", &v) == 1) {
      r.own_bytes += v * 1024;
    } else if (code && std::sscanf(line, "Rss: %llu kB", &v) == 1) {
      (own ? r.own_resident : r.other_resident) += v * 1024;
    }
  }
  std::fclose(f);
  return r;
}

uint64_t MeasureProcessBase() {
  model::WarmMatrixProducts();
  return CurrentRssBytes() + ReadCodeResidency().own_untouched();
}

ProcessMemory EstimateProcessMemory(uint64_t base, const EngineLayoutInfo& layout, const Config& config,
                                    double activation_bytes_per_sample, int64_t micro_batch) {
  const uint64_t chunk = static_cast<uint64_t>(layout.chunk_elems);
  const uint64_t opt = config.zero.stage == 0 ? chunk : static_cast<uint64_t>(layout.shard_elems);
  ProcessMemory m;
  m.base = base;
  m.creation = chunk * (4 + ComputeBytes(config)) + 12 * opt;
  m.activations = static_cast<uint64_t>(activation_bytes_per_sample * static_cast<double>(micro_batch));
  m.activations_on_device = config.strata.device == DeviceKind::kCuda;
  return m;
}

std::string PlanMemoryText(const EngineLayoutInfo& layout, const ProcessMemory& p) {
  return "the plan: device " + FormatBytes(layout.device_need) + " + pinned host " +
         FormatBytes(layout.host_need) + " + process " + FormatBytes(p.total()) +
         " (binary, libraries and MPI " + FormatBytes(p.base) + ", creation scratch " +
         FormatBytes(p.creation) + ", activations at most " + FormatBytes(p.activations) +
         (p.activations_on_device ? " on the device, not in this total" : "") +
         (p.data > 0 ? ", data files " + FormatBytes(p.data) : "") + ")";
}

}  // namespace strata::tools
