// `strata bench pcie`: host<->device copy bandwidth over the device seam, with pinned
// (the host arena) and pageable host memory, one direction on one stream and both
// directions at once on two streams; each figure beside the limit measured in the same
// run: a plain synchronous copy loop between pinned buffers (cudaMemcpy on cuda,
// memcpy on sim) of the same size.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/table.h"
#include "strata/device.h"
#include "strata/host_arena.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct PcieOptions {
  std::string device = "auto";
  bool quick = false;
  bool json = false;
  double min_seconds = 0;  // per measurement; 0: 0.1 (0.02 with --quick)
  std::string max_size;    // cap on the sweep, e.g. "256MiB"
};

struct Row {
  uint64_t size = 0;
  std::string host_memory;  // pinned | pageable
  std::string direction;    // H2D | D2H | both
  int streams = 1;
  double bw = 0;     // bytes per second (both: the sum of the two directions)
  double limit = 0;  // bytes per second of the plain copy loop (both: the sum)
  uint64_t iterations = 0;
  double seconds = 0;
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
uint64_t AvailableMemory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

class PcieBench {
 public:
  PcieBench(Device& dev, StreamId a, StreamId b, double min_seconds)
      : dev_(dev), a_(a), b_(b), min_seconds_(min_seconds) {}

  // How many copies of `size` fill min_seconds, from one timed synchronous copy.
  uint64_t Iterations(void* dst, const void* src, uint64_t size, CopyDir dir) {
    auto t0 = Clock::now();
    ThrowIfError(dev_.CopySync(dst, src, size, dir));
    double one = std::max(Seconds(t0, Clock::now()), 1e-7);
    return std::clamp<uint64_t>(static_cast<uint64_t>(min_seconds_ / one), 3, 100000);
  }

  // The limit: a plain synchronous copy loop on the calling thread.
  double SyncLoop(void* dst, const void* src, uint64_t size, CopyDir dir, uint64_t n) {
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) ThrowIfError(dev_.CopySync(dst, src, size, dir));
    return static_cast<double>(n * size) / Seconds(t0, Clock::now());
  }

  // n asynchronous copies on one stream, then a synchronize.
  double OneStream(void* dst, const void* src, uint64_t size, CopyDir dir, uint64_t n, double* secs) {
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) ThrowIfError(dev_.CopyAsync(a_, dst, src, size, dir));
    ThrowIfError(dev_.Synchronize(a_));
    *secs = Seconds(t0, Clock::now());
    return static_cast<double>(n * size) / *secs;
  }

  // n H2D copies on stream a and n D2H copies on stream b at once; the sum of both.
  double BothStreams(void* dev_in, const void* host_in, void* host_out, const void* dev_out, uint64_t size,
                     uint64_t n, double* secs) {
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < n; ++i) {
      ThrowIfError(dev_.CopyAsync(a_, dev_in, host_in, size, CopyDir::kHostToDevice));
      ThrowIfError(dev_.CopyAsync(b_, host_out, dev_out, size, CopyDir::kDeviceToHost));
    }
    ThrowIfError(dev_.Synchronize(a_));
    ThrowIfError(dev_.Synchronize(b_));
    *secs = Seconds(t0, Clock::now());
    return static_cast<double>(2 * n * size) / *secs;
  }

 private:
  Device& dev_;
  StreamId a_, b_;
  double min_seconds_;
};

