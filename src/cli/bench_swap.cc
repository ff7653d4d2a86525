// `strata bench swap`: an NVMe swap experiment. A layered model's 16-bit parameters live
// on NVMe, in chunks; each step sweeps forward (read every chunk on the device) and
// backward (read and update every chunk), with a fixed compute time per chunk. The tier
// manager moves chunks NVMe -> host -> device and back under the given budgets. Reported
// per policy (LRU and trace side by side): step time, stall (time the "compute" waited on
// acquire), bytes per link, each lane's busy time, the lane bound (the busiest lane,
// compute included) and step / bound. The first step is the warm-up (and the trace
// policy's recording step) and is not counted.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli/commands.h"
#include "cli/table.h"
#include "strata/device.h"
#include "strata/host_arena.h"
#include "strata/io.h"
#include "strata/tier.h"
#include "strata/timeline.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct SwapOptions {
  std::string params = "128M";       // parameters (count)
  std::string chunk_size = "16MiB";  // bytes of the 16-bit plane per chunk
  std::string device_budget = "0";   // 0: a quarter of the model
  std::string host_budget = "0";     // 0: a quarter of the model
  double compute_ms = 8;             // forward compute per chunk; backward is 2x
  int steps = 4;
  int lru_prefetch = 2;              // LRU: explicit prefetch of the next k chunks
  std::string policy = "both";       // lru | trace | both
  std::string device = "auto";
  std::vector<std::string> swap_paths;
  std::string trace_file;
  bool json = false;
};

struct LaneResult {
  std::string name;
  double busy_s = 0;
  uint64_t bytes = 0;
};

struct PolicyResult {
  std::string policy;
  double step_s = 0;
  double stall_s = 0;         // blocked in BlockHandle::Wait()
  double acquire_call_s = 0;  // inside Acquire() itself (scheduling, lock)
  double compute_s = 0;
  double bound_s = 0;
  std::string bound_lane;
  std::vector<LaneResult> lanes;  // per step
  uint64_t prefetches = 0;
  uint64_t evictions = 0;
  uint64_t writebacks = 0;
  std::array<uint64_t, kNumTiers> high_water{};
};

Result<uint64_t> Bytes(const std::string& text, const char* flag) {
  Result<uint64_t> r = ParseBytes(text);
  if (!r.ok()) return InvalidArgumentError(std::string(flag) + ": " + r.status().message());
  return r;
}

std::string TraceName(const std::string& base, const std::string& policy, bool several) {
  if (!several) return base;
  auto dot = base.rfind('.');
  if (dot == std::string::npos || dot < base.rfind('/') + 1) return base + "." + policy;
  return base.substr(0, dot) + "." + policy + base.substr(dot);
}

