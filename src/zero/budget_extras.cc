// What the budgets leave after the fixed needs (budget_plan.cc) goes to optional parts:
// speculation spares, NVMe staging depth, pinned gradient shards and, at stage 3, the
// gather buffers for prefetching and for chunks kept between their uses.
#include <algorithm>

#include "zero/engine_impl.h"
#include "zero/keep_plan.h"
#include "zero/residency_plan.h"

namespace strata {
namespace {

// Gather buffers for at most this many modules ahead of the running one (stage 3,
// engine_gather.cc); the depth used is measured (prefetch_depth.h) within what the
// budget and DeepSpeed's keys leave of it.
constexpr uint64_t kMaxPrefetchModules = 8;

}  // namespace

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
    in.pieces = pieces;
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
  gather_buffers = 0;
  if (stage == 3) dev += PlanGatherBuffers(p, p.device_budget.bytes - dev);
  info.device_need = dev;
  info.host_need = host;
  // The disk was checked for every chunk (before residency was chosen); the stores hold
  // slots only for the chunks on disk (OpenNvmeStores, OpenGradStore).
  const uint64_t resident = std::count(opt_resident.begin(), opt_resident.end(), 1);
  const uint64_t per_resident =
      opt_tier == ZeroTier::kNvme
          ? 2ull * pieces * opt_set_bytes + (grad_tier == ZeroTier::kNvme ? grad_slot_bytes : 0)
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
  const zero::Layout& l = layout;
  const uint64_t n_chunks = l.num_chunks, chunk16 = l.chunk_elems * csize, module = p.max_module_chunks;
  // Room to gather up to kMaxPrefetchModules modules ahead of the running one, as the
  // budget allows.
  uint64_t extra = std::min<uint64_t>(module * (1 + kMaxPrefetchModules), n_chunks) - module;
  uint64_t cap = config.zero.stage3_max_live_parameters
                     ? std::max<uint64_t>(config.zero.stage3_max_live_parameters / l.chunk_elems, module)
                     : n_chunks;
  cap -= std::min<uint64_t>(cap, module);
  extra = std::min<uint64_t>({extra, room / chunk16, cap});
  // Shards on NVMe are read into kParamStaging pinned buffers; a gather beyond those
  // reads only when a buffer frees, on the serial fetch worker, so a deeper window
  // would hold device memory to queue (the 100M bench: 315 MiB of device instead of
  // 183, and no faster).
  if (param_tier == ZeroTier::kNvme && info.param_resident_chunks < layout.num_chunks) {
    extra = std::min<uint64_t>(extra, kParamStaging);
  }
  // DeepSpeed's stage3_prefetch_bucket_size counts parameters gathered ahead of need.
  if (config.zero.stage3_prefetch_bucket_size) {
    extra = std::min<uint64_t>(extra, config.zero.stage3_prefetch_bucket_size / l.chunk_elems);
  }
  // Less than one module's chunks ahead: no window at all (the buffers kept chunks hold
  // before their forward must not serve as one, or the plan's peak would not hold).
  max_prefetch_modules = static_cast<int>(extra / module);
  prefetch_modules = max_prefetch_modules;  // until a step has measured (MeasuredPrefetch)
  // What is left keeps chunks gathered from forward to backward, nearest reuse first,
  // instead of reading, copying and all-gathering them again (keep_plan.h): as many
  // as the buffers the budget allows hold at the trace's fullest point, which the
  // window and the kept chunks partly share (the last modules are both).
  const int fixed = p.fixed_gather;
  const int allowed = fixed + static_cast<int>(std::min<uint64_t>(room / chunk16, cap));
  auto plan = [&](int spare) {
    return zero::PlanKeep(l, order->trace(), config.zero.stage3_max_reuse_distance,
                          config.zero.stage3_param_persistence_threshold, spare);
  };
  auto peak = [&](const zero::KeepPlan& k) {
    return zero::PeakGathered(l, order->trace(), k.kept, max_prefetch_modules);
  };
  // The largest count in [0, n_chunks] whose plan fits (a plan's peak grows with it).
  auto largest_fitting = [&](auto peak_of) {
    int lo = 0, hi = static_cast<int>(n_chunks);
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (peak_of(mid) <= allowed)
        lo = mid;
      else
        hi = mid - 1;
    }
    return lo;
  };
  const zero::KeepPlan keep = plan(largest_fitting([&](int spare) { return peak(plan(spare)); }));
  kept_chunk = keep.kept;
  info.kept_chunks = keep.total();
  // With gradient accumulation, the chunks the end of backward used last and the next
  // micro-batch's forward uses first stay too, as the same buffers allow.
  const int micro_batches = std::max(config.gradient_accumulation_steps, 1);
  auto carry_peak = [&](int count) {
    const std::vector<uint8_t> carried =
        zero::PlanCarry(l, order->trace(), config.zero.stage3_max_reuse_distance, count);
    return zero::PeakGathered(l, order->trace(), kept_chunk, max_prefetch_modules, carried, micro_batches);
  };
  const int carry = micro_batches > 1 ? largest_fitting(carry_peak) : 0;
  carried_chunk = zero::PlanCarry(l, order->trace(), config.zero.stage3_max_reuse_distance, carry);
  info.carried_chunks = static_cast<int>(std::count(carried_chunk.begin(), carried_chunk.end(), 1));
  gather_buffers = std::max(carry_peak(carry), fixed);
  return (gather_buffers - fixed) * chunk16;
}

}  // namespace strata
