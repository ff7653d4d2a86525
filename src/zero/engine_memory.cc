// The engine's memory: the plan it follows (zero::PlanEngine with this engine's
// budgets), then the device buffers, the pinned host buffers, the optimizer and
// parameter shards on their tiers and the NVMe stores, allocated once at creation.
#include <algorithm>
#include <string>

#include "strata/log.h"
#include "strata/units.h"
#include "zero/engine_impl.h"

namespace strata {

Result<void*> Engine::Impl::DeviceAlloc(uint64_t bytes, const char* what) {
  auto r = device->Allocate(std::max<uint64_t>(bytes, 256));
  if (!r.ok()) return r.status().WithContext(std::string("engine: device memory for ") + what);
  device_allocs.push_back(*r);
  return *r;
}

Result<void*> Engine::Impl::HostAlloc(uint64_t bytes, const char* what) {
  auto r = arena->Allocate(zero::Align4K(std::max<uint64_t>(bytes, 4096)));
  if (!r.ok()) return r.status().WithContext(std::string("engine: pinned host memory for ") + what);
  host_blocks.push_back(*r);
  return r->data;
}

Status Engine::Impl::PlanLayout(zero::EnginePlan& plan) {
  const zero::Layout& l = layout;
  info.num_params = l.num_params;
  info.chunk_elems = l.chunk_elems;
  info.num_chunks = l.num_chunks;
  info.run_chunks = l.RunChunks();
  info.shard_elems = l.shard_elems;
  zero::PlanFacts facts;
  facts.config = &config;
  facts.layout = &layout;
  facts.trace = &order->trace();
  facts.stage = stage;
  facts.world_size = world_size;
  facts.opt_tier = opt_tier;
  facts.param_tier = param_tier;
  facts.compute = compute;
  facts.opt_elems = opt_elems;
  facts.opt_offset = opt_offset;
  facts.overlap = overlap;
  facts.host_accessible = device->host_accessible();
  STRATA_ASSIGN_OR_RETURN(facts.device_budget, DeviceBudget());
  facts.host_budget = [this](bool host_needed) { return HostBudget(host_needed); };
  STRATA_ASSIGN_OR_RETURN(plan, zero::PlanEngine(facts));
  TakePlan(plan);
  info.need_parts.clear();
  for (const zero::TierNeed* t : {&plan.device, &plan.host, &plan.nvme}) {
    for (const zero::NeedPart& part : t->parts)
      info.need_parts.push_back({std::string(zero::TierName(t->tier)), part.what, part.bytes});
  }
  info.gradients_on_nvme = grad_tier == ZeroTier::kNvme;
  info.optimizer_pieces = opt_tier == ZeroTier::kNvme ? piece_shape.pieces : 1;
  info.optimizer_piece_elems = opt_tier == ZeroTier::kNvme ? piece_shape.piece_elems : 0;
  info.optimizer_staging_sets = opt_staging_count;
  info.params_in_optimizer_state = param_from_master;
  info.optimizer_padding_pieces =
      static_cast<int>(std::count(piece_shape.live.begin(), piece_shape.live.end(), 0));
  info.optimizer_resident_chunks = static_cast<int>(std::count(opt_resident.begin(), opt_resident.end(), 1));
  info.optimizer_device_chunks = static_cast<int>(std::count(opt_on_device.begin(), opt_on_device.end(), 1));
  info.gradient_resident_chunks = static_cast<int>(std::count(grad_resident.begin(), grad_resident.end(), 1));
  // The chunks whose shard lives on disk; a resident chunk's master is its shard.
  const int params_on_disk = param_from_master
                                 ? l.num_chunks - info.optimizer_resident_chunks
                                 : l.num_chunks - info.param_resident_chunks - info.param_device_chunks;
  info.fresh_param_shards =
      publish_behind && stream_pieces == 0 ? std::min(zero::kOut16Staging, params_on_disk) : 0;
  info.param_stream_pieces = stream_pieces;
  info.gradient_pieces_on_nvme = stream_grads;
  STRATA_LOG(kDebug, "engine") << "layout: " << l.num_params << " params in " << l.num_chunks << " chunks of "
                               << l.chunk_elems << " (shard " << l.shard_elems << "); device "
                               << FormatBytes(info.device_need) << ", host " << FormatBytes(info.host_need)
                               << ", nvme " << FormatBytes(info.nvme_need) << "; spares " << plan.spares
                               << ", resident optimizer chunks " << info.optimizer_resident_chunks
                               << ", staging sets " << opt_staging_count << " of " << piece_shape.pieces
                               << " piece(s) per chunk, parameter staging " << param_staging_count
                               << ", gather buffers " << gather_plan.buffers << " (prefetch up to "
                               << gather_plan.max_prefetch_modules << " modules, " << info.kept_chunks
                               << " chunks kept from forward to backward, " << info.carried_chunks
                               << " carried between micro-batches)"
                               << (grad_tier != ZeroTier::kNvme ? ""
                                   : info.gradient_resident_chunks == 0
                                       ? "; gradients on NVMe"
                                       : "; gradients on NVMe but for " +
                                             std::to_string(info.gradient_resident_chunks) +
                                             " more chunks kept");
  return OkStatus();
}

void Engine::Impl::TakePlan(const zero::EnginePlan& plan) {
  piece_shape = plan.pieces;
  opt_set_bytes = plan.opt_set_bytes;
  grad_slot_bytes = plan.grad_slot_bytes;
  publish_behind = plan.publish_behind;
  param_from_master = plan.param_from_master;
  grad_tier = plan.grad_tier;
  opt_on_device = plan.opt_on_device;
  opt_resident = plan.opt_resident;
  grad_resident = plan.grad_resident;
  param_tiers = plan.param_tiers;
  grad_buffers = plan.grad_buffers;
  opt_staging_count = plan.opt_staging_count;
  grad_host_count = plan.grad_host_count;
  param_staging_count = plan.param_staging;
  param_stage_bytes = plan.param_stage_bytes;
  stream_pieces = plan.stream_pieces;
  stream_grads = plan.stream_grads;
  recv_staging_elems = plan.recv_staging_elems;
  gather_plan = plan.gather;
  info.param_resident_chunks = plan.param_resident_chunks;
  info.param_device_chunks = plan.param_device_chunks;
  info.kept_chunks = gather_plan.kept_count();
  info.carried_chunks = gather_plan.carried_count();
  info.device_need = plan.device_need;
  info.host_need = plan.host_need;
  info.nvme_need = plan.nvme_need;
}

Status Engine::Impl::AllocateMemory() {
  zero::EnginePlan plan;
  STRATA_RETURN_IF_ERROR(PlanLayout(plan));
  if (info.host_need > 0 && arena == nullptr) {
    HostArenaOptions ao;
    ao.bytes = info.host_need;
    STRATA_ASSIGN_OR_RETURN(own_arena, HostArena::Create(ao));
    arena = own_arena.get();
  }
  STRATA_RETURN_IF_ERROR(AllocateBuffers(plan));
  STRATA_RETURN_IF_ERROR(AllocateShards(plan));
  STRATA_RETURN_IF_ERROR(OpenNvmeStores());
  device->ResetHighWater();
  return OkStatus();
}

Status Engine::Impl::AllocateRuns(uint64_t elem_bytes, const char* what, std::vector<void*>& places) {
  const zero::Layout& l = layout;
  places.clear();
  if (l.RunChunks() == 0) return OkStatus();
  places.assign(l.num_chunks, nullptr);
  for (int c = 0; c < l.num_chunks; ++c) {
    if (l.run_first[c] != c) continue;
    const uint64_t chunk_bytes = l.chunk_elems * elem_bytes;
    STRATA_ASSIGN_OR_RETURN(void* p, DeviceAlloc(l.run_length[c] * chunk_bytes, what));
    // Padding must read as zero in every reduce and gather.
    STRATA_RETURN_IF_ERROR(ops->Zero(zero::OpsLane::kTraining, p, l.run_length[c] * chunk_bytes));
    for (int k = 0; k < l.run_length[c]; ++k) places[c + k] = static_cast<uint8_t*>(p) + k * chunk_bytes;
  }
  return OkStatus();
}

Status Engine::Impl::AllocateBuffers(const zero::EnginePlan& plan) {
  const zero::Layout& l = layout;
  zero::GradReducer::Options ro;
  ro.layout = &layout;
  ro.ops = ops.get();
  ro.comm = device_comm;
  ro.world_size = world_size;
  ro.stage = stage;
  ro.opt_offset = opt_offset;
  ro.compute = compute;
  ro.worker = &comm_worker;
  ro.timeline = timeline;
  ro.track = track_comm;
  reducer.emplace(ro, [this](int chunk, const float* part, bool first, bool last) {
    return TakeReduced(chunk, part, first, last);
  });
  {
    std::vector<void*> places;
    STRATA_RETURN_IF_ERROR(AllocateRuns(4, "gradients of tensors larger than a chunk", places));
    std::vector<float*> run_places(places.size());
    for (size_t c = 0; c < places.size(); ++c) run_places[c] = static_cast<float*>(places[c]);
    reducer->SetRunPlaces(std::move(run_places));
  }
  reducer->set_buffers(grad_buffers);
  for (int i = 0; i < grad_buffers; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, DeviceAlloc(l.chunk_elems * 4, "gradient buffers"));
    // Padding must read as zero in every reduce.
    STRATA_RETURN_IF_ERROR(ops->Zero(zero::OpsLane::kTraining, p, l.chunk_elems * 4));
    reducer->AddBuffer(static_cast<float*>(p));
  }
  {
    STRATA_ASSIGN_OR_RETURN(void* p, DeviceAlloc(plan.recv_elems * 4, "reduce staging"));
    reducer->SetRecv(static_cast<float*>(p));
  }
  if (plan.out16_on_device) {
    STRATA_ASSIGN_OR_RETURN(out16_device, DeviceAlloc(opt_elems * csize, "optimizer output staging"));
  }
  const uint64_t chunk16 = l.chunk_elems * csize;
  if (stage < 3) {
    STRATA_ASSIGN_OR_RETURN(param_full, DeviceAlloc(l.num_chunks * chunk16, "compute parameters"));
  } else {
    std::vector<void*> buffers;
    for (int i = 0; i < gather_plan.buffers; ++i) {
      STRATA_ASSIGN_OR_RETURN(void* p, DeviceAlloc(chunk16, "gathered chunks"));
      buffers.push_back(p);
    }
    STRATA_RETURN_IF_ERROR(AllocateRuns(csize, "gathered tensors larger than a chunk", run_params));
    gatherer->Configure(gather_plan, std::move(buffers), run_params);
  }
  if (grad_tier != ZeroTier::kDevice) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(recv_staging_elems * 4, "gradient staging"));
    host_recv = static_cast<float*>(p);
  }
  for (int i = 0; i < grad_host_count; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(grad_slot_bytes, "gradient shards on their way to NVMe"));
    grad_host.Add(p);
  }
  return OkStatus();
}

