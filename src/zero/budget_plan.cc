// The engine's memory plan: what each tier must hold, checked against the budgets before
// anything is allocated or created on disk (budget_check.h). budget_extras.cc plans
// what the budgets leave.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "strata/host_arena.h"
#include "strata/io.h"
#include "strata/log.h"
#include "strata/topology.h"
#include "strata/units.h"
#include "zero/engine_impl.h"
#include "zero/keep_plan.h"
#include "zero/piece_plan.h"
#include "zero/residency_plan.h"

namespace strata {
namespace {

using zero::Align4K;
using zero::NeedScale;

zero::NeedPart Part(std::string what, uint64_t bytes, NeedScale scale, std::string lever = "",
                    bool sharded = false, std::vector<std::string> paths = {}) {
  return {std::move(what), bytes, scale, std::move(lever), sharded, std::move(paths)};
}

std::string Chunks(uint64_t n) { return std::to_string(n) + (n == 1 ? " chunk" : " chunks"); }

// The lever that takes the optimizer state off the device at `stage`.
std::string OffloadOptimizerFromDevice(int stage) {
  if (stage == 0)
    return "zero_optimization.stage 1-3 with offload_optimizer.device \"cpu\" (\"nvme\" at stage 3)";
  if (stage < 3) return "offload_optimizer.device \"cpu\" (\"nvme\" needs stage 3)";
  return "offload_optimizer.device \"cpu\" or \"nvme\"";
}

}  // namespace

void Engine::Impl::PlanPieces() {
  zero::PieceInputs in;
  in.layout = &layout;
  in.stage = stage;
  in.optimizer_on_nvme = opt_tier == ZeroTier::kNvme;
  in.params_on_nvme = param_tier == ZeroTier::kNvme;
  in.compute = compute;
  in.opt_elems = opt_elems;
  in.opt_offset = opt_offset;
  in.sub_group_size = config.zero.sub_group_size;
  zero::PiecePlan plan = zero::PlanPieces(in);
  if (!plan.warning.empty()) STRATA_LOG(kWarn, "engine") << plan.warning;
  piece_shape.opt_elems = opt_elems;
  piece_shape.piece_elems = plan.piece_elems;
  piece_shape.pieces = plan.pieces;
  opt_set_bytes = plan.opt_set_bytes;
  grad_slot_bytes = plan.grad_slot_bytes;
  publish_behind = plan.publish_behind;
  param_from_master = plan.params_from_master;
  piece_shape.live = std::move(plan.piece_live);
}

uint64_t Engine::Impl::RunGradBytes() const { return RunChunks() * layout.chunk_elems * 4ull; }
uint64_t Engine::Impl::RunParamBytes() const {
  return stage == 3 ? RunChunks() * layout.chunk_elems * static_cast<uint64_t>(csize) : 0;
}

void Engine::Impl::PlanDeviceNeed(MemoryPlan& p) {
  const zero::Layout& l = layout;
  const uint64_t n_chunks = l.num_chunks, chunk16 = l.chunk_elems * csize;
  const std::string dt(DTypeName(compute));
  // Pool buffers serve the chunks outside runs; a run's chunks have buffers of their own.
  for (const auto& chunks : l.module_chunks) {
    const size_t pooled = std::count_if(chunks.begin(), chunks.end(), [&](int c) { return !l.InRun(c); });
    p.max_module_chunks = std::max(p.max_module_chunks, pooled);
  }
  grad_buffers = static_cast<int>(p.max_module_chunks) + 1;
  p.recv_elems = (stage <= 1) ? l.chunk_elems : l.shard_elems;
  zero::TierNeed& d = p.device;
  d.Add(
      Part("fp32 gradient buffers for the largest module's " + Chunks(p.max_module_chunks) + " and one more",
           grad_buffers * l.chunk_elems * 4ull, NeedScale::kChunk));
  if (RunChunks() > 0) {
    d.Add(Part("fp32 gradient buffers of the tensors larger than a chunk (" + Chunks(RunChunks()) + ")",
               RunGradBytes(), NeedScale::kModel));
  }
  d.Add(Part(std::string("the fp32 reduce buffer (one ") + (stage <= 1 ? "chunk)" : "shard)"),
             p.recv_elems * 4, NeedScale::kChunk, "", stage > 1));
  if (stage < 3) {
    d.Add(Part(
        "every chunk's " + dt + " compute parameters (stage " + std::to_string(stage) +
            " keeps the whole model on each device)",
        n_chunks * chunk16, NeedScale::kModel,
        "zero_optimization.stage 3 with offload_param.device \"cpu\" or \"nvme\" (it gathers a module at a "
        "time)"));
  } else {
    // The running module's chunks, and the chunks of small tensors only, which stay
    // gathered whatever the budget, as DeepSpeed's do; more if it fits.
    const zero::KeepPlan persist =
        zero::PlanKeep(l, order->trace(), 0, config.zero.stage3_param_persistence_threshold, 0);
    p.fixed_gather = zero::PeakGathered(l, order->trace(), persist.kept, /*window=*/0);
    const int module_peak = zero::PeakGathered(l, order->trace(), {}, /*window=*/0);
    d.Add(Part("the largest module's gathered " + dt + " parameters (" + Chunks(module_peak) + ")",
               module_peak * chunk16, NeedScale::kChunk));
    if (RunChunks() > 0) {
      d.Add(Part("the gathered " + dt + " parameters of the tensors larger than a chunk (" +
                     Chunks(RunChunks()) + ")",
                 RunParamBytes(), NeedScale::kModel));
    }
    d.Add(Part(Chunks(p.fixed_gather - module_peak) + " kept gathered for stage3_param_persistence_threshold",
               (p.fixed_gather - module_peak) * chunk16, NeedScale::kChunk,
               "lower zero_optimization.stage3_param_persistence_threshold"));
    if (param_tier == ZeroTier::kDevice) {
      d.Add(Part("the " + dt + " parameter shards", n_chunks * l.shard_elems * csize, NeedScale::kModel,
                 "offload_param.device \"cpu\" or \"nvme\"", true));
    }
  }
  const int on_device = DeviceChunkCount();
  opt_on_device.clear();
  if (on_device > 0) {
    // The chunks the backward finishes last: stepped on the device right after it, they
    // take the tail of the CPU optimizer's work off the step's critical path.
    opt_on_device.assign(n_chunks, 0);
    const std::vector<int> by_last_use = zero::ResidencyOrder(l, order->trace());
    for (int i = 0; i < on_device; ++i) opt_on_device[by_last_use[i]] = 1;
  }
  p.out16_on_device =
      stage == 3 && (opt_tier == ZeroTier::kDevice || on_device > 0) && !device->host_accessible();
  if (p.out16_on_device) {
    d.Add(Part("the optimizer's " + dt + " output staging (one shard)", opt_elems * csize, NeedScale::kChunk,
               "", true));
  }
  if (opt_tier == ZeroTier::kDevice) {
    d.Add(Part("the optimizer state (fp32 master, m and v) and fp32 gradient shards",
               n_chunks * 16 * opt_elems, NeedScale::kModel, OffloadOptimizerFromDevice(stage), stage >= 1));
  }
  if (on_device > 0) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%g", config.zero.offload_optimizer.ratio);
    d.Add(Part("the optimizer state (fp32 master, m and v) and fp32 gradient shards of the " +
                   Chunks(on_device) + " kept on the device (offload_optimizer.ratio " + ratio + ")",
               on_device * 16ull * opt_elems, NeedScale::kModel,
               "raise zero_optimization.offload_optimizer.ratio", true));
  }
}