Result<PolicyResult> RunPolicy(const SwapOptions& o, TierPolicy policy, Device& device, HostArena& arena,
                               IoEngine& engine, const ChunkLayout& layout, uint64_t device_budget,
                               uint64_t host_budget, const std::string& trace_file) {
  Timeline timeline(!trace_file.empty());
  TierManagerOptions t;
  t.layout = layout;
  t.planes = {{"param16", 2}};
  t.policy = policy;
  t.device = &device;
  t.host_arena = &arena;
  t.io_engine = &engine;
  t.nvme_paths = o.swap_paths;
  t.nvme_name = "strata-bench-swap-" + std::to_string(getpid());
  const uint64_t block = layout.chunk_elements() * 2;
  t.budgets = {device_budget, host_budget, 2 * block * layout.num_chunks()};
  t.nvme_slot_bytes = std::min<uint64_t>(block, 4 * MiB);
  t.timeline = &timeline;
  t.max_prefetch_moves = 4;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<TierManager> tm, TierManager::Create(std::move(t)));
  const uint32_t n = layout.num_chunks();
  for (uint32_t c = 0; c < n; ++c) STRATA_RETURN_IF_ERROR(tm->Register(BlockId{c, 0, kWholeChunk}, Tier::kNvme));
  const int compute = timeline.AddTrack("compute");
  const auto fwd = std::chrono::duration<double, std::milli>(o.compute_ms);
  const auto bwd = 2 * fwd;

  PolicyResult r;
  r.policy = std::string(TierPolicyName(policy));
  double step_sum = 0, stall_sum = 0, compute_sum = 0, call_s = 0;
  std::vector<LaneResult> lane_sum(kNumLanes);
  for (int step = 0; step < o.steps; ++step) {
    if (step == 1) {
      STRATA_RETURN_IF_ERROR(tm->WaitAll());
      tm->ResetTelemetry();
      timeline.Clear();
    }
    auto step_begin = Clock::now();
    tm->BeginStep();
    double compute_s = 0;
    for (int i = 0; i < 2 * static_cast<int>(n); ++i) {
      bool backward = i >= static_cast<int>(n);
      uint32_t c = backward ? static_cast<uint32_t>(2 * static_cast<int>(n) - 1 - i) : static_cast<uint32_t>(i);
      auto acquire_begin = Clock::now();
      STRATA_ASSIGN_OR_RETURN(BlockHandle h, tm->Acquire(BlockId{c, 0, kWholeChunk}, Tier::kDevice,
                                                         backward ? Access::kReadWrite : Access::kRead,
                                                         backward ? "backward" : "forward"));
      if (policy == TierPolicy::kLru && o.lru_prefetch > 0) {
        std::vector<PrefetchRequest> next;
        for (int k = 1; k <= o.lru_prefetch; ++k) {
          int j = i + k;
          if (j >= 2 * static_cast<int>(n)) break;
          uint32_t cj = j >= static_cast<int>(n) ? static_cast<uint32_t>(2 * static_cast<int>(n) - 1 - j)
                                                  : static_cast<uint32_t>(j);
          next.push_back(PrefetchRequest{BlockId{cj, 0, kWholeChunk}, Tier::kDevice});
        }
        STRATA_RETURN_IF_ERROR(tm->Prefetch(next));
      }
      auto wait_begin = Clock::now();
      STRATA_RETURN_IF_ERROR(h.Wait());
      auto begin = Clock::now();
      if (step >= 1) {
        call_s += std::chrono::duration<double>(wait_begin - acquire_begin).count();
      }
      std::this_thread::sleep_for(backward ? bwd : fwd);  // the layer's compute
      auto end = Clock::now();
      compute_s += std::chrono::duration<double>(end - begin).count();
      timeline.Record(compute, (backward ? "bwd c" : "fwd c") + std::to_string(c), begin, end);
      h.Release();
    }
    double step_s = std::chrono::duration<double>(Clock::now() - step_begin).count();
    if (step >= 1) {
      step_sum += step_s;
      compute_sum += compute_s;
    }
  }
  STRATA_RETURN_IF_ERROR(tm->WaitAll());
  const double measured = std::max(1, o.steps - 1);
  TierTelemetry tel = tm->Telemetry();
  stall_sum = tel.stall_s;
  r.step_s = step_sum / measured;
  r.acquire_call_s = call_s / measured;
  r.stall_s = stall_sum / measured;
  r.compute_s = compute_sum / measured;
  r.bound_s = r.compute_s;
  r.bound_lane = "compute";
  for (int l = 0; l < kNumLanes; ++l) {
    const LaneTelemetry& lt = tel.lanes[static_cast<size_t>(l)];
    LaneResult lr{lt.name, lt.busy_s / measured, static_cast<uint64_t>(static_cast<double>(lt.bytes) / measured)};
    if (lr.busy_s > r.bound_s) {
      r.bound_s = lr.busy_s;
      r.bound_lane = lr.name;
    }
    r.lanes.push_back(lr);
  }
  r.prefetches = tel.prefetches_issued;
  r.evictions = tel.evictions;
  r.writebacks = tel.writebacks;
  r.high_water = tel.high_water;
  if (!trace_file.empty()) STRATA_RETURN_IF_ERROR(timeline.WriteChromeTrace(trace_file));
  return r;
}

