// One measured pass of `strata bench io` through the IoEngine, the test files it runs
// over, and the buffers it reads into and writes from.
//
// The buffers come from HostPages, the mapping the pinned host arena takes, because the
// physical layout of the buffer decides how the kernel cuts a request: on a virtio disk
// without indirect descriptors (max_segments 254, a 256-entry ring) a 1 MiB request
// over scattered 4 KiB pages is split in two and fills the whole ring, so the disk sees
// one request at a time; over huge pages it is one segment. Training reads into the host
// arena, so that is the layout worth measuring; --small-pages measures 4 KiB pages
// (fio's malloc), whose layout is whatever the page allocator hands out.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <iostream>
#include <mutex>
#include <random>

#include "cli/bench_io.h"
#include "strata/io.h"
#include "strata/units.h"

namespace strata::cli::benchio {
namespace {

using Clock = std::chrono::steady_clock;

double CpuSeconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}

}  // namespace

IoBench::~IoBench() = default;

Status IoBench::Setup() {
  STRATA_ASSIGN_OR_RETURN(pages_, HostPages::Map(buffer_bytes_, config_.huge_pages));
  STRATA_RETURN_IF_ERROR(pages_->Populate().WithContext("bench io buffers"));
  data_ = pages_->data();
  huge_page_bytes_ = pages_->HugePageBytes();
  // Written once, over resident pages: a streaming pass, not a fault per page.
  std::mt19937_64 rng(7);
  for (uint64_t i = 0; i < buffer_bytes_; i += 8) {
    uint64_t v = rng();
    std::memcpy(data_ + i, &v, 8);
  }
  for (const auto& f : files_) STRATA_RETURN_IF_ERROR(Allocate(f, false));
  // Fill the files so reads read written data and writes are overwrites.
  uint64_t fill_bs = std::min<uint64_t>(8 << 20, buffer_bytes_);
  while (per_file_ % fill_bs) fill_bs /= 2;
  auto r = Pass(Mode::kSeqWrite, fill_bs, static_cast<int>(std::min<uint64_t>(16, buffer_bytes_ / fill_bs)),
                false, nullptr);
  if (!r.ok()) return r.status().WithContext("filling the test files");
  return Sync();
}

Status IoBench::Refresh() {
  for (const auto& f : files_) STRATA_RETURN_IF_ERROR(Allocate(f, true));
  return Sync();
}

Status IoBench::Sync() {
  // O_DIRECT bypasses the guest's page cache, not the disk's (or a hypervisor's) write
  // cache: without a flush, a write pass leaves data for the device to write back while
  // the next pass (strata's or fio's) is being timed.
  for (const auto& f : files_) {
    int fd = ::open(f.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "opening " + f);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return ErrnoError(err, "fsync " + f);
  }
  return OkStatus();
}

Result<Figures> IoBench::Pass(Mode mode, uint64_t bs, int qd, bool checksum, std::string* backend) {
  IoEngineOptions eo;
  eo.backend = config_.backend == "psync"      ? IoBackendKind::kPsync
               : config_.backend == "io_uring" ? IoBackendKind::kIoUring
                                               : IoBackendKind::kAuto;
  eo.block_size = bs;
  eo.queue_depth = qd;
  eo.threads = config_.threads;
  eo.sqpoll = config_.sqpoll;

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
  const IoOp op = IsWrite(mode) ? IoOp::kWrite : IoOp::kRead;
  // Created after the state its callbacks use, so it is destroyed (and drained) first.
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> engine, IoEngine::Create(eo));
  if (backend) *backend = std::string(engine->backend_name());
  std::vector<int> ids;
  for (const auto& f : files_) {
    STRATA_ASSIGN_OR_RETURN(int id, engine->RegisterFile(f, false));
    ids.push_back(id);
  }
  IoBufferRegion region{data_, uint64_t(qd) * bs};
  Status reg = engine->RegisterBuffers({&region, 1});
  if (!reg.ok()) std::cerr << "strata: warning: " << reg.ToString() << "\n";

  auto submit = [&](int slot, uint64_t k) -> Status {
    uint64_t file = k % files_.size(), block = k / files_.size();
    if (random) {
      uint64_t r = rng();
      file = r % files_.size();
      block = (r >> 16) % per_file_blocks;
    }
    char* buf = data_ + uint64_t(slot) * bs;
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

  // Every slot is refilled as soon as its request completes, so qd requests stay queued.
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

Status IoBench::Allocate(const std::string& path, bool fresh) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "opening " + path);
  struct stat st {};
  ::fstat(fd, &st);
  Status s;
  if (fresh || uint64_t(st.st_size) != per_file_) {
    if (::ftruncate(fd, 0) != 0)
      s = ErrnoError(errno, "truncating " + path);
    else if (::fallocate(fd, 0, 0, off_t(per_file_)) != 0)
      s = ErrnoError(errno, "fallocate " + path);
  }
  ::close(fd);
  return s;
}

Figures Median(std::vector<Figures> runs) {
  Figures none;
  if (!runs.empty()) none.error = runs.front().error;
  std::erase_if(runs, [](const Figures& f) { return !f.ran; });
  if (runs.empty()) return none;
  // The run with the median bandwidth, whole, so its latency and CPU belong to it.
  std::sort(runs.begin(), runs.end(),
            [](const Figures& a, const Figures& b) { return a.bytes_per_s < b.bytes_per_s; });
  return runs[(runs.size() - 1) / 2];
}

}  // namespace strata::cli::benchio
