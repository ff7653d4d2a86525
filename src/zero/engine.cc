// Engine creation: layout, the memory plan per tier (checked against the budgets
// before anything is allocated), allocation and parameter initialisation.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "strata/half.h"
#include "strata/log.h"
#include "strata/units.h"
#include "zero/adam_config.h"
#include "zero/engine_checkpoint.h"
#include "zero/engine_impl.h"

namespace strata {
namespace {

ZeroTier TierOf(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone: return ZeroTier::kDevice;
    case OffloadDevice::kCpu: return ZeroTier::kHost;
    case OffloadDevice::kNvme: return ZeroTier::kNvme;
  }
  return ZeroTier::kDevice;
}

// Writes the initial fp32 values of chunk positions [begin, begin + count) into out
// (zeros where no tensor lies: padding stays zero forever, see ReduceChunk).
void FillChunkRange(const zero::Layout& l, int chunk, int64_t begin, int64_t count, const ParamInit& init,
                    float* out) {
  std::fill(out, out + count, 0.0f);
  for (TensorId id : l.chunk_tensors[chunk]) {
    const int64_t start = l.StartIn(id, chunk);  // negative inside a run
    int64_t lo = std::max(begin, start), hi = std::min(begin + count, start + l.tensors[id].numel);
    if (lo >= hi) continue;
    init(id, lo - start, hi - lo, out + (lo - begin));
  }
}

// One compute dtype per engine: a tensor that asks for another is refused by name.
Status CheckTensorDtypes(const ModelDecl& model, DType compute) {
  for (const TensorDecl& t : model.tensors) {
    if (!t.dtype || *t.dtype == compute) continue;
    return InvalidArgumentError(
        "engine: tensor \"" + t.name + "\" asks for " + std::string(DTypeName(*t.dtype)) +
        " but the engine computes in " + std::string(DTypeName(compute)) +
        " (bf16/fp16 in the config); leave TensorDecl::dtype unset or make them agree");
  }
  return OkStatus();
}

void ToCompute(const float* src, int64_t n, DType dtype, void* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, n * 4);
  } else {
    model::FromFloat(src, n, dtype, dst);
  }
}

// The communicator for collectives on device buffers (EngineResources::device_comm).
Result<Communicator*> ChooseDeviceComm(const EngineResources& res) {
  if (res.device->host_accessible()) return res.world;  // sim: device memory is host memory
  const int n = res.world->size();
  Communicator* d = res.device_comm;
  if (d == nullptr) {
    if (n == 1) return nullptr;  // one rank: every device collective would be a no-op
    return InvalidArgumentError(
        "engine: EngineResources.device_comm is required to train on " + res.device->name() + " with " +
        std::to_string(n) +
        " ranks (the gradients and parameters on the GPU are reduced and gathered there); "
        "create one with CreateNcclCommunicator(world, NcclOptions{.device = <the CUDA index>}, ...) and "
        "pass it");
  }
  if (d->memory_space() != MemorySpace::kDevice) {
    return InvalidArgumentError(
        "engine: EngineResources.device_comm must be a device (NCCL) communicator; '" + d->name() + "' is " +
        std::string(d->backend()) + " (host buffers)");
  }
  if (d->size() != n || d->rank() != res.world->rank()) {
    return InvalidArgumentError("engine: EngineResources.device_comm '" + d->name() + "' is rank " +
                                std::to_string(d->rank()) + " of " + std::to_string(d->size()) +
                                ", but world is rank " + std::to_string(res.world->rank()) + " of " +
                                std::to_string(n) + "; make it from the same world");
  }
  return n == 1 ? nullptr : d;
}

}  // namespace

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

Status Engine::Impl::CopyToDevice(void* dst, const void* src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(device->CopyAsync(h2d, dst, src, bytes, CopyDir::kHostToDevice));
  bytes_h2d += bytes;
  return device->Synchronize(h2d);
}

Status Engine::Impl::CopyToHost(void* dst, const void* src, uint64_t bytes) {
  STRATA_RETURN_IF_ERROR(device->CopyAsync(d2h, dst, src, bytes, CopyDir::kDeviceToHost));
  bytes_d2h += bytes;
  return device->Synchronize(d2h);
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  Impl& s = *impl_;
  if (s.pending_save) {
    // Finishing takes every rank (a collective), which a destructor cannot count on.
    s.save_worker.Drain();
    if (s.rank == 0) {
      STRATA_LOG(kWarn, "ckpt") << "the save into " << s.pending_save->dir
                                << " was never finished (FinishCheckpoint): its files stay in "
                                << s.pending_save->tmp
                                << " until the next save there or KeepNewestCheckpoints";
    }
  }
  // Let queued work finish before the memory under it goes away.
  s.comm_worker.Drain();
  s.fetch_worker.Drain();
  s.opt_worker.Drain();
  // Reads ahead and writes behind may still target pinned buffers (training stopped
  // between steps, or a step failed): they finish before the stores and the arena go.
  if (s.nvme_opt) s.nvme_opt->DropReads().IgnoreError();
  s.WaitNvmeWrites().IgnoreError();
  if (s.device) {
    s.device->SynchronizeAll().IgnoreError();  // errors were reported by the calls that queued the work
    for (void* p : s.device_allocs) s.device->Free(p);
  }
  s.nvme_opt.reset();  // its store
  s.param_store.reset();
  s.grad_store.reset();
  s.io.reset();
  if (s.arena) {
    for (const auto& b : s.host_blocks) s.arena->Free(b);
  }
}