Status Engine::Impl::AllocateShards(const zero::EnginePlan& plan) {
  const uint64_t n_chunks = layout.num_chunks, opt_bytes = opt_elems * 4;
  opt.resize(n_chunks);
  if (opt_tier == ZeroTier::kDevice || !opt_on_device.empty())
    device_opt.emplace(ZeroTier::kDevice, ops.get(), opt_elems, layout.num_chunks, &save_gate);
  if (opt_tier != ZeroTier::kDevice)
    host_opt.emplace(ZeroTier::kHost, &zero::HostMemoryOps(), opt_elems, layout.num_chunks, &save_gate);
  for (int c = 0; c < static_cast<int>(n_chunks); ++c) {
    OptChunk& o = opt[c];
    if (OptTierOf(c) == ZeroTier::kDevice) {
      STRATA_ASSIGN_OR_RETURN(void* st, DeviceAlloc(3 * opt_bytes, "optimizer state"));
      STRATA_ASSIGN_OR_RETURN(void* g, DeviceAlloc(opt_bytes, "gradient shards"));
      device_opt->SetState(c, static_cast<float*>(st));
      o.grad = static_cast<float*>(g);
    } else {
      if (OptTierOf(c) == ZeroTier::kHost) {
        STRATA_ASSIGN_OR_RETURN(void* st, HostAlloc(3 * opt_bytes, "optimizer state"));
        host_opt->SetState(c, static_cast<float*>(st));
      }
      if (GradTierOf(c) == ZeroTier::kHost) {
        STRATA_ASSIGN_OR_RETURN(void* g, HostAlloc(opt_bytes, "gradient shards"));
        o.grad = static_cast<float*>(g);
      }
    }
    if (o.grad)
      STRATA_RETURN_IF_ERROR(OpsOn(GradTierOf(c)).Zero(zero::OpsLane::kTraining, o.grad, opt_bytes));
  }
  for (int i = 0; i < plan.spares; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, opt_tier == ZeroTier::kDevice
                                         ? DeviceAlloc(3 * opt_bytes, "speculation spares")
                                         : HostAlloc(3 * opt_bytes, "speculation spares"));
    (opt_tier == ZeroTier::kDevice ? *device_opt : *host_opt).AddSpare(static_cast<float*>(p));
  }
  if (opt_tier == ZeroTier::kNvme) {
    nvme_opt.emplace(piece_shape, layout.num_chunks, param_from_master, &save_gate, NvmeHooks());
    nvme_opt->SetTimeline(timeline, track_nvme, track_optimizer);
  }
  for (int i = 0; i < opt_staging_count; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(opt_set_bytes, "NVMe optimizer staging"));
    nvme_opt->AddStagingSet(p);
  }
  if (publish_behind) {
    param_source.resize(n_chunks);
    fresh_shard.assign(n_chunks, nullptr);
  }
  // Streaming keeps no updated shard: a gather reads the master from disk.
  for (int i = 0; publish_behind && stream_pieces == 0 && i < zero::kOut16Staging; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(opt_elems * csize, "parameter shards on their way to NVMe"));
    out16_staging.Add(p);
  }
  if (stage == 3) {
    const uint64_t shard16 = layout.shard_elems * csize;
    param_shard.resize(n_chunks);
    for (int c = 0; c < static_cast<int>(n_chunks); ++c) {
      if (ParamTierOf(c) == ZeroTier::kDevice) {
        STRATA_ASSIGN_OR_RETURN(param_shard[c].ptr, DeviceAlloc(shard16, "parameter shards"));
      } else if (ParamTierOf(c) == ZeroTier::kHost) {
        STRATA_ASSIGN_OR_RETURN(param_shard[c].ptr, HostAlloc(shard16, "parameter shards"));
      }
    }
  }
  // Streamed compute values go out in pieces; staging is for the gathers from NVMe only.
  for (int i = 0; StreamsCompute() && param_tier != ZeroTier::kNvme && i < zero::kStreamWritePieces; ++i) {
    STRATA_ASSIGN_OR_RETURN(
        void* p, HostAlloc(piece_shape.SlotBytes(csize), "parameter pieces on their way from the optimizer"));
    out_pieces.Add(p);
  }
  for (int i = 0; i < param_staging_count; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(param_stage_bytes, "parameter staging"));
    param_staging.Add(p);
  }
  return OkStatus();
}