void Run(const SwapOptions& o) {
  Result<uint64_t> params = ParseCount(o.params);
  if (!params.ok()) throw CliError(InvalidArgumentError("--params: " + params.status().message()));
  uint64_t chunk_bytes = Bytes(o.chunk_size, "--chunk-size").value();
  auto layout_r = ChunkLayout::FromChunkBytes(*params, chunk_bytes);
  if (!layout_r.ok()) throw CliError(layout_r.status());
  ChunkLayout layout = *layout_r;
  const uint64_t block = layout.chunk_elements() * 2;
  const uint64_t model = block * layout.num_chunks();
  uint64_t device_budget = Bytes(o.device_budget, "--device-budget").value();
  uint64_t host_budget = Bytes(o.host_budget, "--host-budget").value();
  if (device_budget == 0) device_budget = std::max<uint64_t>(model / 4, 2 * block);
  if (host_budget == 0) host_budget = std::max<uint64_t>(model / 4, 2 * block);
  if (o.steps < 2) throw CliError(InvalidArgumentError("--steps must be >= 2 (the first step is warm-up)"));

  DeviceOptions dopt;
  dopt.kind = o.device == "cuda" ? DeviceKind::kCuda : o.device == "sim" ? DeviceKind::kSim : DeviceKind::kAuto;
  dopt.capacity = o.device == "cuda" ? 0 : device_budget + 64 * MiB;
  auto device = CreateDevice(dopt);
  if (!device.ok()) throw CliError(device.status());
  HostArenaOptions hopt;
  hopt.bytes = host_budget + 4 * MiB;
  auto arena = HostArena::Create(hopt);
  if (!arena.ok()) throw CliError(arena.status());
  IoEngineOptions iopt;
  iopt.queue_depth = 32;
  auto engine = IoEngine::Create(iopt);
  if (!engine.ok()) throw CliError(engine.status());
  IoBufferRegion region{(*arena)->base(), (*arena)->size()};
  Status reg = (*engine)->RegisterBuffers({&region, 1});
  if (!reg.ok()) std::fprintf(stderr, "strata: fixed buffers not registered (%s)\n", reg.ToString().c_str());

  SwapOptions opts = o;
  if (opts.swap_paths.empty()) opts.swap_paths = {std::filesystem::temp_directory_path().string()};
  std::vector<TierPolicy> policies;
  if (o.policy == "lru" || o.policy == "both") policies.push_back(TierPolicy::kLru);
  if (o.policy == "trace" || o.policy == "both") policies.push_back(TierPolicy::kTrace);
  if (policies.empty()) throw CliError(InvalidArgumentError("--policy: expected lru|trace|both, got " + o.policy));

  std::vector<PolicyResult> results;
  for (TierPolicy p : policies) {
    std::string trace = o.trace_file.empty() ? "" : TraceName(o.trace_file, std::string(TierPolicyName(p)), policies.size() > 1);
    auto r = RunPolicy(opts, p, **device, **arena, **engine, layout, device_budget, host_budget, trace);
    if (!r.ok()) throw CliError(r.status().WithContext(std::string("bench swap, ") + std::string(TierPolicyName(p))));
    results.push_back(*r);
  }

  auto lane_of = [](const PolicyResult& r, std::string_view name) {
    for (const LaneResult& l : r.lanes) {
      if (l.name == name) return l;
    }
    return LaneResult{};
  };
  if (o.json) {
    json doc;
    doc["config"] = {{"params", *params},
                     {"chunk_bytes", block},
                     {"chunks", layout.num_chunks()},
                     {"model_bytes", model},
                     {"device_budget", device_budget},
                     {"host_budget", host_budget},
                     {"compute_ms_forward", o.compute_ms},
                     {"compute_ms_backward", 2 * o.compute_ms},
                     {"steps", o.steps},
                     {"lru_prefetch", o.lru_prefetch},
                     {"device", (*device)->name()},
                     {"io_backend", std::string((*engine)->backend_name())},
                     {"swap_paths", opts.swap_paths}};
    json rows = json::array();
    for (const PolicyResult& r : results) {
      json lanes = json::object();
      for (const LaneResult& l : r.lanes) lanes[l.name] = {{"busy_s", l.busy_s}, {"bytes", l.bytes}};
      rows.push_back({{"policy", r.policy},
                      {"step_s", r.step_s},
                      {"stall_s", r.stall_s},
                      {"stall_fraction", r.step_s > 0 ? r.stall_s / r.step_s : 0},
                      {"acquire_call_s", r.acquire_call_s},
                      {"compute_s", r.compute_s},
                      {"lane_bound_s", r.bound_s},
                      {"lane_bound", r.bound_lane},
                      {"step_over_bound", r.bound_s > 0 ? r.step_s / r.bound_s : 0},
                      {"lanes", lanes},
                      {"prefetches", r.prefetches},
                      {"evictions", r.evictions},
                      {"writebacks", r.writebacks},
                      {"high_water", {{"device", r.high_water[0]}, {"host", r.high_water[1]}, {"nvme", r.high_water[2]}}}});
    }
    doc["results"] = rows;
    std::cout << doc.dump(2) << "\n";
    return;
  }
  std::printf("model %s (%llu chunks of %s), device budget %s, host budget %s, compute %.1f/%.1f ms per chunk "
              "(fwd/bwd), %d steps (first not counted), %s, %s\n",
              FormatBytes(model).c_str(), static_cast<unsigned long long>(layout.num_chunks()),
              FormatBytes(block).c_str(), FormatBytes(device_budget).c_str(), FormatBytes(host_budget).c_str(),
              o.compute_ms, 2 * o.compute_ms, o.steps, (*device)->name().c_str(),
              std::string((*engine)->backend_name()).c_str());
  Table table({"policy", "step", "stall", "stall %", "lane bound", "busiest", "step/bound", "h2d", "d2h",
               "nvme read", "nvme write"});
  for (const PolicyResult& r : results) {
    table.AddRow({r.policy, FormatSeconds(r.step_s), FormatSeconds(r.stall_s),
                  std::to_string(static_cast<int>(100 * r.stall_s / std::max(r.step_s, 1e-9) + 0.5)) + "%",
                  FormatSeconds(r.bound_s), r.bound_lane,
                  [&] {
                    char b[32];
                    std::snprintf(b, sizeof b, "%.3f", r.bound_s > 0 ? r.step_s / r.bound_s : 0.0);
                    return std::string(b);
                  }(),
                  FormatBytes(lane_of(r, "h2d").bytes), FormatBytes(lane_of(r, "d2h").bytes),
                  FormatBytes(lane_of(r, "nvme-read").bytes), FormatBytes(lane_of(r, "nvme-write").bytes)});
  }
  std::printf("%s", table.Render().c_str());
  std::printf("per step; bytes per link; lane busy times:");
  for (const PolicyResult& r : results) {
    std::printf("\n  %s: compute %s, in Acquire() calls %s", r.policy.c_str(), FormatSeconds(r.compute_s).c_str(),
                FormatSeconds(r.acquire_call_s).c_str());
    for (const LaneResult& l : r.lanes) std::printf(", %s %s", l.name.c_str(), FormatSeconds(l.busy_s).c_str());
  }
  std::printf("\n");
}

}  // namespace

