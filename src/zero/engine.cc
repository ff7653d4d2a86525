// Engine creation: layout, the memory plan per tier (checked against the budgets
// before anything is allocated), allocation and parameter initialisation.
#include <oneapi/tbb/info.h>

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

// The offload keys against each other and the stage: InvalidArgument naming the key.
// strata.optimizer_threads resolved on this machine; InvalidArgument above its cores.
Result<int> SpeculationThreads(const Config& config, const Device& device) {
  const int cores = tbb::info::default_concurrency();
  const int asked = config.strata.optimizer_threads;
  if (asked > cores) {
    return InvalidArgumentError("strata.optimizer_threads: " + std::to_string(asked) +
                                " threads, but this process has " + std::to_string(cores) +
                                " cores; give at most " + std::to_string(cores) + " or \"auto\"");
  }
  // The sim device's backward runs on the cores: one is the optimizer's, the rest the
  // model's. A GPU leaves the cores to the optimizer.
  if (asked == 0) return device.kind() == DeviceKind::kCuda ? cores : 1;
  return asked;
}

Status CheckOffloadKeys(const Config& config) {
  const int stage = config.zero.stage;
  const ZeroTier opt_tier = TierOf(config.zero.offload_optimizer.device);
  const ZeroTier param_tier = TierOf(config.zero.offload_param.device);
  if (opt_tier == ZeroTier::kNvme && stage != 3) {
    return InvalidArgumentError(
        "zero_optimization.offload_optimizer.device: \"nvme\" needs zero_optimization.stage 3 "
        "(as in DeepSpeed's ZeRO-Infinity); got stage " +
        std::to_string(stage));
  }
  if (config.strata.gradients != "auto" && opt_tier != ZeroTier::kNvme) {
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
  if (config.strata.optimizer_resident >= 0 && opt_tier != ZeroTier::kNvme) {
    return InvalidArgumentError(
        "strata.optimizer_resident: keeps part of an NVMe optimizer's state in pinned host memory; it "
        "needs zero_optimization.offload_optimizer.device \"nvme\" (leave it \"auto\" otherwise)");
  }
  if (config.strata.gradient_resident >= 0 &&
      (opt_tier != ZeroTier::kNvme || config.strata.gradients == "host")) {
    return InvalidArgumentError(
        "strata.gradient_resident: keeps part of the fp32 gradient shards of an NVMe optimizer in pinned "
        "host memory instead of on NVMe; it needs zero_optimization.offload_optimizer.device \"nvme\" with "
        "strata.gradients \"auto\" or \"nvme\" (leave it \"auto\" otherwise)");
  }
  const struct {
    const char* key;
    double fraction;
    const char* where;
  } shard_keys[] = {{"param_resident", config.strata.param_resident, "pinned host memory"},
                    {"param_on_device", config.strata.param_on_device, "device memory"}};
  for (const auto& k : shard_keys) {
    if (k.fraction >= 0 && (stage != 3 || param_tier != ZeroTier::kNvme)) {
      return InvalidArgumentError(std::string("strata.") + k.key +
                                  ": keeps part of the NVMe parameter shards in " + k.where +
                                  "; it needs zero_optimization.stage 3 with offload_param.device \"nvme\" "
                                  "(leave it \"auto\" otherwise)");
    }
  }
  const double ratio = config.zero.offload_optimizer.ratio;
  if (!(ratio >= 0 && ratio <= 1) || (ratio != 1 && opt_tier != ZeroTier::kHost)) {
    return InvalidArgumentError("zero_optimization.offload_optimizer.ratio: " + std::to_string(ratio) +
                                ": the share (0-1) of the optimizer state the CPU Adam steps, the rest "
                                "staying on the device; below 1 "
                                "it needs offload_optimizer.device \"cpu\" (for an NVMe optimizer, "
                                "strata.optimizer_resident keeps part "
                                "of the state in host memory)");
  }
  if (stage == 0 && opt_tier != ZeroTier::kDevice) {
    return InvalidArgumentError(
        "zero_optimization.offload_optimizer.device: offload needs stage 1, 2 or 3 (DeepSpeed's rule); "
        "got stage 0");
  }
  return OkStatus();
}

// Every rank must agree on the configuration and the model before any collective
// (collective over world).
Status AgreeOnConfigAndModel(Communicator& world, const Config& config, const ModelDecl& model) {
  nlohmann::json layout_doc = {{"tensors", nlohmann::json::array()}, {"modules", nlohmann::json::array()}};
  for (const TensorDecl& t : model.tensors)
    layout_doc["tensors"].push_back({{"name", t.name}, {"shape", t.shape}});
  for (const ModuleDecl& m : model.modules)
    layout_doc["modules"].push_back({{"name", m.name}, {"tensors", m.tensors}});
  STRATA_RETURN_IF_ERROR(CheckConsistency(world, "config", ConfigToJson(config)));
  return CheckConsistency(world, "model layout", layout_doc);
}

}  // namespace

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
  s.grad_pieces.reset();
  s.param_pieces.reset();
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
  STRATA_RETURN_IF_ERROR(CheckOffloadKeys(config));
  STRATA_ASSIGN_OR_RETURN(const int spec_threads, SpeculationThreads(config, *s.device));
  s.speculation_arena.emplace(spec_threads);
  s.info.optimizer_threads = spec_threads;
  s.compute = config.bf16 ? DType::kBf16 : (config.fp16.enabled ? DType::kFp16 : DType::kF32);
  s.csize = DTypeSize(s.compute);
  s.adam = zero::AdamFromConfig(config);
  STRATA_ASSIGN_OR_RETURN(auto scaler, LossScaler::Create(LossScalerOptions::FromConfig(config)));
  s.scaler = scaler;

  STRATA_RETURN_IF_ERROR(CheckTensorDtypes(s.model, s.compute));
  STRATA_RETURN_IF_ERROR(AgreeOnConfigAndModel(*s.world, config, s.model));

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
    } else if (param_from_master) {
      STRATA_RETURN_IF_ERROR(PublishParams(c, nullptr, /*from_host=*/true));  // the master below is it
    } else if (StreamsCompute()) {
      STRATA_RETURN_IF_ERROR(PublishParams(c, c16.data() + rank * l.shard_elems * csize, /*from_host=*/true));
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
