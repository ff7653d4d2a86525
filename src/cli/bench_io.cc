// `strata bench io`: sequential and random O_DIRECT reads and writes through the
// IoEngine over one or more files, sweeping block size and queue depth, each figure
// beside fio's (io_uring, fixed buffers, registered files) at the same block size,
// queue depth and files, measured in the same run.
#include "cli/bench_io.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "cli/table.h"
#include "strata/topology.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

using benchio::Figures;
using benchio::IoBench;
using benchio::Mode;
using nlohmann::json;

struct BenchIoOptions {
  std::vector<std::string> paths;
  std::string size = "4GiB";
  std::string bs = "1MiB,4MiB,8MiB";
  std::string qd = "8,32,64";
  std::string modes = "seqread,seqwrite,randread,randwrite";
  std::string backend = "auto";
  int threads = 1;
  bool sqpoll = false;
  bool checksum = false;
  bool vs_fio = false, no_fio = false;
  bool json = false;
  bool keep = false;
  bool small_pages = false;
  int repeat = 3;
  std::string prepare = "overwrite";  // overwrite | fresh
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string Gbps(double bps) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f", bps / 1e9);
  return b;
}
std::string Fixed(double v, int prec) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.*f", prec, v);
  return b;
}

struct Point {
  Mode mode;
  uint64_t bs;
  int qd;
  bool checksum;
  Figures strata, fio;
};

// What memory the buffers of strata and fio go on.
struct BufferPlan {
  bool small_pages = false;   // strata's on 4 KiB pages
  std::string fio_hugetlbfs;  // fio's from this hugetlbfs mount
  bool fio_thp = false;       // fio's on transparent huge pages (malloc)
};

BufferPlan PlanBuffers(const BenchIoOptions& o, bool with_fio, uint64_t buffer_bytes) {
  BufferPlan plan;
  plan.small_pages = o.small_pages;
  if (!with_fio || plan.small_pages) return plan;
  plan.fio_hugetlbfs = benchio::HugetlbfsWithRoom(buffer_bytes + (2u << 20));
  if (!plan.fio_hugetlbfs.empty()) return plan;
  const std::string thp = QueryHugePages().thp_enabled;
  if (thp == "always" || thp == "madvise") {
    plan.fio_thp = true;
    return plan;
  }
  // Where the mode gives no huge pages on advice, strata's buffers are collapsed onto
  // them as the host arena's are; fio's malloc cannot follow.
  std::fprintf(
      stderr,
      "bench io: transparent huge pages are '%s' and no hugetlbfs mount has %s of free huge pages for "
      "fio: strata's buffers go on huge pages by MADV_COLLAPSE, as the host arena's do, and fio's "
      "on 4 KiB pages. For like with like: --small-pages (both on 4 KiB pages), or mount -t "
      "hugetlbfs none /dev/hugepages; echo %llu > /proc/sys/vm/nr_hugepages.\n",
      thp.empty() ? "unavailable" : thp.c_str(), FormatBytes(buffer_bytes).c_str(),
      static_cast<unsigned long long>((buffer_bytes >> 21) + 2));
  return plan;
}

std::string PagesText(const IoBench& bench) {
  if (bench.huge_page_bytes() == bench.buffer_size()) return "2 MiB huge pages";
  if (bench.huge_page_bytes() == 0) return "4 KiB pages";
  return FormatBytes(bench.huge_page_bytes()) + " of " + FormatBytes(bench.buffer_size()) +
         " on 2 MiB huge pages";
}