void AddBenchSwapCommand(CLI::App& bench) {
  auto o = std::make_shared<SwapOptions>();
  CLI::App* cmd = bench.add_subcommand("swap", "NVMe swap experiment: forward/backward sweep under tier budgets, "
                                               "LRU vs trace policy");
  cmd->add_option("--params", o->params, "model parameters (count: 128M, 1.5G)")->capture_default_str();
  cmd->add_option("--chunk-size", o->chunk_size, "bytes of 16-bit parameters per chunk")->capture_default_str();
  cmd->add_option("--device-budget", o->device_budget, "device tier budget (0: a quarter of the model)")
      ->capture_default_str();
  cmd->add_option("--host-budget", o->host_budget, "pinned host tier budget (0: a quarter of the model)")
      ->capture_default_str();
  cmd->add_option("--compute-ms", o->compute_ms, "forward compute per chunk in ms (backward: twice)")
      ->capture_default_str();
  cmd->add_option("--steps", o->steps, "steps to run; the first is warm-up")->capture_default_str();
  cmd->add_option("--lru-prefetch", o->lru_prefetch, "LRU: chunks prefetched ahead explicitly")->capture_default_str();
  cmd->add_option("--policy", o->policy, "lru | trace | both")->capture_default_str();
  cmd->add_option("--device", o->device, "auto | sim | cuda")->capture_default_str();
  cmd->add_option("--swap-path", o->swap_paths, "swap directory (repeat to stripe); default: the temp directory");
  cmd->add_option("--trace", o->trace_file, "write a Chrome trace (with --policy both: <name>.<policy>.json)");
  cmd->add_flag("--json", o->json, "JSON output");
  cmd->callback([o] { Run(*o); });
}

}  // namespace strata::cli