void RunPcie(const PcieOptions& o) {
  DeviceOptions dopt;
  if (o.device == "sim") {
    dopt.kind = DeviceKind::kSim;
  } else if (o.device == "cuda") {
    dopt.kind = DeviceKind::kCuda;
  } else if (o.device != "auto") {
    ThrowIfError(InvalidArgumentError("--device: expected one of auto|sim|cuda, got \"" + o.device + "\""));
  }

  std::vector<uint64_t> sizes = o.quick ? std::vector<uint64_t>{64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB}
                                        : std::vector<uint64_t>{64 * KiB, 256 * KiB, 1 * MiB,   4 * MiB,
                                                                16 * MiB, 64 * MiB,  256 * MiB, 1 * GiB};
  if (!o.max_size.empty()) {
    Result<uint64_t> cap = ParseBytes(o.max_size);
    ThrowIfError(cap.status());
    std::erase_if(sizes, [&](uint64_t s) { return s > *cap; });
    if (sizes.empty())
      ThrowIfError(InvalidArgumentError("--max-size " + o.max_size + " is below the smallest size, 64 KiB"));
  }
  // Two device buffers, two pinned and two pageable host buffers of the largest size;
  // on sim all six are host memory. Keep within half of what is available.
  std::vector<std::string> notes;
  uint64_t avail = AvailableMemory();
  while (sizes.size() > 1 && avail != 0 && 6 * sizes.back() > avail / 2) {
    notes.push_back("skipped " + FormatBytes(sizes.back()) + ": not enough free host memory for its buffers");
    sizes.pop_back();
  }
  uint64_t max = sizes.back();

  // The sim device's capacity only needs to hold the two device buffers.
  if (dopt.kind != DeviceKind::kCuda) dopt.capacity = std::max<uint64_t>(2 * max, kDefaultSimCapacity / 8);
  Result<std::unique_ptr<Device>> created = CreateDevice(dopt);
  ThrowIfError(created.status());
  Device& dev = **created;

  HostArenaOptions aopt;
  aopt.bytes = 2 * max;
  aopt.pinning = dev.kind() == DeviceKind::kCuda ? HostPinning::kCuda : HostPinning::kMlock;
  Result<std::unique_ptr<HostArena>> arena = HostArena::Create(aopt);
  ThrowIfError(arena.status());
  Result<HostBlock> pin_in_r = (*arena)->Allocate(max), pin_out_r = (*arena)->Allocate(max);
  ThrowIfError(pin_in_r.status());
  ThrowIfError(pin_out_r.status());
  HostBlock pin_in = *pin_in_r, pin_out = *pin_out_r;
  // Pageable memory, touched once so that first-touch faults stay out of the figures.
  std::unique_ptr<uint8_t[]> page_in(new uint8_t[max]), page_out(new uint8_t[max]);
  std::memset(page_in.get(), 1, max);
  std::memset(page_out.get(), 2, max);
  std::memset(pin_in.data, 3, max);

  Result<void*> dev_in = dev.Allocate(max), dev_out = dev.Allocate(max);
  ThrowIfError(dev_in.status());
  ThrowIfError(dev_out.status());
  Result<StreamId> a = dev.CreateStream("h2d"), b = dev.CreateStream("d2h");
  ThrowIfError(a.status());
  ThrowIfError(b.status());
  // Touch the device buffers (first use on sim faults their pages in).
  ThrowIfError(dev.CopySync(*dev_in, pin_in.data, max, CopyDir::kHostToDevice));
  ThrowIfError(dev.CopySync(*dev_out, pin_in.data, max, CopyDir::kHostToDevice));

  double min_seconds = o.min_seconds > 0 ? o.min_seconds : (o.quick ? 0.02 : 0.1);
  PcieBench bench(dev, *a, *b, min_seconds);
  std::vector<Row> rows;
  for (uint64_t size : sizes) {
    uint64_t n_h2d = bench.Iterations(*dev_in, pin_in.data, size, CopyDir::kHostToDevice);
    uint64_t n_d2h = bench.Iterations(pin_out.data, *dev_out, size, CopyDir::kDeviceToHost);
    double lim_h2d = bench.SyncLoop(*dev_in, pin_in.data, size, CopyDir::kHostToDevice, n_h2d);
    double lim_d2h = bench.SyncLoop(pin_out.data, *dev_out, size, CopyDir::kDeviceToHost, n_d2h);
    for (bool pinned : {true, false}) {
      void* host_in = pinned ? pin_in.data : page_in.get();
      void* host_out = pinned ? pin_out.data : page_out.get();
      std::string mem = pinned ? "pinned" : "pageable";
      Row r{size, mem, "H2D", 1, 0, lim_h2d, n_h2d, 0};
      r.bw = bench.OneStream(*dev_in, host_in, size, CopyDir::kHostToDevice, n_h2d, &r.seconds);
      rows.push_back(r);
      r = Row{size, mem, "D2H", 1, 0, lim_d2h, n_d2h, 0};
      r.bw = bench.OneStream(host_out, *dev_out, size, CopyDir::kDeviceToHost, n_d2h, &r.seconds);
      rows.push_back(r);
      uint64_t n = std::min(n_h2d, n_d2h);
      r = Row{size, mem, "both", 2, 0, lim_h2d + lim_d2h, n, 0};
      r.bw = bench.BothStreams(*dev_in, host_in, host_out, *dev_out, size, n, &r.seconds);
      rows.push_back(r);
    }
  }
  dev.Free(*dev_in);
  dev.Free(*dev_out);

  std::string limit_method = dev.kind() == DeviceKind::kCuda
                                 ? "cudaMemcpy loop between pinned buffers (the copy-engine peak)"
                                 : "memcpy loop between the same buffers on one thread";
  if (o.json) {
    json j = {{"benchmark", "pcie"},
              {"device", dev.name()},
              {"device_kind", std::string(DeviceKindName(dev.kind()))},
              {"pinning", std::string(HostPinningName((*arena)->pinning()))},
              {"limit_method", limit_method},
              {"min_seconds_per_figure", min_seconds},
              {"notes", notes}};
    j["rows"] = json::array();
    for (const Row& r : rows) {
      j["rows"].push_back({{"size_bytes", r.size},
                           {"host_memory", r.host_memory},
                           {"direction", r.direction},
                           {"streams", r.streams},
                           {"bytes_per_second", r.bw},
                           {"limit_bytes_per_second", r.limit},
                           {"ratio", r.limit > 0 ? r.bw / r.limit : 0.0},
                           {"iterations", r.iterations},
                           {"seconds", r.seconds}});
    }
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf("strata bench pcie: %s, host memory pinned by %s\n", dev.name().c_str(),
              std::string(HostPinningName((*arena)->pinning())).c_str());
  std::printf("limit: %s, same size; \"both\" = H2D and D2H at once on two streams, summed\n\n",
              limit_method.c_str());
  Table t({"size", "host", "direction", "streams", "bandwidth", "limit", "ratio"});
  for (const Row& r : rows) {
    char ratio[16];
    std::snprintf(ratio, sizeof ratio, "%.2f", r.limit > 0 ? r.bw / r.limit : 0.0);
    t.AddRow({FormatBytes(r.size), r.host_memory, r.direction, std::to_string(r.streams), FormatRate(r.bw),
              FormatRate(r.limit), ratio});
  }
  std::fputs(t.Render().c_str(), stdout);
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
}

}  // namespace

void AddBenchPcieCommand(CLI::App& bench) {
  auto opts = std::make_shared<PcieOptions>();
  auto* cmd = bench.add_subcommand(
      "pcie", "host<->device copy bandwidth, pinned and pageable, beside the plain-copy limit");
  cmd->add_option("--device", opts->device, "auto|sim|cuda (auto: cuda where a GPU is present)")
      ->check(CLI::IsMember({"auto", "sim", "cuda"}));
  cmd->add_flag("--quick", opts->quick, "a short sweep (64 KiB to 64 MiB, shorter timing) for scripts");
  cmd->add_flag("--json", opts->json, "print JSON instead of a table");
  cmd->add_option("--min-seconds", opts->min_seconds, "time per figure (default 0.1, 0.02 with --quick)");
  cmd->add_option("--max-size", opts->max_size,
                  "largest copy size in the sweep (default 1GiB; --quick 64MiB)");
  cmd->callback([opts] { RunPcie(*opts); });
}

}  // namespace strata::cli