int Engine::Impl::DeviceChunkCount() const {
  if (opt_tier != ZeroTier::kHost) return 0;
  const int n = layout.num_chunks;
  return n - zero::ResidentCount(n, config.zero.offload_optimizer.ratio);
}

void Engine::Impl::PlanHostNeed(MemoryPlan& p) {
  const zero::Layout& l = layout;
  const uint64_t n_chunks = l.num_chunks, out16 = Align4K(opt_elems * csize);
  const std::string dt(DTypeName(compute));
  zero::TierNeed& h = p.host;
  if (stage == 3 && param_tier == ZeroTier::kHost) {
    h.Add(Part("the " + dt + " parameter shards", n_chunks * Align4K(l.shard_elems * csize),
               NeedScale::kModel, "offload_param.device \"nvme\"", true));
  }
  PlanExplicitParamResidency(h);
  if (stage == 3 || opt_tier != ZeroTier::kDevice) {
    h.Add(Part("staging for " + std::to_string(kParamStaging) + " " + dt + " parameter shards",
               kParamStaging * out16, NeedScale::kChunk, "", stage >= 1));
  }
  if (opt_tier == ZeroTier::kHost) {
    const uint64_t on_host = n_chunks - DeviceChunkCount();
    h.Add(Part("the optimizer state (fp32 master, m and v) and fp32 gradient shards" +
                   (on_host < n_chunks ? " of the " + Chunks(on_host) + " the CPU steps" : std::string()),
               on_host * (opt_set_bytes + grad_slot_bytes), NeedScale::kModel,
               stage == 3 ? "offload_optimizer.device \"nvme\""
                          : "zero_optimization.stage 3 with offload_optimizer.device \"nvme\"",
               true));
  }
  if (opt_tier == ZeroTier::kNvme) {
    h.Add(Part("one NVMe optimizer staging set (a piece's fp32 master, m and v)", opt_set_bytes,
               piece_shape.pieces > 1 ? NeedScale::kFixed : NeedScale::kChunk,
               piece_shape.pieces > 1
                   ? "lower zero_optimization.sub_group_size (smaller NVMe optimizer pieces)"
                   : "",
               piece_shape.pieces == 1));
  }
  const int resident = PlanExplicitResidency(h);
  if (grad_tier != ZeroTier::kDevice) {
    const uint64_t recv_elems = RecvStagingElems(), recv = Align4K(recv_elems * 4);
    const bool whole = recv_elems == static_cast<uint64_t>(opt_elems);
    h.Add(Part(whole ? "the fp32 gradient receive buffer (one shard)"
                     : "the fp32 gradient receive buffer (one " + FormatBytes(recv) + " piece of a shard)",
               recv, whole ? NeedScale::kChunk : NeedScale::kFixed, "", whole));
  }
  p.host_budget = HostBudget(h.Total() > 0);
  if (publish_behind) {
    h.Add(Part(std::to_string(kOut16Staging) + " " + dt + " parameter shards on their way to NVMe",
               kOut16Staging * out16, NeedScale::kChunk, "", true));
  }
  if (opt_tier == ZeroTier::kNvme) {
    // Gradient shards wait for the step in pinned memory if the budget holds them
    // (no extra I/O), else on NVMe beside the state: at least two pinned shards, which
    // also hold a shard read back for a step that needs it from disk.
    const uint64_t on_host = h.Total() + n_chunks * grad_slot_bytes;
    const std::string& want = config.strata.gradients;
    // With overlap on and clipping off no step is ever redone, so a shard on the NVMe
    // path never touches the disk (engine_grads.cc): auto takes it then even when the
    // budget would hold the shards, and the freed memory deepens the staging pipeline
    // (100M-parameter stage-3 step at 1200 MiB: 1.70 s against 1.82 s in memory). Not
    // with gradient accumulation: every micro-batch but the last writes and reads back
    // each shard there.
    const bool free_on_nvme =
        overlap && config.gradient_clipping <= 0 && config.gradient_accumulation_steps <= 1;
    if (want == "nvme" || (want == "auto" && (free_on_nvme || on_host > p.host_budget.bytes))) {
      grad_tier = ZeroTier::kNvme;
      h.Add(Part("2 fp32 gradient shards on their way to NVMe", 2 * grad_slot_bytes, NeedScale::kChunk, "",
                 true));
      h.Add(Part("the fp32 gradient shards of the " + Chunks(resident) + " kept in memory",
                 resident * grad_slot_bytes, NeedScale::kModel, "lower strata.optimizer_resident", true));
    } else {
      h.Add(Part("the fp32 gradient shards", n_chunks * grad_slot_bytes, NeedScale::kModel,
                 want == "host" ? "strata.gradients \"nvme\"" : "", true));
    }
  }
}

