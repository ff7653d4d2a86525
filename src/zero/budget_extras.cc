// What the budgets leave after the fixed needs (budget_plan.cc) goes to optional parts:
// speculation spares, NVMe staging depth, pinned gradient shards and, at stage 3, the
// gather buffers for prefetching and for chunks kept between their uses.
#include <algorithm>

#include "zero/engine_impl.h"
#include "zero/gather_plan.h"
#include "zero/residency_plan.h"

namespace strata {
void Engine::Impl::PlanExtras(MemoryPlan& p) {
  const uint64_t n_chunks = layout.num_chunks;
  uint64_t dev = p.device.Total(), host = p.host.Total();
  const uint64_t budget = p.host_budget.bytes;
  auto host_room = [&] { return budget > host ? budget - host : 0; };
  opt_staging_count = 0;
  if (opt_tier == ZeroTier::kNvme) {
    // Staging sets deepen the pipeline (read ahead, step, write behind); what a full
    // pipeline leaves keeps chunks resident (residency_plan.h).
    zero::ResidencyInputs in;
    in.layout = &layout;
    in.trace = &order->trace();
    in.pieces = piece_shape.pieces;
    in.set_bytes = opt_set_bytes;
    in.chunk_bytes = ResidentStateBytes() + (grad_tier == ZeroTier::kNvme ? grad_slot_bytes : 0);
    in.room = host_room();
    in.fraction = config.strata.optimizer_resident;
    zero::ResidencyPlan r = zero::PlanResidency(in);
    opt_resident = std::move(r.resident);
    opt_staging_count = r.staging_sets;
    host += r.extra_bytes;
  }
  grad_host_count = 0;
  if (grad_tier == ZeroTier::kNvme) {
    // Shards beyond two let the reductions run ahead of a slower optimizer.
    grad_host_count = 2 + static_cast<int>(std::min<uint64_t>(2, host_room() / grad_slot_bytes));
    host += (grad_host_count - 2) * grad_slot_bytes;
  }
  // Resident parameter shards before speculation spares: a shard on NVMe is read by a
  // serial fetch the forward waits for, while a spare only lets a chunk's CPU step
  // overlap the backward (100M MLP, optimizer on the CPU, 2.5 GiB: 543-584 ms with 6
  // spares and 1 resident shard, 377-405 ms with all 17 resident and no spare).
  host += PlanParamResidency(host_room());
  p.spares = 0;
  if (overlap && opt_tier != ZeroTier::kNvme) {
    const uint64_t room = opt_tier == ZeroTier::kDevice ? p.device_budget.bytes - dev : host_room();
    // Device chunks of a CPU optimizer step in place (StepsInPlace): no spare for them.
    const uint64_t speculating = n_chunks - DeviceChunkCount();
    p.spares = static_cast<int>(std::min<uint64_t>(speculating, room / std::max<uint64_t>(opt_set_bytes, 1)));
    if (opt_tier == ZeroTier::kDevice)
      dev += p.spares * 12ull * opt_elems;
    else
      host += p.spares * opt_set_bytes;
  }
  gather_plan = {};
  if (stage == 3) dev += PlanGatherBuffers(p, p.device_budget.bytes - dev);
  info.device_need = dev;
  info.host_need = host;
  // The disk was checked for every chunk (before residency was chosen); the stores hold
  // slots only for the chunks on disk (OpenNvmeStores, OpenGradStore).
  const uint64_t resident = std::count(opt_resident.begin(), opt_resident.end(), 1);
  const uint64_t per_resident =
      opt_tier == ZeroTier::kNvme
          ? 2ull * piece_shape.pieces * opt_set_bytes + (grad_tier == ZeroTier::kNvme ? grad_slot_bytes : 0)
          : 0;
  const uint64_t params_off_disk = info.param_resident_chunks * ParamShardBytes();
  info.nvme_need = p.nvme.Total() - resident * per_resident - params_off_disk;
}

uint64_t Engine::Impl::PlanParamResidency(uint64_t room) {
  param_resident.clear();
  info.param_resident_chunks = 0;
  if (!ParamsSwapped()) return 0;
  const uint64_t n = layout.num_chunks, shard = ParamShardBytes();
  const bool explicit_count = config.strata.param_resident >= 0;
  const int count = explicit_count ? zero::ResidentCount(static_cast<int>(n), config.strata.param_resident)
                                   : static_cast<int>(std::min(n, room / shard));
  if (count == 0) return 0;
  param_resident.assign(n, 0);
  const std::vector<int> by_first_use = zero::ParamResidencyOrder(layout, order->trace());
  for (int i = 0; i < count; ++i) param_resident[by_first_use[i]] = 1;
  info.param_resident_chunks = count;
  return explicit_count ? 0 : count * shard;  // an explicit count is in the fixed needs
}

uint64_t Engine::Impl::PlanGatherBuffers(const MemoryPlan& p, uint64_t room) {
  zero::GatherInputs in;
  in.layout = &layout;
  in.trace = &order->trace();
  in.zero = &config.zero;
  in.micro_batches = config.gradient_accumulation_steps;
  in.chunk_bytes = layout.chunk_elems * csize;
  in.max_module_chunks = static_cast<int>(p.max_module_chunks);
  in.fixed_buffers = p.fixed_gather;
  in.room = room;
  if (param_tier == ZeroTier::kNvme && info.param_resident_chunks < layout.num_chunks) {
    in.staging_limit = kParamStaging;
  }
  const zero::GatherPlanResult r = zero::PlanGather(in);
  gather_plan = r.plan;
  info.kept_chunks = gather_plan.kept_count();
  info.carried_chunks = gather_plan.carried_count();
  return r.extra_bytes;
}

}  // namespace strata