Result<std::unique_ptr<zero::PieceSwap>> Engine::Impl::OpenPieceSwap(
    NvmeStoreOptions so, size_t elem_bytes, const std::function<bool(int)>& on_disk) {
  std::vector<uint8_t> chunks(layout.num_chunks, 0);
  int live = 0;
  for (int c = 0; c < layout.num_chunks; ++c) {
    chunks[c] = on_disk(c);
    for (int p = 0; chunks[c] && p < piece_shape.pieces; ++p) live += piece_shape.Live(c, p);
  }
  so.slot_size = piece_shape.SlotBytes(elem_bytes);
  so.slot_count = live;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<NvmeStore> store, NvmeStore::Open(*io, so));
  return zero::PieceSwap::Create(std::move(store), piece_shape, chunks, elem_bytes);
}

Status Engine::Impl::OpenParamPieces(NvmeStoreOptions so) {
  STRATA_ASSIGN_OR_RETURN(param_pieces,
                          OpenPieceSwap(std::move(so), csize, [this](int c) { return ParamOnDisk(c); }));
  for (int i = 0; i < zero::kStreamWritePieces; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p,
                            HostAlloc(piece_shape.SlotBytes(csize), "parameter pieces on their way to NVMe"));
    param_pieces->AddWriteBuffer(static_cast<float*>(p));
  }
  return OkStatus();
}