void RunBenchIo(const BenchIoOptions& o) {
  auto size = ParseBytes(o.size);
  ThrowIfError(size.status());
  std::vector<uint64_t> bss;
  std::vector<int> qds;
  for (const auto& t : Split(o.bs)) {
    auto b = ParseBytes(t);
    ThrowIfError(b.status().WithContext("--bs"));
    if (*b % 4096 || *b == 0)
      ThrowIfError(InvalidArgumentError("--bs: " + t + " is not a multiple of 4 KiB"));
    bss.push_back(*b);
  }
  for (const auto& t : Split(o.qd)) qds.push_back(std::max(1, std::atoi(t.c_str())));
  std::vector<Mode> modes;
  for (const auto& t : Split(o.modes)) {
    bool found = false;
    for (Mode m : {Mode::kSeqRead, Mode::kSeqWrite, Mode::kRandRead, Mode::kRandWrite}) {
      if (t == benchio::ModeName(m)) modes.push_back(m), found = true;
    }
    if (!found)
      ThrowIfError(
          InvalidArgumentError("--mode: unknown mode " + t + " (seqread|seqwrite|randread|randwrite)"));
  }
  if (bss.empty() || qds.empty() || modes.empty())
    ThrowIfError(InvalidArgumentError("--bs, --qd and --mode need values"));
  std::vector<std::string> paths = o.paths.empty() ? std::vector<std::string>{"."} : o.paths;
  std::vector<std::string> files;
  for (const auto& p : paths) {
    files.push_back(
        std::filesystem::is_directory(p) ? p + "/strata-bench-io." + std::to_string(getpid()) + ".dat" : p);
  }
  const uint64_t max_bs = *std::max_element(bss.begin(), bss.end());
  const int max_qd = *std::max_element(qds.begin(), qds.end());
  const uint64_t per_file = *size / files.size() / max_bs * max_bs;
  if (per_file == 0)
    ThrowIfError(InvalidArgumentError("--size " + o.size + " is smaller than one block per path"));
  const std::string fio_version = o.no_fio ? "" : benchio::FioVersion();
  if (o.vs_fio && fio_version.empty())
    ThrowIfError(UnavailableError("--vs-fio: fio is not installed (apt install fio)"));
  const bool with_fio = !fio_version.empty();

  // fio and strata must read into the same kind of memory: a 1 MiB request over huge
  // pages is one segment for the disk, over scattered 4 KiB pages hundreds (a virtio disk
  // without indirect descriptors then holds one request at a time), and where 4 KiB pages
  // land is up to the page allocator. fio's buffers go on huge pages from a hugetlbfs
  // mount, else on transparent huge pages through glibc's malloc. Where the mode is
  // "never", strata's still go on huge pages (the arena's layout) and the header says
  // that fio's could not.
  const BufferPlan plan = PlanBuffers(o, with_fio, uint64_t(max_qd) * max_bs);
  benchio::PassConfig pass{o.backend, o.threads, o.sqpoll, !plan.small_pages};
  IoBench bench(pass, files, per_file, uint64_t(max_qd) * max_bs);
  auto cleanup = [&] {
    if (!o.keep) {
      for (const auto& f : files) std::filesystem::remove(f);
    }
  };
  Status st = bench.Setup();
  if (!st.ok()) {
    cleanup();
    ThrowIfError(st);
  }
  if (!plan.small_pages && bench.huge_page_bytes() < bench.buffer_size()) {
    std::fprintf(stderr, "bench io: only %s of strata's %s of buffers are on huge pages\n",
                 FormatBytes(bench.huge_page_bytes()).c_str(), FormatBytes(bench.buffer_size()).c_str());
  }
  const std::string& fio_huge = plan.fio_hugetlbfs;
  std::vector<Point> points;
  for (Mode m : modes) {
    for (uint64_t bs : bss) {
      for (int qd : qds) {
        points.push_back({m, bs, qd, false, {}, {}});
        if (o.checksum) points.push_back({m, bs, qd, true, {}, {}});
      }
    }
  }
  std::string backend;
  const bool tty = isatty(STDERR_FILENO);
  const bool fresh = o.prepare == "fresh";
  // The disk's speed drifts (other tenants, its write-back), so each point's runs (strata,
  // strata+xxh3, fio) alternate, the first of them rotating each round, and the medians
  // are compared: no runner always goes first or always follows a write.
  for (size_t i = 0; i < points.size();) {
    const size_t group = points[i].checksum || i + 1 == points.size() || !points[i + 1].checksum ? 1 : 2;
    const Point& head = points[i];
    std::fprintf(stderr, "%s[%zu/%zu] %s bs=%s qd=%d ...%s", tty ? "\r\033[K" : "", i + 1, points.size(),
                 benchio::ModeName(head.mode), FormatBytes(head.bs).c_str(), head.qd, tty ? "" : "\n");
    const size_t runners = group + (with_fio ? 1 : 0);
    std::vector<std::vector<Figures>> runs(runners);
    for (int rep = 0; rep < o.repeat; ++rep) {
      for (size_t k = 0; k < runners; ++k) {
        const size_t r = (k + size_t(rep)) % runners;
        if (benchio::IsWrite(head.mode) && fresh) st = bench.Refresh();
        Result<Figures> f = !st.ok() ? Result<Figures>(st)
                            : r < group
                                ? bench.Pass(head.mode, head.bs, head.qd, points[i + r].checksum, &backend)
                                : Result<Figures>(benchio::RunFio({files, per_file, head.mode, head.bs,
                                                                   head.qd, fio_huge, plan.fio_thp}));
        if (f.ok() && benchio::IsWrite(head.mode)) st = bench.Sync();
        if (!f.ok() || !st.ok()) {
          cleanup();
          Status bad = f.ok() ? st : f.status();
          ThrowIfError(bad.WithContext(std::string("bench io ") + benchio::ModeName(head.mode)));
        }
        runs[r].push_back(*f);
      }
    }
    for (size_t g = 0; g < group; ++g) {
      points[i + g].strata = benchio::Median(runs[g]);
      // fio has no checksum: the checksum row is compared with the same fio runs.
      if (with_fio) points[i + g].fio = benchio::Median(runs[group]);
    }
    i += group;
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  cleanup();

  auto ratio = [](const Point& p) {
    return p.fio.ran && p.fio.bytes_per_s > 0 ? p.strata.bytes_per_s / p.fio.bytes_per_s : 0.0;
  };
  if (o.json) {
    json out;
    out["backend"] = backend;
    out["files"] = files;
    out["bytes_per_file"] = per_file;
    out["prepare"] = o.prepare;
    out["huge_pages"] = bench.huge_page_bytes() == bench.buffer_size();
    out["huge_page_bytes"] = bench.huge_page_bytes();
    out["fio_buffers"] = !fio_huge.empty() ? "hugetlbfs" : plan.fio_thp ? "thp" : "4KiB";
    out["repeat"] = o.repeat;
    out["fio"] = fio_version;
    for (const auto& p : points) {
      json j{{"mode", benchio::ModeName(p.mode)},
             {"bs", p.bs},
             {"qd", p.qd},
             {"checksum", p.checksum},
             {"bytes_per_s", p.strata.bytes_per_s},
             {"p50_us", p.strata.p50_us},
             {"p99_us", p.strata.p99_us},
             {"cpu_pct", p.strata.cpu_pct}};
      if (p.fio.ran) {
        j["fio"] = {{"bytes_per_s", p.fio.bytes_per_s},
                    {"p50_us", p.fio.p50_us},
                    {"p99_us", p.fio.p99_us},
                    {"cpu_pct", p.fio.cpu_pct}};
        j["ratio"] = ratio(p);
      } else if (with_fio) {
        j["fio_error"] = p.fio.error;
      }
      out["points"].push_back(j);
    }
    std::cout << out.dump(2) << "\n";
    return;
  }
  std::cout << "strata bench io: backend " << backend << ", " << files.size() << " file(s) of "
            << FormatBytes(per_file) << ", O_DIRECT, "
            << (fresh ? "writes into fresh fallocated extents" : "overwrites") << ", buffers on "
            << PagesText(bench) << ", median of " << o.repeat << " interleaved runs"
            << "; reference: "
            << (with_fio ? fio_version + " (io_uring, fixedbufs, registerfiles, buffers on " +
                               (!fio_huge.empty() ? "huge pages from " + fio_huge + ")"
                                : plan.fio_thp    ? "transparent huge pages: glibc.malloc.hugetlb=1)"
                                                  : "4 KiB pages)")
                         : "none (fio not installed)")
            << "\n\n";
  Table t({"mode", "bs", "qd", "GB/s", "p50 us", "p99 us", "cpu %", "fio GB/s", "x fio", "fio p50", "fio p99",
           "fio cpu %"});
  for (const auto& p : points) {
    std::vector<std::string> row = {std::string(benchio::ModeName(p.mode)) + (p.checksum ? "+xxh3" : ""),
                                    FormatBytes(p.bs),
                                    std::to_string(p.qd),
                                    Gbps(p.strata.bytes_per_s),
                                    Fixed(p.strata.p50_us, 0),
                                    Fixed(p.strata.p99_us, 0),
                                    Fixed(p.strata.cpu_pct, 0)};
    if (p.fio.ran) {
      row.insert(row.end(), {Gbps(p.fio.bytes_per_s), Fixed(ratio(p), 2), Fixed(p.fio.p50_us, 0),
                             Fixed(p.fio.p99_us, 0), Fixed(p.fio.cpu_pct, 0)});
    } else {
      row.insert(row.end(), {"-", "-", "-", "-", "-"});
    }
    t.AddRow(row);
  }
  std::cout << t.Render();
  for (const auto& p : points) {
    if (with_fio && !p.fio.ran) std::cout << "fio did not run: " << p.fio.error << "\n";
  }
}

}  // namespace