int Engine::Impl::PlanExplicitResidency(zero::TierNeed& h) {
  if (opt_tier != ZeroTier::kNvme || config.strata.optimizer_resident < 0) return 0;
  const int count = zero::ResidentCount(layout.num_chunks, config.strata.optimizer_resident);
  char fraction[32];
  std::snprintf(fraction, sizeof(fraction), "%g", config.strata.optimizer_resident);
  h.Add(Part("the optimizer state (fp32 master, m and v) of the " + Chunks(count) +
                 " kept in memory (strata.optimizer_resident " + fraction + ")",
             count * ResidentStateBytes(), NeedScale::kModel, "lower strata.optimizer_resident", true));
  return count;
}

void Engine::Impl::PlanExplicitParamResidency(zero::TierNeed& h) {
  const double fraction = config.strata.param_resident;
  if (!ParamsSwapped() || fraction < 0) return;
  const int count = zero::ResidentCount(layout.num_chunks, fraction);
  char text[32];
  std::snprintf(text, sizeof(text), "%g", fraction);
  h.Add(Part("the " + std::string(DTypeName(compute)) + " parameter shards of the " + Chunks(count) +
                 " kept in memory (strata.param_resident " + text + ")",
             count * ParamShardBytes(), NeedScale::kModel, "lower strata.param_resident", true));
}