Result<std::unique_ptr<Engine::Impl>> Engine::Impl::Make(const Config& config, ModelDecl model,
                                                         const EngineResources& res) {
  if (res.world == nullptr) return InvalidArgumentError("engine: EngineResources.world is required");
  if (res.device == nullptr) return InvalidArgumentError("engine: EngineResources.device is required");
  if (res.world->memory_space() != MemorySpace::kHost) {
    return InvalidArgumentError("engine: EngineResources.world must be a host (MPI) communicator");
  }
  STRATA_ASSIGN_OR_RETURN(Communicator * device_comm, ChooseDeviceComm(res));
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.config = config;
  s.model = std::move(model);
  s.world = res.world;
  s.device_comm = device_comm;
  s.device = res.device;
  s.arena = res.host_arena;
  s.timeline = res.timeline;
  s.io_fault_hook = res.io_fault_hook;
  if (s.timeline) {
    s.track_compute = s.timeline->AddTrack("engine compute");
    s.track_comm = s.timeline->AddTrack("engine collectives");
    s.track_fetch = s.timeline->AddTrack("engine param fetch");
    s.track_optimizer = s.timeline->AddTrack("engine optimizer");
    s.track_nvme = s.timeline->AddTrack("engine nvme");
  }
  s.rank = res.world->rank();
  s.world_size = res.world->size();
  s.stage = config.zero.stage;
  s.overlap_tuner = zero::OverlapTuner(config.strata.overlap_auto, config.strata.overlap);
  s.overlap = s.overlap_tuner.ModeFor(0);
  s.opt_tier = TierOf(config.zero.offload_optimizer.device);
  s.param_tier = TierOf(config.zero.offload_param.device);
  s.grad_tier = s.opt_tier == ZeroTier::kDevice ? ZeroTier::kDevice : ZeroTier::kHost;
  if (s.opt_tier == ZeroTier::kNvme && s.stage != 3) {
    return InvalidArgumentError(
        "zero_optimization.offload_optimizer.device: \"nvme\" needs zero_optimization.stage 3 "
        "(as in DeepSpeed's ZeRO-Infinity); got stage " +
        std::to_string(s.stage));
  }
  if (config.strata.gradients != "auto" && s.opt_tier != ZeroTier::kNvme) {
    return InvalidArgumentError(
        "strata.gradients: \"" + config.strata.gradients +
        "\" chooses where gradients wait for an NVMe optimizer step; it needs "
        "zero_optimization.offload_optimizer.device \"nvme\" (leave it \"auto\" otherwise)");
  }
  if (config.strata.plan != "off") {
    return InvalidArgumentError(
        "strata.plan: \"" + config.strata.plan +
        "\" is resolved by `strata train`, which plans the stage and offloads before the engine starts; a "
        "program that creates the engine itself plans with tools::PlanConfigurations and passes the config "
        "it chose (with strata.plan \"off\")");
  }
  if (config.strata.optimizer_resident >= 0 && s.opt_tier != ZeroTier::kNvme) {
    return InvalidArgumentError(
        "strata.optimizer_resident: keeps part of an NVMe optimizer's state in pinned host memory; it "
        "needs zero_optimization.offload_optimizer.device \"nvme\" (leave it \"auto\" otherwise)");
  }
  if (config.strata.param_resident >= 0 && (s.stage != 3 || s.param_tier != ZeroTier::kNvme)) {
    return InvalidArgumentError(
        "strata.param_resident: keeps part of the NVMe parameter shards in pinned host memory; it needs "
        "zero_optimization.stage 3 with offload_param.device \"nvme\" (leave it \"auto\" otherwise)");
  }
  const double ratio = config.zero.offload_optimizer.ratio;
  if (!(ratio >= 0 && ratio <= 1) || (ratio != 1 && s.opt_tier != ZeroTier::kHost)) {
    return InvalidArgumentError("zero_optimization.offload_optimizer.ratio: " + std::to_string(ratio) +
                                ": the share (0-1) of the optimizer state the CPU Adam steps, the rest "
                                "staying on the device; below 1 "
                                "it needs offload_optimizer.device \"cpu\" (for an NVMe optimizer, "
                                "strata.optimizer_resident keeps part "
                                "of the state in host memory)");
  }
  if (s.stage == 0 && s.opt_tier != ZeroTier::kDevice) {
    return InvalidArgumentError(
        "zero_optimization.offload_optimizer.device: offload needs stage 1, 2 or 3 (DeepSpeed's rule); "
        "got stage 0");
  }
  s.compute = config.bf16 ? DType::kBf16 : (config.fp16.enabled ? DType::kFp16 : DType::kF32);
  s.csize = DTypeSize(s.compute);
  s.adam = zero::AdamFromConfig(config);
  STRATA_ASSIGN_OR_RETURN(auto scaler, LossScaler::Create(LossScalerOptions::FromConfig(config)));
  s.scaler = scaler;

  // Every rank must agree on the configuration and the model before any collective.
  STRATA_RETURN_IF_ERROR(CheckTensorDtypes(s.model, s.compute));
  nlohmann::json layout_doc = {{"tensors", nlohmann::json::array()}, {"modules", nlohmann::json::array()}};
  for (const TensorDecl& t : s.model.tensors)
    layout_doc["tensors"].push_back({{"name", t.name}, {"shape", t.shape}});
  for (const ModuleDecl& m : s.model.modules)
    layout_doc["modules"].push_back({{"name", m.name}, {"tensors", m.tensors}});
  STRATA_RETURN_IF_ERROR(CheckConsistency(*s.world, "config", ConfigToJson(config)));
  STRATA_RETURN_IF_ERROR(CheckConsistency(*s.world, "model layout", layout_doc));

  STRATA_ASSIGN_OR_RETURN(s.layout, zero::MakeLayout(s.model, config.strata.chunk_size, s.world_size));
  s.order.emplace(s.layout);
  Impl* self = &s;
  s.gatherer.emplace(s.layout, *s.order,
                     [self](int chunk, void* buf) { return self->StartChunkGather(chunk, buf); });
  s.opt_elems = s.stage == 0 ? s.layout.chunk_elems : s.layout.shard_elems;
  s.opt_offset = s.stage == 0 ? 0 : s.rank * s.layout.shard_elems;
  return impl;
}