void AddBenchIoCommand(CLI::App& bench) {
  auto o = std::make_shared<BenchIoOptions>();
  auto* cmd = bench.add_subcommand("io", "NVMe I/O bandwidth and latency through the IoEngine, beside fio's");
  cmd->add_option("--path", o->paths,
                  "file or directory to test (repeat or list for several; striped over them)")
      ->delimiter(',');
  cmd->add_option("--size", o->size, "bytes in total over the paths (default 4GiB)");
  cmd->add_option("--bs", o->bs, "block sizes to sweep, comma-separated (default 1MiB,4MiB,8MiB)");
  cmd->add_option("--qd", o->qd, "queue depths to sweep, comma-separated (default 8,32,64)");
  cmd->add_option("--mode", o->modes, "seqread,seqwrite,randread,randwrite (default all)");
  cmd->add_option("--backend", o->backend, "auto|io_uring|psync (default auto)")
      ->check(CLI::IsMember({"auto", "io_uring", "psync"}));
  cmd->add_option("--threads", o->threads, "I/O threads (rings) (default 1)");
  cmd->add_flag("--sqpoll", o->sqpoll, "use a kernel submission-polling thread per ring");
  cmd->add_flag("--checksum", o->checksum, "also run each point hashing every block with XXH3 (its cost)");
  cmd->add_flag("--vs-fio", o->vs_fio, "compare with fio at each point (default when fio is installed)");
  cmd->add_flag("--no-fio", o->no_fio, "do not run fio");
  cmd->add_option("--prepare", o->prepare,
                  "overwrite: writes go over written data (default); fresh: into freshly fallocated extents")
      ->check(CLI::IsMember({"overwrite", "fresh"}));
  cmd->add_option("--repeat", o->repeat,
                  "runs of each point, strata and fio interleaved; medians shown (default 3)")
      ->check(CLI::Range(1, 100));
  cmd->add_flag("--small-pages", o->small_pages,
                "buffers of strata and fio on 4 KiB pages instead of huge pages (as the host arena's)");
  cmd->add_flag("--keep", o->keep, "keep the test files");
  cmd->add_flag("--json", o->json, "print JSON instead of a table");
  cmd->callback([o] { RunBenchIo(*o); });
}

}  // namespace strata::cli
