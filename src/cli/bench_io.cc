// `strata bench io`: sequential and random O_DIRECT reads and writes through the
// IoEngine over one or more files, sweeping block size and queue depth, each figure
// beside fio's (io_uring, fixed buffers, registered files) at the same block size,
// queue depth and files, measured in the same run.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli/bench_io.h"
#include "cli/commands.h"
#include "cli/table.h"
#include "strata/io.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

using benchio::Figures;
using benchio::Mode;
using Clock = std::chrono::steady_clock;
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

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

class IoBench {
 public:
  IoBench(const BenchIoOptions& o, std::vector<std::string> files, uint64_t per_file, uint64_t arena_bytes)
      : o_(o), files_(std::move(files)), per_file_(per_file), arena_bytes_(arena_bytes) {}
  ~IoBench() { std::free(arena_); }

  Status Setup() {
    arena_ = static_cast<char*>(std::aligned_alloc(2 << 20, arena_bytes_));
    if (arena_ == nullptr) return ResourceExhaustedError("bench io: cannot allocate " + FormatBytes(arena_bytes_));
    if (std::getenv("STRATA_THP")) madvise(arena_, arena_bytes_, MADV_HUGEPAGE);  // DIAG
    std::mt19937_64 rng(7);
    for (uint64_t i = 0; i < arena_bytes_; i += 8) {
      uint64_t v = rng();
      std::memcpy(arena_ + i, &v, 8);
    }
    for (const auto& f : files_) STRATA_RETURN_IF_ERROR(Allocate(f, false));
    // Fill the files so reads read written data and writes are overwrites.
    if (std::getenv("STRATA_NOFILL")) return OkStatus();  // DIAG
    uint64_t fill_bs = std::min<uint64_t>(8 << 20, arena_bytes_);
    while (per_file_ % fill_bs) fill_bs /= 2;
    auto r = Pass(Mode::kSeqWrite, fill_bs, static_cast<int>(std::min<uint64_t>(16, arena_bytes_ / fill_bs)), false, nullptr);
    return r.ok() ? OkStatus() : r.status().WithContext("filling the test files");
  }

  // Re-creates the files' extents as fresh fallocated (unwritten) space.
  Status Refresh() {
    for (const auto& f : files_) STRATA_RETURN_IF_ERROR(Allocate(f, true));
    return OkStatus();
  }

  Result<Figures> Pass(Mode mode, uint64_t bs, int qd, bool checksum, std::string* backend) {
    IoEngineOptions eo;
    eo.backend = o_.backend == "psync" ? IoBackendKind::kPsync
                 : o_.backend == "io_uring" ? IoBackendKind::kIoUring : IoBackendKind::kAuto;
    eo.block_size = bs;
    eo.queue_depth = qd;
    eo.threads = o_.threads;
    eo.sqpoll = o_.sqpoll;

    const uint64_t per_file_blocks = per_file_ / bs;
    const uint64_t total = per_file_blocks * files_.size();
    std::vector<float> lat(total);
    std::vector<Clock::time_point> t0(qd);
    std::vector<uint64_t> req_of_slot(qd);
    std::mutex mu;
    std::condition_variable cv;
    std::vector<int> done;
    done.reserve(qd);
    Status failure;
    std::atomic<uint64_t> sink{0};
    std::mt19937_64 rng(99);
    const bool random = mode == Mode::kRandRead || mode == Mode::kRandWrite;
    const IoOp op = benchio::IsWrite(mode) ? IoOp::kWrite : IoOp::kRead;
    // Created after the state its callbacks use, so it is destroyed (and drained) first.
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::Create(eo));
    if (backend) *backend = std::string(engine->backend_name());
    std::vector<int> ids;
    for (const auto& f : files_) {
      STRATA_ASSIGN_OR_RETURN(int id, engine->RegisterFile(f, false));
      ids.push_back(id);
    }
    std::vector<IoBufferRegion> regions{{arena_, uint64_t(qd) * bs}};
    if (std::getenv("STRATA_PERSLOT")) {  // DIAG
      regions.clear();
      for (int s = 0; s < qd; ++s) regions.push_back({arena_ + uint64_t(s) * bs, bs});
    }
    Status reg = engine->RegisterBuffers(regions);
    if (!reg.ok()) std::cerr << "strata: warning: " << reg.ToString() << "\n";