void Engine::Impl::PlanNvmeNeed(MemoryPlan& p) {
  const zero::Layout& l = layout;
  const uint64_t n_chunks = l.num_chunks;
  // More disks, each with its share: the key that lists a store's directories.
  auto more_disks = [&](const OffloadConfig& offload, const char* key) {
    return std::string("stripe the swap over more disks (several directories in ") +
           (offload.nvme_path.empty() ? "strata.swap_paths" : key) + ")";
  };
  const OffloadConfig& oo = config.zero.offload_optimizer;
  const std::string opt_disks = more_disks(oo, "zero_optimization.offload_optimizer.nvme_path");
  if (stage == 3 && param_tier == ZeroTier::kNvme && !param_from_master) {
    const OffloadConfig& op = config.zero.offload_param;
    p.nvme.Add(Part("the " + std::string(DTypeName(compute)) + " parameter shards",
                    n_chunks * Align4K(l.shard_elems * csize), NeedScale::kModel,
                    more_disks(op, "zero_optimization.offload_param.nvme_path"), true,
                    SwapPaths(config, op)));
  }
  if (opt_tier == ZeroTier::kNvme) {
    p.nvme.Add(Part("the optimizer state (fp32 master, m and v, in two slots: committed and next)",
                    2 * n_chunks * piece_shape.pieces * opt_set_bytes, NeedScale::kModel, opt_disks, true,
                    SwapPaths(config, oo)));
  }
  if (grad_tier == ZeroTier::kNvme) {
    p.nvme.Add(Part("the fp32 gradient shards", n_chunks * grad_slot_bytes, NeedScale::kModel, opt_disks,
                    true, SwapPaths(config, oo)));
  }
}

Result<zero::TierBudget> Engine::Impl::DeviceBudget() {
  // Which chunks are gathered, kept and released must be the same on every rank (each
  // gather is a collective), and a rank that cannot hold the configuration must not
  // leave the others waiting: every rank plans with the least room any rank has.
  const uint64_t capacity = device->capacity(), used = device->allocated();
  STRATA_ASSIGN_OR_RETURN(const uint64_t have, LeastOverRanks(capacity - used));
  zero::TierBudget b{have, "", "raise strata.device_budget to at least {need}"};
  if (config.strata.device_budget != 0 && capacity == config.strata.device_budget) {
    b.source = "strata.device_budget";
  } else if (device->kind() == DeviceKind::kSim) {
    b.source = config.strata.device_budget ? "the sim device's size" : "the sim device's default size";
    b.raise = "set strata.device_budget to at least {need}";
  } else {
    b.source = device->name() + ": 95% of its free memory, strata.device_budget unset";
    b.raise = "free memory on the device or use one with at least {need}";
  }
  if (used > 0) b.source += "; " + FormatBytes(used) + " of " + FormatBytes(capacity) + " already in use";
  if (world_size > 1) b.source += "; the least any of the " + std::to_string(world_size) + " ranks has";
  return b;
}