Result<std::unique_ptr<Engine>> Engine::Create(const Config& config, ModelDecl model, const ParamInit& init,
                                               const EngineResources& res) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Make(config, std::move(model), res));
  STRATA_RETURN_IF_ERROR(impl->Init(init));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Result<EngineLayoutInfo> Engine::Plan(const Config& config, ModelDecl model, const EngineResources& res) {
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, Impl::Make(config, std::move(model), res));
  zero::EnginePlan plan;
  STRATA_RETURN_IF_ERROR(impl->PlanLayout(plan));
  return impl->info;
}

Status Engine::Impl::Init(const ParamInit& init) {
  STRATA_ASSIGN_OR_RETURN(h2d, device->CreateStream("engine-h2d"));
  STRATA_ASSIGN_OR_RETURN(d2h, device->CreateStream("engine-d2h"));
  STRATA_ASSIGN_OR_RETURN(compute_stream, device->CreateStream("engine-compute"));
  STRATA_ASSIGN_OR_RETURN(ops, zero::CreateDeviceOps(*device, compute_stream));
  STRATA_RETURN_IF_ERROR(AllocateMemory());
  return InitParams(init);
}

Result<uint64_t> Engine::Impl::LeastOverRanks(uint64_t v) {
  if (world_size == 1) return v;
  std::vector<uint64_t> all(world_size);
  // Moved as bytes (two floats each); nothing is computed on them in transit.
  STRATA_RETURN_IF_ERROR(world->AllGather(&v, all.data(), 2, DType::kF32).Wait());
  return *std::min_element(all.begin(), all.end());
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
  info.fresh_param_shards =
      publish_behind ? std::min(zero::kOut16Staging, l.num_chunks - info.param_resident_chunks) : 0;
  STRATA_LOG(kDebug, "engine") << "layout: " << l.num_params << " params in " << l.num_chunks << " chunks of "
                               << l.chunk_elems << " (shard " << l.shard_elems << "); device "
                               << FormatBytes(info.device_need) << ", host " << FormatBytes(info.host_need)
                               << ", nvme " << FormatBytes(info.nvme_need) << "; spares " << plan.spares
                               << ", resident optimizer chunks " << info.optimizer_resident_chunks
                               << ", staging sets " << opt_staging_count << " of " << piece_shape.pieces
                               << " piece(s) per chunk"
                               << ", gather buffers " << gather_plan.buffers << " (prefetch up to "
                               << gather_plan.max_prefetch_modules << " modules, " << info.kept_chunks
                               << " chunks kept from forward to backward, " << info.carried_chunks
                               << " carried between micro-batches)"
                               << (grad_tier == ZeroTier::kNvme ? "; gradients on NVMe" : "");
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
  param_resident = plan.param_resident;
  grad_buffers = plan.grad_buffers;
  opt_staging_count = plan.opt_staging_count;
  grad_host_count = plan.grad_host_count;
  recv_staging_elems = plan.recv_staging_elems;
  gather_plan = plan.gather;
  info.param_resident_chunks = plan.param_resident_chunks;
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
  for (int i = 0; publish_behind && i < zero::kOut16Staging; ++i) {
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
  if (stage == 3 || opt_tier != ZeroTier::kDevice) {
    for (int i = 0; i < zero::kParamStaging; ++i) {
      STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(opt_elems * csize, "parameter staging"));
      param_staging.Add(p);
    }
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
  const int params_on_disk = static_cast<int>(n_chunks) - info.param_resident_chunks;
  if (param_tier == ZeroTier::kNvme && !param_from_master && params_on_disk > 0) {
    NvmeStoreOptions so;
    so.paths = SwapPaths(config, config.zero.offload_param);
    so.name = "strata-param-r" + std::to_string(rank);
    so.slot_size = zero::Align4K(layout.shard_elems * csize);
    so.slot_count = params_on_disk;
    so.checksum = config.strata.checksum;
    STRATA_ASSIGN_OR_RETURN(param_store, NvmeStore::Open(*io, so));
    for (int c = 0; c < static_cast<int>(n_chunks); ++c) {
      if (ParamResident(c)) continue;
      STRATA_ASSIGN_OR_RETURN(param_shard[c].slot, param_store->Allocate());
    }
  }
  return OkStatus();
}

Status Engine::Impl::InitParams(const ParamInit& init) {
  const zero::Layout& l = layout;
  std::vector<float> full(l.chunk_elems);
  std::vector<uint8_t> c16(l.chunk_elems * csize);
  for (int c = 0; c < l.num_chunks; ++c) {
    // Compute copy: the whole chunk (stages 0-2) or this rank's shard (stage 3).
    FillChunkRange(l, c, 0, l.chunk_elems, init, full.data());
    ToCompute(full.data(), l.chunk_elems, compute, c16.data());
    if (stage < 3) {
      STRATA_RETURN_IF_ERROR(CopyToDevice(static_cast<uint8_t*>(param_full) + c * l.chunk_elems * csize,
                                          c16.data(), l.chunk_elems * csize));
    } else {
      // Through pinned staging: the NVMe tier needs aligned, registered buffers.
      void* staged = param_staging.Take();
      std::memcpy(staged, c16.data() + rank * l.shard_elems * csize, l.shard_elems * csize);
      Status st = PublishParams(c, staged, /*from_host=*/true);
      param_staging.Give(staged);
      STRATA_RETURN_IF_ERROR(st);
    }
    // Optimizer state: master = the fp32 values of this rank's part, m = v = 0.
    if (OptTierOf(c) == ZeroTier::kNvme) {
      STRATA_ASSIGN_OR_RETURN(float* set, nvme_opt->TakeSet());
      Status st;
      for (int p = 0; st.ok() && p < piece_shape.pieces; ++p) {
        if (!piece_shape.Live(c, p)) continue;
        const int64_t n = piece_shape.Elems(p);
        std::memcpy(set, full.data() + opt_offset + p * piece_shape.piece_elems, n * 4);
        std::memset(set + n, 0, 2 * n * 4);
        st = nvme_opt->WriteCommitted(c, p, set);
        if (st.ok()) bytes_nvme_written += piece_shape.Bytes(p);
      }
      nvme_opt->GiveSet(set);
      STRATA_RETURN_IF_ERROR(st);
    } else {
      std::vector<float> st(3 * opt_elems, 0.0f);
      std::memcpy(st.data(), full.data() + opt_offset, opt_elems * 4);
      if (OptTierOf(c) == ZeroTier::kDevice) {
        STRATA_RETURN_IF_ERROR(CopyToDevice(StateOf(c), st.data(), st.size() * 4));
      } else {
        std::memcpy(StateOf(c), st.data(), st.size() * 4);
      }
    }
  }
  open_pos.assign(l.num_modules(), 0);
  return OkStatus();
}

double Engine::loss_scale() const { return impl_->scaler->scale(); }
DType Engine::compute_dtype() const { return impl_->compute; }
Backend Engine::model_backend() const { return impl_->ops->model_backend(); }
void* Engine::model_stream() const { return impl_->ops->model_stream(); }
const EngineLayoutInfo& Engine::layout_info() const { return impl_->info; }

}  // namespace strata