    auto submit = [&](int slot, uint64_t k) -> Status {
      uint64_t file = k % files_.size(), block = k / files_.size();
      if (random) {
        uint64_t r = rng();
        file = r % files_.size();
        block = (r >> 16) % per_file_blocks;
      }
      char* buf = arena_ + uint64_t(slot) * bs;
      req_of_slot[slot] = k;
      t0[slot] = Clock::now();
      IoRequest req{op, ids[file], block * bs, bs, buf};
      auto h = engine->Submit({&req, 1}, [&, slot, buf](size_t, const Status& st) {
        if (checksum && st.ok()) sink.fetch_xor(XXH3_64bits(buf, bs), std::memory_order_relaxed);
        auto now = Clock::now();
        std::lock_guard<std::mutex> lock(mu);
        lat[req_of_slot[slot]] = std::chrono::duration<float, std::micro>(now - t0[slot]).count();
        if (!st.ok() && failure.ok()) failure = st;
        done.push_back(slot);
        cv.notify_one();
        return OkStatus();
      });
      return h.status();
    };

    const double cpu0 = CpuSeconds();
    const auto start = Clock::now();
    uint64_t next = 0, completed = 0;
    for (int s = 0; s < qd && next < total; ++s) STRATA_RETURN_IF_ERROR(submit(s, next++));
    std::vector<int> ready;
    while (completed < total) {
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return !done.empty(); });
        ready.swap(done);
        if (!failure.ok()) return failure;
      }
      for (int s : ready) {
        ++completed;
        if (next < total) STRATA_RETURN_IF_ERROR(submit(s, next++));
      }
      ready.clear();
    }
    const double wall = std::chrono::duration<double>(Clock::now() - start).count();
    const double cpu = CpuSeconds() - cpu0;
    engine.reset();
    std::sort(lat.begin(), lat.end());
    Figures f;
    f.ran = true;
    f.bytes_per_s = double(total * bs) / wall;
    f.p50_us = lat[total / 2];
    f.p99_us = lat[std::min<uint64_t>(total - 1, total * 99 / 100)];
    f.cpu_pct = 100.0 * cpu / wall;
    if (sink.load() == 42) std::cerr << "";  // keeps the hashing observable
    return f;
  }

 private:
  Status Allocate(const std::string& path, bool fresh) {
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return ErrnoError(errno, "opening " + path);
    struct stat st {};
    ::fstat(fd, &st);
    Status s;
    if (fresh || uint64_t(st.st_size) != per_file_) {
      if (::ftruncate(fd, 0) != 0) s = ErrnoError(errno, "truncating " + path);
      else if (::fallocate(fd, 0, 0, off_t(per_file_)) != 0) s = ErrnoError(errno, "fallocate " + path);
    }
    ::close(fd);
    return s;
  }

  const BenchIoOptions& o_;
  std::vector<std::string> files_;
  uint64_t per_file_;
  uint64_t arena_bytes_;
  char* arena_ = nullptr;
};

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