zero::TierBudget Engine::Impl::HostBudget(bool host_needed) const {
  zero::TierBudget b{config.strata.host_budget, "strata.host_budget",
                     "raise strata.host_budget to at least {need}"};
  if (b.bytes == 0 && (host_needed || arena == nullptr)) {
    auto topo = DiscoverTopology();
    b.raise = "set strata.host_budget to at least {need}";
    if (!topo.ok()) {
      b.bytes = 4 * GiB;
      b.source = "what strata assumes when it cannot read the machine, strata.host_budget unset";
    } else {
      // DefaultHostArenaBytes: the lockable memory, at most half of the machine's.
      b.bytes = DefaultHostArenaBytes(0, *topo);
      uint64_t memory = topo->total_memory_bytes;
      if (memory == 0) memory = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
      const uint64_t lockable = topo->memlock.lockable_bytes();
      if (lockable < memory / 2) {
        b.source = "the memlock limit (ulimit -l " + FormatBytes(lockable) + "), strata.host_budget unset";
        b.raise = "raise `ulimit -l` and set strata.host_budget to at least {need}";
      } else {
        b.source = "half of this machine's " + FormatBytes(memory) + ", strata.host_budget unset";
      }
    }
  }
  if (arena != nullptr) {
    const uint64_t free = arena->size() - arena->allocated();
    if ((b.bytes ? b.bytes : arena->size()) >= free) {
      b.source = "what is free of the host arena given in EngineResources.host_arena (" + FormatBytes(free) +
                 " of " + FormatBytes(arena->size()) + ")";
      b.raise = "give the engine a host arena with at least {need} free";
    }
    b.bytes = std::min<uint64_t>(b.bytes ? b.bytes : arena->size(), free);
  }
  return b;
}

Status Engine::Impl::PlanMemory(MemoryPlan& p) {
  PlanPieces();
  if (param_from_master && config.strata.param_resident > 0) {
    return InvalidArgumentError(
        "strata.param_resident: with fp32 compute and both the optimizer state and the parameters on NVMe, "
        "a gather reads the parameter shard from the optimizer's master, so there is no parameter swap to "
        "keep in memory; strata.optimizer_resident keeps chunks (their master included) in memory instead");
  }
  PlanDeviceNeed(p);
  STRATA_ASSIGN_OR_RETURN(p.device_budget, DeviceBudget());
  PlanHostNeed(p);
  PlanNvmeNeed(p);
  zero::PlanShape shape;
  shape.stage = stage;
  shape.world_size = world_size;
  shape.opt_tier = opt_tier;
  shape.opt_on_device_too = DeviceChunkCount() > 0;
  shape.param_tier = param_tier;
  shape.num_params = layout.num_params;
  shape.chunk_elems = layout.chunk_elems;
  for (int64_t n : layout.module_params) shape.largest_module = std::max(shape.largest_module, n);
  shape.chunk_size = config.strata.chunk_size;
  // NVMe first: a model too large for the disk is refused for that, however the memory
  // tiers are set; nothing is created on disk before this.
  const zero::TierVerdict nvme = zero::CheckNvme(p.nvme, config.strata.nvme_budget,
                                                 IoEngineOptions::FromConfig(config).block_size, shape);
  const zero::TierVerdict dev = zero::CheckTier(p.device, p.device_budget, shape);
  const zero::TierVerdict host = zero::CheckTier(p.host, p.host_budget, shape);
  return zero::Refuse({&nvme, &dev, &host});
}

}  // namespace strata
