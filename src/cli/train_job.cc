#include "cli/train_job.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.h"
#include "strata/swap_files.h"
#include "strata/units.h"
#include "tools/mlp_engine.h"
#include "zero/trainer.h"

namespace strata::cli {
namespace {

// The swap directories of every store the engine may open (optimizer, gradients,
// parameters), without repeats.
std::vector<std::string> SwapDirs(const Config& c) {
  std::set<std::string> dirs;
  for (const OffloadConfig* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
    if (o->device != OffloadDevice::kNvme) continue;
    for (const std::string& d : SwapPaths(c, *o)) dirs.insert(d);
  }
  return {dirs.begin(), dirs.end()};
}

std::string Origin(const TrainJob& job, const std::string& key) {
  auto it = job.origin.find(key);
  return it == job.origin.end() ? "" : " (" + it->second + ")";
}

std::string Placement(const Config& c, const OffloadConfig& o) {
  std::string s(OffloadDeviceName(o.device));
  if (o.device == OffloadDevice::kNvme) {
    for (const std::string& d : SwapPaths(c, o)) s += " " + d;
  }
  return s;
}

std::string Budget(const TrainJob& job, const char* key, uint64_t bytes, uint64_t need) {
  return FormatBytes(need) + " of " + (bytes ? FormatBytes(bytes) : std::string("the budget")) +
         Origin(job, std::string("strata.") + key);
}

// What was configured, before the first step (rank 0).
void PrintSummary(const TrainJob& job, const EngineLayoutInfo& l, int world_size) {
  const Config& c = job.config;
  const char* dtype = c.bf16 ? "bf16" : c.fp16.enabled ? "fp16 (dynamic loss scale)" : "fp32";
  std::printf("strata train: reference MLP, %s parameters (%zu hidden layers of %lld), %d chunks of %s\n",
              FormatCount(static_cast<double>(l.num_params)).c_str(), job.model.hidden.size(),
              static_cast<long long>(job.model.hidden.empty() ? 0 : job.model.hidden[0]), l.num_chunks,
              FormatBytes(static_cast<uint64_t>(l.chunk_elems) * 4).c_str());
  std::printf("  ZeRO stage %d%s, world size %d, device %s, %s\n", c.zero.stage,
              Origin(job, "zero_optimization.stage").c_str(), world_size,
              std::string(DeviceKindName(c.strata.device)).c_str(), dtype);
  std::printf("  optimizer state: %s; parameters: %s; gradients: %s\n",
              Placement(c, c.zero.offload_optimizer).c_str(), Placement(c, c.zero.offload_param).c_str(),
              l.gradients_on_nvme                                       ? "nvme"
              : c.zero.offload_optimizer.device == OffloadDevice::kNone ? "device"
                                                                        : "host");
  std::printf(
      "  batch: %d per rank per micro-batch%s x accumulation %d%s x %d rank%s = %d samples per step\n",
      c.train_micro_batch_size_per_gpu, Origin(job, "train_micro_batch_size_per_gpu").c_str(),
      c.gradient_accumulation_steps, Origin(job, "gradient_accumulation_steps").c_str(), world_size,
      world_size == 1 ? "" : "s", c.train_batch_size);
  std::printf("  optimizer: %s, lr %g, weight decay %g; gradient clipping: %s\n",
              c.optimizer.type == OptimizerType::kAdamW ? "AdamW" : "Adam", c.optimizer.lr,
              c.optimizer.weight_decay,
              c.gradient_clipping > 0 ? FormatDouble("max norm %g", c.gradient_clipping).c_str() : "off");
  std::printf("  memory needed per rank, and the budget it must fit:\n");
  std::printf("    device %s\n", Budget(job, "device_budget", c.strata.device_budget, l.device_need).c_str());
  std::printf("    host   %s\n", Budget(job, "host_budget", c.strata.host_budget, l.host_need).c_str());
  std::printf("    nvme   %s\n", Budget(job, "nvme_budget", c.strata.nvme_budget, l.nvme_need).c_str());
  std::fflush(stdout);
}

// One line per step as it ends (rank 0): loss, rate, time, ETA, and the learning rate
// and loss scale where they apply.
class Progress {
 public:
  Progress(const TrainJob& job) : job_(job) {}
  void OnStep(const zero::TrainLog& log) {
    const size_t i = log.losses.size() - 1;
    const double t = log.timing[i].total_s();
    // The first step records the trace and touches memory: the ETA leaves it out.
    if (i > 0 || job_.steps == 1) sum_s_ += t, timed_ += 1;
    const double mean = timed_ ? sum_s_ / timed_ : t;
    const int left = job_.steps - static_cast<int>(i) - 1;
    std::string line = FormatDouble("step %5.0f", static_cast<double>(i + 1)) + "/" + std::to_string(job_.steps) +
                       FormatDouble("  loss %.6f", log.losses[i]) + FormatDouble("  lr %.3g", job_.config.optimizer.lr);
    if (job_.config.fp16.enabled) line += FormatDouble("  loss scale %g", log.loss_scales[i]);
    line +=
        "  " + FormatDouble("%.1f", job_.config.train_batch_size / t) + " samples/s  " + FormatSeconds(t) + "/step";
    line += left > 0 ? "  ETA " + FormatSeconds(left * mean) : "";
    if (log.skipped[i]) line += "  (skipped: fp16 overflow)";
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

 private:
  const TrainJob& job_;
  double sum_s_ = 0;
  int timed_ = 0;
};

nlohmann::json Report(const TrainJob& job, const EngineLayoutInfo& l, const zero::TrainLog& log,
                      int world_size) {
  nlohmann::json steps = nlohmann::json::array();
  for (size_t i = 0; i < log.losses.size(); ++i) {
    steps.push_back({{"step", i + 1},
                     {"loss", log.losses[i]},
                     {"seconds", log.timing[i].total_s()},
                     {"loss_scale", log.loss_scales[i]},
                     {"skipped", static_cast<bool>(log.skipped[i])},
                     {"grad_norm", log.results[i].grad_norm}});
  }
  return {{"config", ConfigToJson(job.config)},
          {"world_size", world_size},
          {"model", {{"params", l.num_params}, {"chunks", l.num_chunks}, {"hidden", job.model.hidden}}},
          {"budget_need", {{"device", l.device_need}, {"host", l.host_need}, {"nvme", l.nvme_need}}},
          {"steps", steps}};
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

// Every rank's pid, -1 for ranks on another node (by host name), for naming a peer
// that vanished.
Result<std::vector<int>> PeerPids(Communicator& world) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const int64_t mine[2] = {static_cast<int64_t>(::getpid()),
                           static_cast<int64_t>(std::hash<std::string>{}(host)&0x7fffffffffffffffLL)};
  std::vector<int64_t> all(2 * world.size());
  STRATA_RETURN_IF_ERROR(world.AllGather(mine, all.data(), 4, DType::kF32).Wait());  // 16 bytes a rank
  std::vector<int> pids(world.size());
  for (int r = 0; r < world.size(); ++r)
    pids[r] = all[2 * r + 1] == mine[1] ? static_cast<int>(all[2 * r]) : -1;
  return pids;
}

}  // namespace

int RunTrainJob(Communicator& world, const TrainJob& job, InterruptGuard& guard) {
  const bool rank0 = world.rank() == 0;
  const std::vector<std::string> dirs = SwapDirs(job.config);
  guard.SetSwap(dirs, world.rank(), world.size());
  auto pids = PeerPids(world);
  ThrowIfError(pids.status());
  guard.SetPeers(std::move(*pids));
  SweepStaleSwapFiles(dirs, world.size(), world.rank());
  auto setup = tools::CreateMlpEngine(world, job.config, job.model, nullptr);
  if (!setup.ok() && guard.signal()) {
    int code = 0;
    std::fprintf(stderr, "%s\n", guard.FinishUnwind(&code).c_str());
    return code;
  }
  ThrowIfError(setup.status());
  const EngineLayoutInfo layout = setup->engine->layout_info();
  if (rank0 && !job.json) PrintSummary(job, layout, world.size());
  zero::TrainSpec spec;
  spec.model = job.model;
  spec.data.seed = job.data_seed;
  spec.steps = job.steps;
  spec.micro_batch = job.config.train_micro_batch_size_per_gpu;
  spec.check_stop = [&guard] { return guard.Check(); };
  Progress progress(job);
  std::function<void(const zero::TrainLog&)> on_step;
  if (rank0 && !job.json) on_step = [&progress](const zero::TrainLog& log) { progress.OnStep(log); };
  auto log = zero::TrainWithEngine(*setup->engine, world, job.config, spec, on_step);
  if (!log.ok() && guard.signal()) {
    setup->engine.reset();  // closes the stores: their swap and lock files go
    int code = 0;
    std::fprintf(stderr, "%s\n", guard.FinishUnwind(&code).c_str());
    return code;
  }
  if (!log.ok()) {
    // A peer that vanished is the cause whatever this rank saw (a watchdog timeout, an
    // MPI error): say so first.
    const std::string lost = guard.LostPeers();
    ThrowIfError(lost.empty() ? log.status() : log.status().WithContext(lost));
  }
  if (rank0 && job.json) std::printf("%s\n", Report(job, layout, *log, world.size()).dump(2).c_str());
  if (rank0 && !job.json) {
    double sum = 0;
    for (size_t i = log->timing.size() > 1 ? 1 : 0; i < log->timing.size(); ++i)
      sum += log->timing[i].total_s();
    const size_t timed = log->timing.size() > 1 ? log->timing.size() - 1 : 1;
    std::printf("done: %d steps, %s per step after the first, final loss %.6f\n", job.steps,
                FormatSeconds(sum / timed).c_str(), log->losses.back());
  }
  return 0;
}

}  // namespace strata::cli