void RunBenchIo(const BenchIoOptions& o) {
  auto size = ParseBytes(o.size);
  ThrowIfError(size.status());
  std::vector<uint64_t> bss;
  std::vector<int> qds;
  for (const auto& t : Split(o.bs)) {
    auto b = ParseBytes(t);
    ThrowIfError(b.status().WithContext("--bs"));
    if (*b % 4096 || *b == 0) ThrowIfError(InvalidArgumentError("--bs: " + t + " is not a multiple of 4 KiB"));
    bss.push_back(*b);
  }
  for (const auto& t : Split(o.qd)) qds.push_back(std::max(1, std::atoi(t.c_str())));
  std::vector<Mode> modes;
  for (const auto& t : Split(o.modes)) {
    bool found = false;
    for (Mode m : {Mode::kSeqRead, Mode::kSeqWrite, Mode::kRandRead, Mode::kRandWrite}) {
      if (t == benchio::ModeName(m)) modes.push_back(m), found = true;
    }
    if (!found) ThrowIfError(InvalidArgumentError("--mode: unknown mode " + t + " (seqread|seqwrite|randread|randwrite)"));
  }
  if (bss.empty() || qds.empty() || modes.empty()) ThrowIfError(InvalidArgumentError("--bs, --qd and --mode need values"));
  std::vector<std::string> paths = o.paths.empty() ? std::vector<std::string>{"."} : o.paths;
  std::vector<std::string> files;
  for (const auto& p : paths) {
    files.push_back(std::filesystem::is_directory(p) ? p + "/strata-bench-io." + std::to_string(getpid()) + ".dat" : p);
  }
  const uint64_t max_bs = *std::max_element(bss.begin(), bss.end());
  const int max_qd = *std::max_element(qds.begin(), qds.end());
  const uint64_t per_file = *size / files.size() / max_bs * max_bs;
  if (per_file == 0) ThrowIfError(InvalidArgumentError("--size " + o.size + " is smaller than one block per path"));
  const std::string fio_version = o.no_fio ? "" : benchio::FioVersion();
  if (o.vs_fio && fio_version.empty()) ThrowIfError(UnavailableError("--vs-fio: fio is not installed (apt install fio)"));
  const bool with_fio = !fio_version.empty();

  IoBench bench(o, files, per_file, uint64_t(max_qd) * max_bs);
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
  for (size_t i = 0; i < points.size(); ++i) {
    Point& p = points[i];
    std::fprintf(stderr, "%s[%zu/%zu] %s%s bs=%s qd=%d ...%s", tty ? "\r\033[K" : "", i + 1, points.size(),
                 benchio::ModeName(p.mode), p.checksum ? "+xxh3" : "", FormatBytes(p.bs).c_str(), p.qd,
                 tty ? "" : "\n");
    if (benchio::IsWrite(p.mode) && o.prepare == "fresh") st = bench.Refresh();
    auto f = st.ok() ? bench.Pass(p.mode, p.bs, p.qd, p.checksum, &backend) : Result<Figures>(st);
    if (!f.ok()) {
      cleanup();
      ThrowIfError(f.status().WithContext(std::string("bench io ") + benchio::ModeName(p.mode)));
    }
    p.strata = *f;
    // fio at the same point; the checksum row is compared with the plain fio figure.
    if (with_fio) {
      if (p.checksum && i > 0 && !points[i - 1].checksum) {
        p.fio = points[i - 1].fio;
      } else {
        if (benchio::IsWrite(p.mode) && o.prepare == "fresh") st = bench.Refresh();
        p.fio = benchio::RunFio({files, per_file, p.mode, p.bs, p.qd});
      }
    }
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  cleanup();

  auto ratio = [](const Point& p) { return p.fio.ran && p.fio.bytes_per_s > 0 ? p.strata.bytes_per_s / p.fio.bytes_per_s : 0.0; };
  if (o.json) {
    json out;
    out["backend"] = backend;
    out["files"] = files;
    out["bytes_per_file"] = per_file;
    out["prepare"] = o.prepare;
    out["fio"] = fio_version;
    for (const auto& p : points) {
      json j{{"mode", benchio::ModeName(p.mode)}, {"bs", p.bs}, {"qd", p.qd}, {"checksum", p.checksum},
             {"bytes_per_s", p.strata.bytes_per_s}, {"p50_us", p.strata.p50_us}, {"p99_us", p.strata.p99_us},
             {"cpu_pct", p.strata.cpu_pct}};
      if (p.fio.ran) {
        j["fio"] = {{"bytes_per_s", p.fio.bytes_per_s}, {"p50_us", p.fio.p50_us}, {"p99_us", p.fio.p99_us},
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
            << FormatBytes(per_file) << ", O_DIRECT, " << (o.prepare == "fresh" ? "writes into fresh fallocated extents" : "overwrites")
            << "; reference: " << (with_fio ? fio_version + " (io_uring, fixedbufs, registerfiles)" : "none (fio not installed)")
            << "\n\n";
  Table t({"mode", "bs", "qd", "GB/s", "p50 us", "p99 us", "cpu %", "fio GB/s", "x fio", "fio p50", "fio p99", "fio cpu %"});
  for (const auto& p : points) {
    std::vector<std::string> row = {std::string(benchio::ModeName(p.mode)) + (p.checksum ? "+xxh3" : ""),
                                    FormatBytes(p.bs), std::to_string(p.qd), Gbps(p.strata.bytes_per_s),
                                    Fixed(p.strata.p50_us, 0), Fixed(p.strata.p99_us, 0), Fixed(p.strata.cpu_pct, 0)};
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
  cmd->add_option("--path", o->paths, "file or directory to test (repeat or list for several; striped over them)")
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
  cmd->add_flag("--keep", o->keep, "keep the test files");
  cmd->add_flag("--json", o->json, "print JSON instead of a table");
  cmd->callback([o] { RunBenchIo(*o); });
}

}  // namespace strata::cli
