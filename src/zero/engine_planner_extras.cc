// What the budgets leave after the fixed needs (engine_planner.cc) goes to optional parts:
// speculation spares, NVMe staging depth, pinned gradient shards and, at stage 3, the
// gather buffers for prefetching and for chunks kept between their uses.
#include <algorithm>

#include "zero/engine_planner.h"
#include "zero/residency_plan.h"

namespace strata::zero {

void EnginePlanner::PlanExtras() {
  const uint64_t n_chunks = layout_.num_chunks;
  uint64_t dev = out_.device.Total(), host = out_.host.Total();
  const uint64_t budget = out_.host_budget.bytes;
  auto host_room = [&] { return budget > host ? budget - host : 0; };
  out_.opt_staging_count = 0;
  // Parameter staging beyond the fixed buffers comes before the residency below, as the
  // optimizer's staging sets do: three more shard buffers let the 85M GPT's gathers run
  // three modules ahead instead of one (both on NVMe: the hooks waited 0.32 s a step
  // instead of 0.42), where a resident chunk of the same pinned bytes would save about
  // 40 ms of disk time. Not where the residency keeps every shard off the disk anyway.
  int staging = ExtraParamStaging(host_room());
  auto staging_bytes = [&] { return staging * out_.param_stage_bytes; };
  if (staging > 0 && ParamsSwapped()) {
    const KeptShards kept = KeptParamShards(host_room());
    if (kept.device + kept.host >= static_cast<int>(n_chunks)) staging = 0;
  }
  if (opt_tier_ == ZeroTier::kNvme) {
    // Staging sets deepen the pipeline (read ahead, step, write behind); what a full
    // pipeline leaves keeps chunks resident (residency_plan.h).
    ResidencyInputs in;
    in.layout = &layout_;
    in.trace = &trace_;
    in.pieces = out_.pieces.pieces;
    in.set_bytes = out_.opt_set_bytes;
    in.grad_bytes = out_.grad_tier == ZeroTier::kNvme ? out_.grad_slot_bytes : 0;
    in.chunk_bytes = ResidentStateBytes() + in.grad_bytes;
    in.room = host_room();
    in.fraction = config_.strata.optimizer_resident;
    in.grad_fraction = config_.strata.gradient_resident;
    in.keep_grads = config_.strata.gradients == "auto" && GradsTouchDisk();
    in.grads_first = config_.gradient_accumulation_steps > 1;
    ResidencyPlan r = PlanResidency(in);
    if (staging > 0 && out_.param_from_master) {
      if (r.count == static_cast<int>(n_chunks)) {
        staging = 0;  // every shard comes from a resident master
      } else {
        in.room -= staging_bytes();
        r = PlanResidency(in);
      }
    }
    out_.opt_resident = std::move(r.resident);
    out_.grad_resident = r.grad_count > 0 ? std::move(r.grad_resident) : std::vector<uint8_t>{};
    out_.opt_staging_count = r.staging_sets;
    host += r.extra_bytes;
  }
  if (staging > 0) {
    out_.param_staging += staging;
    host += staging_bytes();
  }
  out_.grad_host_count = 0;
  if (out_.grad_tier == ZeroTier::kNvme && !out_.stream_grads) {
    // Shards beyond the fixed ones let the reductions run ahead of a slower optimizer.
    const int fixed = out_.stream_pieces > 0 ? 1 : 2;
    out_.grad_host_count =
        fixed + static_cast<int>(std::min<uint64_t>(2, host_room() / out_.grad_slot_bytes));
    host += (out_.grad_host_count - fixed) * out_.grad_slot_bytes;
  }
  // Resident parameter shards before speculation spares: a shard on NVMe is read by a
  // serial fetch the forward waits for, while a spare only lets a chunk's CPU step
  // overlap the backward (100M MLP, optimizer on the CPU, 2.5 GiB: 543-584 ms with 6
  // spares and 1 resident shard, 377-405 ms with all 17 resident and no spare).
  host += PlanParamResidency(host_room());
  out_.spares = 0;
  out_.gather = {};
  auto plan_device = [&] {
    if (stage_ == 3) dev += PlanGatherBuffers(out_.device_budget.bytes - dev);
    // What the window and the kept chunks leave keeps parameter shards on the device.
    dev += PlanParamDevice(out_.device_budget.bytes > dev ? out_.device_budget.bytes - dev : 0);
  };
  // A device optimizer's spares come after the gather window and the device shards: a
  // chunk kept from the forward to the backward saves a gather every step, while a
  // spare only overlaps a device step (fast beside the backward) with it. Spares first
  // made a larger device budget keep fewer chunks.
  if (opt_tier_ == ZeroTier::kDevice) plan_device();
  if (overlap_ && opt_tier_ != ZeroTier::kNvme) {
    const uint64_t room = opt_tier_ == ZeroTier::kDevice
                              ? (out_.device_budget.bytes > dev ? out_.device_budget.bytes - dev : 0)
                              : host_room();
    // Device chunks of a CPU optimizer step in place (StepsInPlace): no spare for them.
    const uint64_t speculating = n_chunks - DeviceChunkCount();
    out_.spares =
        static_cast<int>(std::min<uint64_t>(speculating, room / std::max<uint64_t>(out_.opt_set_bytes, 1)));
    if (opt_tier_ == ZeroTier::kDevice)
      dev += out_.spares * 12ull * opt_elems_;
    else
      host += out_.spares * out_.opt_set_bytes;
  }
  if (opt_tier_ != ZeroTier::kDevice) plan_device();
  out_.device_need = dev;
  out_.host_need = host;
  // The disk was checked for every chunk (before residency was chosen); the stores hold
  // slots only for the chunks on disk (OpenNvmeStores, OpenGradStore).
  const uint64_t resident = std::count(out_.opt_resident.begin(), out_.opt_resident.end(), 1);
  const uint64_t grads_kept = std::count(out_.grad_resident.begin(), out_.grad_resident.end(), 1);
  const uint64_t per_resident = opt_tier_ == ZeroTier::kNvme
                                    ? 2ull * out_.pieces.pieces * out_.opt_set_bytes +
                                          (out_.grad_tier == ZeroTier::kNvme ? GradDiskBytes() : 0)
                                    : 0;
  const uint64_t param_slot = out_.stream_pieces > 0 && !out_.param_from_master
                                  ? out_.pieces.ShardSlotBytes(csize_)
                                  : ParamShardBytes();
  const uint64_t params_off_disk =
      static_cast<uint64_t>(out_.param_resident_chunks + out_.param_device_chunks) * param_slot;
  out_.nvme_need =
      out_.nvme.Total() - resident * per_resident - grads_kept * GradDiskBytes() - params_off_disk;
}

uint64_t EnginePlanner::PlanParamResidency(uint64_t room) {
  out_.param_tiers.clear();
  out_.param_resident_chunks = out_.param_device_chunks = 0;
  if (!ParamsSwapped()) return 0;
  const KeptShards kept = KeptParamShards(room);
  MoveParamShards(ZeroTier::kDevice, kept.device);
  MoveParamShards(ZeroTier::kHost, kept.host);
  // An explicit count is in the fixed needs.
  return config_.strata.param_resident >= 0 ? 0 : kept.host * ParamShardBytes();
}

EnginePlanner::KeptShards EnginePlanner::KeptParamShards(uint64_t room) const {
  const int n = layout_.num_chunks;
  KeptShards k;
  // An explicit device share is a fixed need (PlanExplicitParamShards): it takes the
  // first chunks; an auto one takes what the gather buffers leave (PlanParamDevice).
  if (config_.strata.param_on_device >= 0) k.device = ResidentCount(n, config_.strata.param_on_device);
  k.host = config_.strata.param_resident >= 0
               ? ResidentCount(n, config_.strata.param_resident)
               : static_cast<int>(std::min<uint64_t>(n - k.device, room / ParamShardBytes()));
  return k;
}

int EnginePlanner::ExtraParamStaging(uint64_t room) const {
  if (stage_ != 3 || param_tier_ != ZeroTier::kNvme || out_.stream_pieces > 0 || out_.param_staging == 0)
    return 0;
  const uint64_t want = std::min<uint64_t>(out_.max_module_chunks * kFetchWindowModules, layout_.num_chunks);
  if (want <= static_cast<uint64_t>(out_.param_staging)) return 0;
  return static_cast<int>(
      std::min<uint64_t>(want - out_.param_staging, room / std::max<uint64_t>(out_.param_stage_bytes, 1)));
}

uint64_t EnginePlanner::PlanParamDevice(uint64_t room) {
  if (!ParamsSwapped() || config_.strata.param_on_device >= 0) return 0;
  const uint64_t on_disk = layout_.num_chunks - out_.param_resident_chunks - out_.param_device_chunks;
  const int count = static_cast<int>(std::min(on_disk, room / DeviceShardBytes()));
  MoveParamShards(ZeroTier::kDevice, count);
  return count * DeviceShardBytes();
}

void EnginePlanner::MoveParamShards(ZeroTier tier, int count) {
  if (count <= 0) return;
  if (out_.param_tiers.empty()) out_.param_tiers.assign(layout_.num_chunks, param_tier_);
  for (int c : ParamResidencyOrder(layout_, trace_)) {
    if (count == 0) break;
    if (out_.param_tiers[c] != param_tier_) continue;
    out_.param_tiers[c] = tier;
    --count;
    ++(tier == ZeroTier::kHost ? out_.param_resident_chunks : out_.param_device_chunks);
  }
}

uint64_t EnginePlanner::PlanGatherBuffers(uint64_t room) {
  GatherInputs in;
  in.layout = &layout_;
  in.trace = &trace_;
  in.zero = &config_.zero;
  in.micro_batches = config_.gradient_accumulation_steps;
  in.chunk_bytes = layout_.chunk_elems * csize_;
  in.max_module_chunks = static_cast<int>(out_.max_module_chunks);
  in.fixed_buffers = out_.fixed_gather;
  in.room = room;
  if (param_tier_ == ZeroTier::kNvme && out_.param_resident_chunks < layout_.num_chunks) {
    in.staging_limit = out_.param_staging;
  }
  const GatherPlanResult r = PlanGather(in);
  out_.gather = r.plan;
  return r.extra_bytes;
}

}  // namespace strata::zero
