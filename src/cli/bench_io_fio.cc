// fio as the reference for `strata bench io`: same files, block size, queue depth and
// O_DIRECT, with io_uring, fixed buffers and registered files (fio's fastest setup).
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cli/bench_io.h"
#include "strata/topology.h"

namespace strata::cli::benchio {

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kSeqRead: return "seqread";
    case Mode::kSeqWrite: return "seqwrite";
    case Mode::kRandRead: return "randread";
    case Mode::kRandWrite: return "randwrite";
  }
  return "?";
}

namespace {

const char* FioRw(Mode m) {
  switch (m) {
    case Mode::kSeqRead: return "read";
    case Mode::kSeqWrite: return "write";
    case Mode::kRandRead: return "randread";
    case Mode::kRandWrite: return "randwrite";
  }
  return "read";
}

// Runs a command, returning its stdout; `rc` gets the exit status.
std::string Capture(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    *rc = -1;
    return out;
  }
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  int st = ::pclose(p);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// The iomem_align that puts all of fio's malloc'd buffers on transparent huge pages.
// glibc.malloc.hugetlb=1 in fio's environment makes malloc advise MADV_HUGEPAGE on the
// blocks it maps, but only the 2 MiB stretches wholly inside a mapping become huge
// pages, and the kernel starts an anonymous mapping on a 2 MiB boundary only when its
// length is a multiple of 2 MiB. fio (3.x) mallocs `buffers` + 4095 + iomem_align bytes
// for O_DIRECT (its buffers start iomem_align past the first page boundary), which glibc
// maps with its header rounded up to 4 KiB: `buffers` + 8 KiB + iomem_align. Padding
// that to a multiple of 2 MiB put 34 of 34 MiB on huge pages for 32 buffers of 1 MiB,
// against 30 of 32 MiB unpadded. Another fio or glibc loses at most the two ends.
uint64_t ThpPadding(uint64_t buffers) {
  constexpr uint64_t kHuge = 2ull << 20, kOverhead = 8192;
  return (buffers + kOverhead + kHuge - 1) / kHuge * kHuge - buffers - kOverhead;
}

}  // namespace

std::string FioVersion() {
  int rc = 0;
  std::string v = Capture("fio --version 2>/dev/null", &rc);
  if (rc != 0) return "";
  while (!v.empty() && (v.back() == '\n' || v.back() == ' ')) v.pop_back();
  return v;
}

std::string HugetlbfsWithRoom(uint64_t bytes) {
  const HugePages huge = QueryHugePages();
  if (huge.free * huge.default_size_bytes < bytes) return "";
  std::ifstream mounts("/proc/mounts");
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream in(line);
    std::string dev, dir, type;
    in >> dev >> dir >> type;
    if (type == "hugetlbfs" && ::access(dir.c_str(), W_OK) == 0) return dir;
  }
  return "";
}

Figures RunFio(const FioJob& job) {
  Figures f;
  std::string files;
  for (const auto& p : job.files) {
    if (!files.empty()) files += ':';
    for (char c : p) {
      if (c == ':') files += '\\';  // fio's escape for ':' in a file name
      files += c;
    }
  }
  std::string cmd =
      "fio --name=strata-ref --output-format=json --ioengine=io_uring --fixedbufs=1 "
      "--registerfiles=1 --direct=1 --lat_percentiles=1 --thread=1 --numjobs=1 --allow_file_create=0 --rw=" +
      std::string(FioRw(job.mode)) + " --bs=" + std::to_string(job.bs) +
      " --iodepth=" + std::to_string(job.qd) + " --size=" + std::to_string(job.size * job.files.size()) +
      " --filename='" + files + "'";
  std::string huge_file;
  if (!job.hugetlbfs.empty()) {
    // fio maps its buffers from a file on hugetlbfs; the file goes with the run.
    huge_file = job.hugetlbfs + "/strata-fio-" + std::to_string(::getpid());
    cmd += " --mem=mmaphuge:'" + huge_file + "'";
  } else if (job.thp) {
    cmd = "GLIBC_TUNABLES=\"${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1\" " + cmd +
          " --iomem_align=" + std::to_string(ThpPadding(job.bs * uint64_t(job.qd)));
  }
  cmd += " 2>&1";
  int rc = 0;
  std::string out = Capture(cmd, &rc);
  if (!huge_file.empty()) {
    std::error_code ec;
    std::filesystem::remove(huge_file, ec);
  }
  size_t brace = out.find('{');
  if (rc != 0 || brace == std::string::npos) {
    f.error = "fio failed (exit " + std::to_string(rc) + "): " + out.substr(0, 300);
    return f;
  }
  try {
    auto doc = nlohmann::json::parse(out.substr(brace));
    const auto& j = doc.at("jobs").at(0);
    const auto& side = j.at(IsWrite(job.mode) ? "write" : "read");
    f.bytes_per_s = side.at("bw_bytes").get<double>();
    // Total latency (submission to completion), as strata measures it.
    const auto& lat = side.contains("lat_ns") && side.at("lat_ns").contains("percentile")
                          ? side.at("lat_ns")
                          : side.at("clat_ns");
    const auto& pct = lat.at("percentile");
    f.p50_us = pct.at("50.000000").get<double>() / 1e3;
    f.p99_us = pct.at("99.000000").get<double>() / 1e3;
    f.cpu_pct = j.at("usr_cpu").get<double>() + j.at("sys_cpu").get<double>();
    f.ran = true;
  } catch (const std::exception& e) {
    f.error = std::string("could not parse fio's JSON: ") + e.what();
  }
  return f;
}

}  // namespace strata::cli::benchio
