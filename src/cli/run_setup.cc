#include "cli/run_setup.h"

#include <unistd.h>

#include <cstdio>
#include <functional>
#include <set>

#include "cli/commands.h"
#include "strata/lr_schedule.h"
#include "strata/swap_files.h"
#include "strata/units.h"
#include "tools/model_engine.h"
#include "tools/process_memory.h"
#include "tools/step_bench.h"
#include "tools/step_traffic.h"

namespace strata::cli {
namespace {

std::string Origin(const Origins& origin, const std::string& key) {
  auto it = origin.find(key);
  return it == origin.end() ? "" : " (" + it->second + ")";
}

std::string Placement(const Config& c, const OffloadConfig& o) {
  std::string s(OffloadDeviceName(o.device));
  if (o.device == OffloadDevice::kNvme) {
    for (const std::string& d : SwapPaths(c, o)) s += " " + d;
  }
  return s;
}

std::string Budget(const Origins& origin, const char* key, uint64_t bytes, uint64_t need) {
  return FormatBytes(need) + " of " + (bytes ? FormatBytes(bytes) : std::string("the budget")) +
         Origin(origin, std::string("strata.") + key);
}

// Swap files that runs with more ranks left behind (their ranks are not this run's, so
// no store of this run would reuse and clear them).
void SweepStaleSwapFiles(const std::vector<std::string>& dirs, int world_size, int rank) {
  for (const std::string& d : dirs) {
    std::vector<SwapFileInfo> in_use;
    auto removed = RemoveStaleSwapFiles(d, world_size, &in_use);
    ThrowIfError(removed.status());
    if (rank != 0) continue;
    if (!removed->empty()) {
      std::fprintf(
          stderr,
          "strata: removed swap files that an earlier run left behind (no process held their locks): %s\n",
          DescribeSwapFiles(*removed).c_str());
    }
    if (!in_use.empty()) {
      std::fprintf(stderr, "strata: note: %s belong to another live process (pid %d); left alone\n",
                   DescribeSwapFiles(in_use).c_str(), in_use.front().owner_pid);
    }
  }
}

// Every rank's pid, -1 for ranks on another node.
Result<std::vector<int>> PeerPids(Communicator& world) {
  STRATA_ASSIGN_OR_RETURN(const std::vector<uint64_t> nodes, tools::NodeOfEachRank(world));
  const int64_t mine = ::getpid();
  std::vector<int64_t> all(world.size());
  STRATA_RETURN_IF_ERROR(world.AllGather(&mine, all.data(), 2, DType::kF32).Wait());  // 8 bytes a rank
  std::vector<int> pids(world.size());
  for (int r = 0; r < world.size(); ++r)
    pids[r] = nodes[r] == nodes[world.rank()] ? static_cast<int>(all[r]) : -1;
  return pids;
}

}  // namespace

std::vector<std::string> SwapDirs(const Config& c) {
  std::set<std::string> dirs;
  for (const OffloadConfig* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
    if (o->device != OffloadDevice::kNvme) continue;
    for (const std::string& d : SwapPaths(c, *o)) dirs.insert(d);
  }
  return {dirs.begin(), dirs.end()};
}

void StartRun(Communicator& world, const Config& config, InterruptGuard& guard) {
  const std::vector<std::string> dirs = SwapDirs(config);
  guard.SetSwap(dirs, world.rank(), world.size());
  auto pids = PeerPids(world);
  ThrowIfError(pids.status());
  guard.SetPeers(std::move(*pids));
  SweepStaleSwapFiles(dirs, world.size(), world.rank());
}

void PrintConfigSummary(const Config& c, const Origins& origin, const EngineLayoutInfo& l, int world_size,
                        const std::string& batch_unit) {
  const char* dtype = c.bf16 ? "bf16" : c.fp16.enabled ? "fp16 (dynamic loss scale)" : "fp32";
  std::printf("  ZeRO stage %d%s, world size %d, device %s, %s\n", c.zero.stage,
              Origin(origin, "zero_optimization.stage").c_str(), world_size,
              std::string(DeviceKindName(c.strata.device)).c_str(), dtype);
  std::string grads = l.gradient_pieces_on_nvme
                          ? "nvme, a piece at a time (no pinned shard fits the host budget)"
                      : l.gradients_on_nvme                                     ? "nvme"
                      : c.zero.offload_optimizer.device == OffloadDevice::kNone ? "device"
                                                                                : "host";
  if (l.gradient_resident_chunks > 0) {
    grads +=
        " (but " + std::to_string(l.gradient_resident_chunks) + " more chunks' shards kept in pinned memory)";
  }
  std::printf("  optimizer state: %s; parameters: %s; gradients: %s\n",
              Placement(c, c.zero.offload_optimizer).c_str(), Placement(c, c.zero.offload_param).c_str(),
              grads.c_str());
  if (c.zero.offload_optimizer.device == OffloadDevice::kNvme) {
    const std::string why = Origin(origin, "strata.optimizer_resident");
    const int sets = l.optimizer_staging_sets;
    const std::string rest = l.optimizer_resident_chunks >= l.num_chunks
                                 ? "none on NVMe"
                                 : "the rest on NVMe, stepped through " + std::to_string(sets) +
                                       " staging set" + (sets == 1 ? "" : "s") + " of a piece each";
    std::printf(
        "  optimizer state in pinned host memory: %d of %d chunks (%s), %s; strata.optimizer_resident %s%s\n",
        l.optimizer_resident_chunks, l.num_chunks,
        FormatBytes(12ull * l.optimizer_resident_chunks * l.shard_elems).c_str(), rest.c_str(),
        c.strata.optimizer_resident < 0 ? "auto (what the host budget holds)"
                                        : FormatDouble("%g", c.strata.optimizer_resident).c_str(),
        why.c_str());
  }
  if (c.zero.stage == 3 && c.zero.offload_param.device == OffloadDevice::kNvme) {
    if (l.params_in_optimizer_state) {
      std::printf(
          "  parameter shards: read from the optimizer state's master on NVMe (no parameter swap)%s\n",
          l.param_stream_pieces > 0
              ? ", streamed through pinned pieces: whole shards would not fit the host budget"
              : "");
    } else {
      const struct {
        const char* where;
        int chunks;
        const char* key;
        double fraction;
        const char* auto_text;
      } tiers[] = {
          {"in pinned host memory", l.param_resident_chunks, "strata.param_resident", c.strata.param_resident,
           "auto (what the host budget holds)"},
          {"in device memory", l.param_device_chunks, "strata.param_on_device", c.strata.param_on_device,
           "auto (what the device budget holds after the gather buffers)"}};
      for (const auto& t : tiers) {
        std::printf(
            "  parameter shards %s: %d of %d chunks (%s); %s %s%s\n", t.where, t.chunks, l.num_chunks,
            FormatBytes(static_cast<uint64_t>(t.chunks) * l.shard_elems * tools::ComputeBytes(c)).c_str(),
            t.key, t.fraction < 0 ? t.auto_text : FormatDouble("%g", t.fraction).c_str(),
            Origin(origin, t.key).c_str());
      }
    }
  }
  if (l.param_stream_pieces > 0 && !l.params_in_optimizer_state) {
    std::printf(
        "  parameter shards streamed: the step's new values go out a piece at a time through pinned pieces "
        "(whole shards would not fit the host budget)\n");
  }
  if (l.optimizer_device_chunks > 0) {
    std::printf(
        "  optimizer state on the device: %d of %d chunks (%s, with their gradient shards), the rest stepped "
        "by "
        "the CPU; offload_optimizer.ratio %g%s\n",
        l.optimizer_device_chunks, l.num_chunks,
        FormatBytes(16ull * l.optimizer_device_chunks * l.shard_elems).c_str(),
        c.zero.offload_optimizer.ratio, Origin(origin, "zero_optimization.offload_optimizer.ratio").c_str());
  }
  std::printf("  batch: %d %s per rank per micro-batch%s x accumulation %d%s x %d rank%s = %d per step\n",
              c.train_micro_batch_size_per_gpu, batch_unit.c_str(),
              Origin(origin, "train_micro_batch_size_per_gpu").c_str(), c.gradient_accumulation_steps,
              Origin(origin, "gradient_accumulation_steps").c_str(), world_size, world_size == 1 ? "" : "s",
              c.train_batch_size);
  const std::string threads =
      c.zero.offload_optimizer.device == OffloadDevice::kNone
          ? std::string()
          : FormatDouble(" (the CPU optimizer's steps beside it on %.0f", l.optimizer_threads) +
                (l.optimizer_threads == 1 ? " thread" : " threads") +
                Origin(origin, "strata.optimizer_threads") + ")";
  std::printf(
      "  optimizer: %s, lr %g%s, weight decay %g; gradient clipping: %s; overlap with backward: %s%s\n",
      c.optimizer.type == OptimizerType::kAdamW ? "AdamW" : "Adam", c.optimizer.lr,
      Origin(origin, "optimizer.params.lr").c_str(), c.optimizer.weight_decay,
      c.gradient_clipping > 0 ? FormatDouble("max norm %g", c.gradient_clipping).c_str() : "off",
      c.strata.overlap_auto ? "auto (steps 2-5 alternate, the faster is kept)"
      : c.strata.overlap    ? "on"
                            : "off",
      threads.c_str());
  if (c.scheduler.type != LrScheduleType::kConstant) {
    const LrSchedule& l = c.scheduler;
    std::printf(
        "  lr schedule: %s, %s warmup over %lld steps%s\n", std::string(LrScheduleTypeName(l.type)).c_str(),
        std::string(WarmupTypeName(l.warmup_type)).c_str(), static_cast<long long>(l.warmup_num_steps),
        l.total_num_steps ? (", " + std::to_string(l.total_num_steps) + " steps in all").c_str() : "");
  }
  std::printf("  memory needed per rank, and the budget it must fit:\n");
  std::printf("    device %s\n",
              Budget(origin, "device_budget", c.strata.device_budget, l.device_need).c_str());
  std::printf("    host   %s\n", Budget(origin, "host_budget", c.strata.host_budget, l.host_need).c_str());
  std::printf("    nvme   %s\n", Budget(origin, "nvme_budget", c.strata.nvme_budget, l.nvme_need).c_str());
  std::fflush(stdout);
}

std::string StepProgress::Line(int step, double loss, double lr, double seconds, const StepResult& r) {
  // The first step of a process records the trace and touches memory: the ETA leaves it out.
  if (seen_++ > 0 || steps_ == step + 1) sum_s_ += seconds, timed_ += 1;
  const double mean = timed_ ? sum_s_ / timed_ : seconds;
  const int left = steps_ - step - 1;
  std::string line = FormatDouble("step %5.0f", static_cast<double>(step + 1)) + "/" +
                     std::to_string(steps_) + FormatDouble("  loss %.6f", loss) +
                     FormatDouble("  lr %.3g", lr);
  if (fp16_) line += FormatDouble("  loss scale %g", r.loss_scale);
  line +=
      "  " + FormatDouble("%.1f", items_ / seconds) + " " + unit_ + "/s  " + FormatSeconds(seconds) + "/step";
  if (left > 0) line += "  ETA " + FormatSeconds(left * mean);
  if (r.skipped) line += "  (skipped: fp16 overflow)";
  return line;
}

std::string MemoryAccountLine(const EngineLayoutInfo& l, const Config& c, uint64_t base_rss,
                              double activation_bytes_per_sample, uint64_t data_bytes) {
  const bool sim = c.strata.device != DeviceKind::kCuda;
  tools::ProcessMemory p = tools::EstimateProcessMemory(base_rss, l, c, activation_bytes_per_sample,
                                                        c.train_micro_batch_size_per_gpu);
  p.data = data_bytes;
  return "memory: peak RSS " + FormatBytes(tools::PeakRssBytes()) + "; " + tools::PlanMemoryText(l, p) +
         (sim ? "; the sim device's memory is in the RSS"
              : "; device memory and the activations are not in the RSS");
}

int EndFailedRun(const Status& status, InterruptGuard& guard) {
  if (guard.signal()) {
    int code = 0;
    std::fprintf(stderr, "%s\n", guard.FinishUnwind(&code).c_str());
    return code;
  }
  // A peer that vanished is the cause whatever this rank saw (a watchdog timeout, an
  // MPI error): say so first.
  const std::string lost = guard.LostPeers();
  throw CliError(lost.empty() ? status : status.WithContext(lost));
}

}  // namespace strata::cli