Status Engine::Impl::OpenNvmeStores() {
  if (opt_tier != ZeroTier::kNvme && param_tier != ZeroTier::kNvme) return OkStatus();
  IoEngineOptions io_options = IoEngineOptions::FromConfig(config);
  io_options.fault_hook = io_fault_hook;
  STRATA_ASSIGN_OR_RETURN(io, IoEngine::Create(io_options));
  IoBufferRegion region{arena->base(), arena->size()};
  Status reg = io->RegisterBuffers({&region, 1});
  if (!reg.ok()) STRATA_LOG(kWarn, "engine") << "I/O without fixed buffers: " << reg.ToString();
  const uint64_t n_chunks = layout.num_chunks;
  const int on_disk = static_cast<int>(n_chunks) - info.optimizer_resident_chunks;
  if (opt_tier == ZeroTier::kNvme && on_disk > 0) {
    NvmeStoreOptions so;
    so.paths = SwapPaths(config, config.zero.offload_optimizer);
    so.name = "strata-optim-r" + std::to_string(rank);
    so.slot_size = opt_set_bytes;
    so.slot_count = 2 * on_disk * piece_shape.pieces;
    so.checksum = config.strata.checksum;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<NvmeStore> store, NvmeStore::Open(*io, so));
    STRATA_RETURN_IF_ERROR(nvme_opt->AttachStore(std::move(store)));
  }
  if (grad_tier == ZeroTier::kNvme) STRATA_RETURN_IF_ERROR(OpenGradStore());
  const int params_on_disk =
      static_cast<int>(n_chunks) - info.param_resident_chunks - info.param_device_chunks;
  if (param_tier == ZeroTier::kNvme && !param_from_master && params_on_disk > 0) {
    NvmeStoreOptions so;
    so.paths = SwapPaths(config, config.zero.offload_param);
    so.name = "strata-param-r" + std::to_string(rank);
    so.slot_size = zero::Align4K(layout.shard_elems * csize);
    so.slot_count = params_on_disk;
    so.checksum = config.strata.checksum;
    if (StreamsCompute()) return OpenParamPieces(so);
    STRATA_ASSIGN_OR_RETURN(param_store, NvmeStore::Open(*io, so));
    for (int c = 0; c < static_cast<int>(n_chunks); ++c) {
      if (!ParamOnDisk(c)) continue;
      STRATA_ASSIGN_OR_RETURN(param_shard[c].slot, param_store->Allocate());
    }
  }
  return OkStatus();
}
}  // namespace strata
