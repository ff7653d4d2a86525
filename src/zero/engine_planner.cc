// The fixed needs of every tier, checked against the budgets (budget_check.h), and
// the pieces of the NVMe optimizer. engine_planner_extras.cc plans what the budgets
// leave.
#include "zero/engine_planner.h"

#include <algorithm>
#include <cstdio>

#include "strata/io.h"
#include "strata/log.h"
#include "strata/units.h"
#include "zero/keep_plan.h"
#include "zero/residency_plan.h"

namespace strata::zero {
namespace {

NeedPart Part(std::string what, uint64_t bytes, NeedScale scale, std::string lever = "", bool sharded = false,
              std::vector<std::string> paths = {}) {
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

void EnginePlanner::PlanPieces() {
  PieceInputs in;
  in.layout = &layout_;
  in.stage = stage_;
  in.optimizer_on_nvme = opt_tier_ == ZeroTier::kNvme;
  in.params_on_nvme = param_tier_ == ZeroTier::kNvme;
  in.compute = compute_;
  in.opt_elems = opt_elems_;
  in.opt_offset = opt_offset_;
  in.sub_group_size = config_.zero.sub_group_size;
  PiecePlan plan = zero::PlanPieces(in);
  if (!plan.warning.empty()) STRATA_LOG(kWarn, "engine") << plan.warning;
  out_.pieces.opt_elems = opt_elems_;
  out_.pieces.piece_elems = plan.piece_elems;
  out_.pieces.pieces = plan.pieces;
  out_.opt_set_bytes = plan.opt_set_bytes;
  out_.grad_slot_bytes = plan.grad_slot_bytes;
  out_.publish_behind = plan.publish_behind;
  out_.param_from_master = plan.params_from_master;
  out_.pieces.live = std::move(plan.piece_live);
}

uint64_t EnginePlanner::RunGradBytes() const { return RunChunks() * layout_.chunk_elems * 4ull; }
uint64_t EnginePlanner::RunParamBytes() const {
  return stage_ == 3 ? RunChunks() * layout_.chunk_elems * static_cast<uint64_t>(csize_) : 0;
}

void EnginePlanner::PlanDeviceNeed() {
  const Layout& l = layout_;
  const uint64_t n_chunks = l.num_chunks, chunk16 = l.chunk_elems * csize_;
  const std::string dt(DTypeName(compute_));
  // Pool buffers serve the chunks outside runs; a run's chunks have buffers of their own.
  for (const auto& chunks : l.module_chunks) {
    const size_t pooled = std::count_if(chunks.begin(), chunks.end(), [&](int c) { return !l.InRun(c); });
    out_.max_module_chunks = std::max(out_.max_module_chunks, pooled);
  }
  out_.grad_buffers = static_cast<int>(out_.max_module_chunks) + 1;
  out_.recv_elems = (stage_ <= 1) ? l.chunk_elems : l.shard_elems;
  TierNeed& d = out_.device;
  d.Add(Part(
      "fp32 gradient buffers for the largest module's " + Chunks(out_.max_module_chunks) + " and one more",
      out_.grad_buffers * l.chunk_elems * 4ull, NeedScale::kChunk));
  if (RunChunks() > 0) {
    d.Add(Part("fp32 gradient buffers of the tensors larger than a chunk (" + Chunks(RunChunks()) + ")",
               RunGradBytes(), NeedScale::kModel));
  }
  d.Add(Part(std::string("the fp32 reduce buffer (one ") + (stage_ <= 1 ? "chunk)" : "shard)"),
             out_.recv_elems * 4, NeedScale::kChunk, "", stage_ > 1));
  if (stage_ < 3) {
    d.Add(Part(
        "every chunk's " + dt + " compute parameters (stage " + std::to_string(stage_) +
            " keeps the whole model on each device)",
        n_chunks * chunk16, NeedScale::kModel,
        "zero_optimization.stage 3 with offload_param.device \"cpu\" or \"nvme\" (it gathers a module at a "
        "time)"));
  } else {
    // The running module's chunks, and the chunks of small tensors only, which stay
    // gathered whatever the budget, as DeepSpeed's do; more if it fits.
    const KeepPlan persist = PlanKeep(l, trace_, 0, config_.zero.stage3_param_persistence_threshold, 0);
    out_.fixed_gather = PeakGathered(l, trace_, persist.kept, /*window=*/0);
    const int module_peak = PeakGathered(l, trace_, {}, /*window=*/0);
    d.Add(Part("the largest module's gathered " + dt + " parameters (" + Chunks(module_peak) + ")",
               module_peak * chunk16, NeedScale::kChunk));
    if (RunChunks() > 0) {
      d.Add(Part("the gathered " + dt + " parameters of the tensors larger than a chunk (" +
                     Chunks(RunChunks()) + ")",
                 RunParamBytes(), NeedScale::kModel));
    }
    d.Add(Part(
        Chunks(out_.fixed_gather - module_peak) + " kept gathered for stage3_param_persistence_threshold",
        (out_.fixed_gather - module_peak) * chunk16, NeedScale::kChunk,
        "lower zero_optimization.stage3_param_persistence_threshold"));
    if (param_tier_ == ZeroTier::kDevice) {
      d.Add(Part("the " + dt + " parameter shards", n_chunks * l.shard_elems * csize_, NeedScale::kModel,
                 "offload_param.device \"cpu\" or \"nvme\"", true));
    }
    PlanExplicitParamShards(d, "param_on_device", config_.strata.param_on_device, DeviceShardBytes());
  }
  const int on_device = DeviceChunkCount();
  out_.opt_on_device.clear();
  if (on_device > 0) {
    // The chunks the backward finishes last: stepped on the device right after it, they
    // take the tail of the CPU optimizer's work off the step's critical path.
    out_.opt_on_device.assign(n_chunks, 0);
    const std::vector<int> by_last_use = ResidencyOrder(l, trace_);
    for (int i = 0; i < on_device; ++i) out_.opt_on_device[by_last_use[i]] = 1;
  }
  out_.out16_on_device =
      stage_ == 3 && (opt_tier_ == ZeroTier::kDevice || on_device > 0) && !facts_.host_accessible;
  if (out_.out16_on_device) {
    d.Add(Part("the optimizer's " + dt + " output staging (one shard)", opt_elems_ * csize_,
               NeedScale::kChunk, "", true));
  }
  if (opt_tier_ == ZeroTier::kDevice) {
    d.Add(Part("the optimizer state (fp32 master, m and v) and fp32 gradient shards",
               n_chunks * 16 * opt_elems_, NeedScale::kModel, OffloadOptimizerFromDevice(stage_),
               stage_ >= 1));
  }
  if (on_device > 0) {
    char ratio[32];
    std::snprintf(ratio, sizeof(ratio), "%g", config_.zero.offload_optimizer.ratio);
    d.Add(Part("the optimizer state (fp32 master, m and v) and fp32 gradient shards of the " +
                   Chunks(on_device) + " kept on the device (offload_optimizer.ratio " + ratio + ")",
               on_device * 16ull * opt_elems_, NeedScale::kModel,
               "raise zero_optimization.offload_optimizer.ratio", true));
  }
}

int EnginePlanner::DeviceChunkCount() const {
  if (opt_tier_ != ZeroTier::kHost) return 0;
  const int n = layout_.num_chunks;
  return n - ResidentCount(n, config_.zero.offload_optimizer.ratio);
}

void EnginePlanner::PlanHostNeed() {
  PlanHostNeedAs(/*stream=*/false, /*stream_grads=*/false);
  // Streaming reads every gather from the disk (no shard kept from the step) and lets
  // one gradient shard wait instead of two: slower, so only where whole shards do not
  // fit, and only where it saves something (a shard of more than two halves). Where
  // that one shard does not fit either, the gradients go to disk and back in pieces,
  // which costs a write and a read of 4 bytes per parameter each step.
  const bool helps = stage_ == 3 && opt_tier_ == ZeroTier::kNvme && out_.pieces.pieces > 2 * kStreamPieces;
  auto fits = [&] { return out_.host.Total() <= out_.host_budget.bytes; };
  if (!helps || fits()) return;
  out_.host = TierNeed{ZeroTier::kHost, {}};
  PlanHostNeedAs(/*stream=*/true, /*stream_grads=*/false);
  if (fits() || out_.grad_tier != ZeroTier::kNvme) return;
  out_.host = TierNeed{ZeroTier::kHost, {}};
  PlanHostNeedAs(/*stream=*/true, /*stream_grads=*/true);
}

bool EnginePlanner::GradsTouchDisk() const {
  return out_.stream_grads || !overlap_ || config_.gradient_clipping > 0 ||
         config_.gradient_accumulation_steps > 1;
}

uint64_t EnginePlanner::GradDiskBytes() const {
  return out_.stream_grads ? out_.pieces.ShardSlotBytes(4) : out_.grad_slot_bytes;
}

void EnginePlanner::PlanHostNeedAs(bool stream, bool stream_grads) {
  const Layout& l = layout_;
  const uint64_t n_chunks = l.num_chunks, out16 = Align4K(opt_elems_ * csize_);
  const std::string dt(DTypeName(compute_));
  TierNeed& h = out_.host;
  out_.grad_tier = opt_tier_ == ZeroTier::kDevice ? ZeroTier::kDevice : ZeroTier::kHost;
  out_.stream_pieces = stream ? kStreamPieces : 0;
  out_.stream_grads = false;
  out_.param_stage_bytes = stream ? 2ull * kStreamPieces * out_.pieces.SlotBytes(csize_) : out16;
  if (stage_ == 3 && param_tier_ == ZeroTier::kHost) {
    h.Add(Part("the " + dt + " parameter shards", n_chunks * Align4K(l.shard_elems * csize_),
               NeedScale::kModel, "offload_param.device \"nvme\"", true));
  }
  PlanExplicitParamShards(h, "param_resident", config_.strata.param_resident, ParamShardBytes());
  // Streamed with the parameters off NVMe: no gather needs staging, and the step's values
  // go out in pieces (below).
  const bool staging = !(stream && param_tier_ != ZeroTier::kNvme);
  out_.param_staging = 0;
  if (staging && (stage_ == 3 || opt_tier_ != ZeroTier::kDevice)) {
    out_.param_staging = kParamStaging;
    h.Add(stream ? Part("staging for " + std::to_string(kParamStaging) + " gathers of " + dt +
                            " parameters, streamed " + std::to_string(kStreamPieces) + " pieces at a time",
                        kParamStaging * out_.param_stage_bytes, NeedScale::kFixed,
                        "lower zero_optimization.sub_group_size (smaller NVMe optimizer pieces)")
                 : Part("staging for " + std::to_string(kParamStaging) + " " + dt + " parameter shards",
                        kParamStaging * out16, NeedScale::kChunk, "", stage_ >= 1));
  }
  if (opt_tier_ == ZeroTier::kHost) {
    const uint64_t on_host = n_chunks - DeviceChunkCount();
    h.Add(Part("the optimizer state (fp32 master, m and v) and fp32 gradient shards" +
                   (on_host < n_chunks ? " of the " + Chunks(on_host) + " the CPU steps" : std::string()),
               on_host * (out_.opt_set_bytes + out_.grad_slot_bytes), NeedScale::kModel,
               stage_ == 3 ? "offload_optimizer.device \"nvme\""
                           : "zero_optimization.stage 3 with offload_optimizer.device \"nvme\"",
               true));
  }
  if (opt_tier_ == ZeroTier::kNvme) {
    h.Add(Part("one NVMe optimizer staging set (a piece's fp32 master, m and v)", out_.opt_set_bytes,
               out_.pieces.pieces > 1 ? NeedScale::kFixed : NeedScale::kChunk,
               out_.pieces.pieces > 1
                   ? "lower zero_optimization.sub_group_size (smaller NVMe optimizer pieces)"
                   : "",
               out_.pieces.pieces == 1));
  }
  const int resident = PlanExplicitResidency(h);
  if (out_.grad_tier != ZeroTier::kDevice) {
    const uint64_t recv_elems = RecvStagingElems(), recv = Align4K(recv_elems * 4);
    const bool whole = recv_elems == static_cast<uint64_t>(opt_elems_);
    h.Add(Part(whole ? "the fp32 gradient receive buffer (one shard)"
                     : "the fp32 gradient receive buffer (one " + FormatBytes(recv) + " piece of a shard)",
               recv, whole ? NeedScale::kChunk : NeedScale::kFixed, "", whole));
  }
  out_.host_budget = facts_.host_budget(h.Total() > 0);
  if (stream && !out_.param_from_master) {
    h.Add(Part("pinned pieces of " + dt + " parameters on their way " +
                   (param_tier_ == ZeroTier::kNvme ? "to NVMe" : "from the optimizer") + " (" +
                   std::to_string(kStreamWritePieces) + ")",
               kStreamWritePieces * out_.pieces.SlotBytes(csize_), NeedScale::kFixed,
               "lower zero_optimization.sub_group_size (smaller NVMe optimizer pieces)"));
  }
  if (out_.publish_behind && !stream) {
    h.Add(Part(std::to_string(kOut16Staging) + " " + dt + " parameter shards on their way to NVMe",
               kOut16Staging * out16, NeedScale::kChunk, "", true));
  }
  if (opt_tier_ == ZeroTier::kNvme) PlanNvmeGradients(h, stream, stream_grads, resident);
}

void EnginePlanner::PlanNvmeGradients(TierNeed& h, bool stream, bool stream_grads, int resident) {
  const uint64_t n_chunks = layout_.num_chunks;
  // Gradient shards wait for the step in pinned memory if the budget holds them
  // (no extra I/O), else on NVMe beside the state: at least two pinned shards, which
  // also hold a shard read back for a step that needs it from disk.
  // Every shard pinned, beside the pipeline depth kept shards would leave the state
  // (residency_plan.h): the same budget then never gives the state fewer sets with the
  // shards off the disk than with most of them kept on its path.
  const uint64_t on_host =
      h.Total() + n_chunks * out_.grad_slot_bytes +
      PipelineFloorSets(static_cast<int>(n_chunks) - resident, out_.pieces.pieces) * out_.opt_set_bytes;
  const std::string& want = config_.strata.gradients;
  // With overlap on and clipping off no step is ever redone, so a shard on the NVMe
  // path never touches the disk (engine_grads.cc): auto takes it then even when the
  // budget would hold the shards, and the freed memory deepens the staging pipeline
  // (100M-parameter stage-3 step at 1200 MiB: 1.70 s against 1.82 s in memory). Not
  // with gradient accumulation: every micro-batch but the last writes and reads back
  // each shard there. Then auto keeps as many shards pinned as the budget holds
  // (PlanExtras), and only the rest take the disk path.
  const double kept_share = config_.strata.gradient_resident;
  if (want == "nvme" || kept_share >= 0 ||
      (want == "auto" && (!GradsTouchDisk() || on_host > out_.host_budget.bytes))) {
    out_.grad_tier = ZeroTier::kNvme;
    const int waiting = stream ? 1 : 2;
    out_.stream_grads = stream_grads;
    if (stream_grads) {
      h.Add(Part("pinned pieces of fp32 gradients on their way to NVMe (" + std::to_string(kGradWritePieces) +
                     ") and back (" + std::to_string(kGradReadPieces) + ")",
                 (kGradWritePieces + kGradReadPieces) * Align4K(out_.pieces.piece_elems * 4),
                 NeedScale::kFixed,
                 "lower zero_optimization.sub_group_size (smaller NVMe optimizer pieces)"));
    } else {
      h.Add(Part(waiting == 1 ? "1 fp32 gradient shard on its way to NVMe"
                              : "2 fp32 gradient shards on their way to NVMe",
                 waiting * out_.grad_slot_bytes, NeedScale::kChunk, "", true));
    }
    h.Add(Part("the fp32 gradient shards of the " + Chunks(resident) + " kept in memory",
               resident * out_.grad_slot_bytes, NeedScale::kModel, "lower strata.optimizer_resident", true));
    const int kept = kept_share < 0 ? 0 : ResidentCount(n_chunks, kept_share) - resident;
    if (kept > 0) {
      char text[32];
      std::snprintf(text, sizeof(text), "%g", kept_share);
      h.Add(Part("the fp32 gradient shards of " + Chunks(kept) +
                     " more kept in memory (strata.gradient_resident " + text + ")",
                 kept * out_.grad_slot_bytes, NeedScale::kModel, "lower strata.gradient_resident", true));
    }
  } else {
    h.Add(Part("the fp32 gradient shards", n_chunks * out_.grad_slot_bytes, NeedScale::kModel,
               want == "host" ? "strata.gradients \"nvme\"" : "", true));
  }
}

int EnginePlanner::PlanExplicitResidency(TierNeed& h) {
  if (opt_tier_ != ZeroTier::kNvme || config_.strata.optimizer_resident < 0) return 0;
  const int count = ResidentCount(layout_.num_chunks, config_.strata.optimizer_resident);
  char fraction[32];
  std::snprintf(fraction, sizeof(fraction), "%g", config_.strata.optimizer_resident);
  h.Add(Part("the optimizer state (fp32 master, m and v) of the " + Chunks(count) +
                 " kept in memory (strata.optimizer_resident " + fraction + ")",
             count * ResidentStateBytes(), NeedScale::kModel, "lower strata.optimizer_resident", true));
  return count;
}

void EnginePlanner::PlanExplicitParamShards(TierNeed& need, const char* key, double fraction,
                                            uint64_t shard_bytes) {
  if (!ParamsSwapped() || fraction < 0) return;
  const int count = ResidentCount(layout_.num_chunks, fraction);
  char text[32];
  std::snprintf(text, sizeof(text), "%g", fraction);
  const bool device = need.tier == ZeroTier::kDevice;
  need.Add(Part("the " + std::string(DTypeName(compute_)) + " parameter shards of the " + Chunks(count) +
                    (device ? " kept on the device" : " kept in memory") + " (strata." + key + " " + text +
                    ")",
                count * shard_bytes, NeedScale::kModel, std::string("lower strata.") + key, true));
}

void EnginePlanner::PlanNvmeNeed() {
  const Layout& l = layout_;
  const uint64_t n_chunks = l.num_chunks;
  // More disks, each with its share: the key that lists a store's directories.
  auto more_disks = [&](const OffloadConfig& offload, const char* key) {
    return std::string("stripe the swap over more disks (several directories in ") +
           (offload.nvme_path.empty() ? "strata.swap_paths" : key) + ")";
  };
  const OffloadConfig& oo = config_.zero.offload_optimizer;
  const std::string opt_disks = more_disks(oo, "zero_optimization.offload_optimizer.nvme_path");
  if (stage_ == 3 && param_tier_ == ZeroTier::kNvme && !out_.param_from_master) {
    const OffloadConfig& op = config_.zero.offload_param;
    out_.nvme.Add(Part("the " + std::string(DTypeName(compute_)) + " parameter shards" +
                           (out_.stream_pieces > 0 ? ", a slot per piece" : ""),
                       n_chunks * (out_.stream_pieces > 0 ? out_.pieces.ShardSlotBytes(csize_)
                                                          : Align4K(l.shard_elems * csize_)),
                       NeedScale::kModel, more_disks(op, "zero_optimization.offload_param.nvme_path"), true,
                       SwapPaths(config_, op)));
  }
  if (opt_tier_ == ZeroTier::kNvme) {
    out_.nvme.Add(Part("the optimizer state (fp32 master, m and v, in two slots: committed and next)",
                       2 * n_chunks * out_.pieces.pieces * out_.opt_set_bytes, NeedScale::kModel, opt_disks,
                       true, SwapPaths(config_, oo)));
  }
  if (out_.grad_tier == ZeroTier::kNvme) {
    out_.nvme.Add(
        Part(out_.stream_grads ? "the fp32 gradient shards, a slot per piece" : "the fp32 gradient shards",
             n_chunks * GradDiskBytes(), NeedScale::kModel, opt_disks, true, SwapPaths(config_, oo)));
  }
}

Status EnginePlanner::CheckParamKeys() const {
  for (const auto& [key, fraction] :
       {std::pair<const char*, double>{"param_resident", config_.strata.param_resident},
        {"param_on_device", config_.strata.param_on_device}}) {
    if (out_.param_from_master && fraction > 0) {
      return InvalidArgumentError(
          std::string("strata.") + key +
          ": with fp32 compute and both the optimizer state and the parameters on NVMe, a gather reads the "
          "parameter shard from the optimizer's master, so there is no parameter swap to keep in memory; "
          "strata.optimizer_resident keeps chunks (their master included) in memory instead");
    }
  }
  const int n = layout_.num_chunks;
  const int host_count =
      config_.strata.param_resident >= 0 ? ResidentCount(n, config_.strata.param_resident) : 0;
  const int device_count =
      config_.strata.param_on_device >= 0 ? ResidentCount(n, config_.strata.param_on_device) : 0;
  if (host_count + device_count > n) {
    return InvalidArgumentError(
        "strata.param_resident and strata.param_on_device: together they keep " +
        std::to_string(host_count + device_count) + " parameter shards off the disk, and there are " +
        std::to_string(n) +
        " chunks; lower one of them, or leave one \"auto\" (it takes what the other leaves)");
  }
  return OkStatus();
}

Status EnginePlanner::PlanMemory() {
  PlanPieces();
  STRATA_RETURN_IF_ERROR(CheckParamKeys());
  PlanDeviceNeed();
  out_.device_budget = facts_.device_budget;
  PlanHostNeed();
  PlanNvmeNeed();
  PlanShape shape;
  shape.stage = stage_;
  shape.world_size = world_size_;
  shape.opt_tier = opt_tier_;
  shape.opt_on_device_too = DeviceChunkCount() > 0;
  shape.param_tier = param_tier_;
  shape.num_params = layout_.num_params;
  shape.chunk_elems = layout_.chunk_elems;
  for (int64_t n : layout_.module_params) shape.largest_module = std::max(shape.largest_module, n);
  shape.chunk_size = config_.strata.chunk_size;
  // NVMe first: a model too large for the disk is refused for that, however the memory
  // tiers are set; nothing is created on disk before this.
  const TierVerdict nvme = CheckNvme(out_.nvme, config_.strata.nvme_budget,
                                     IoEngineOptions::FromConfig(config_).block_size, shape);
  const TierVerdict dev = CheckTier(out_.device, out_.device_budget, shape);
  const TierVerdict host = CheckTier(out_.host, out_.host_budget, shape);
  return Refuse({&nvme, &dev, &host});
}

EnginePlanner::EnginePlanner(const PlanFacts& facts)
    : facts_(facts),
      config_(*facts.config),
      layout_(*facts.layout),
      trace_(*facts.trace),
      stage_(facts.stage),
      world_size_(facts.world_size),
      opt_tier_(facts.opt_tier),
      param_tier_(facts.param_tier),
      compute_(facts.compute),
      csize_(DTypeSize(facts.compute)),
      opt_elems_(facts.opt_elems),
      opt_offset_(facts.opt_offset),
      overlap_(facts.overlap) {
  // Gradients wait beside a CPU optimizer's state; PlanHostNeed may send them to NVMe.
  out_.grad_tier = opt_tier_ == ZeroTier::kDevice ? ZeroTier::kDevice : ZeroTier::kHost;
}

uint64_t EnginePlanner::RecvStagingElems() const {
  return std::min<uint64_t>(
      {static_cast<uint64_t>(opt_elems_), kRecvStagingBytes / 4, config_.zero.sub_group_size});
}

Result<EnginePlan> EnginePlanner::Plan() {
  out_.recv_staging_elems = RecvStagingElems();
  STRATA_RETURN_IF_ERROR(PlanMemory());
  PlanExtras();
  return std::move(out_);
}

Result<EnginePlan> PlanEngine(const PlanFacts& facts) { return EnginePlanner(facts).Plan(); }

}  // namespace strata::zero
