// Engine creation: layout, the memory plan per tier (checked against the budgets
// before anything is allocated), allocation and parameter initialisation.
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "strata/half.h"
#include "strata/log.h"
#include "strata/topology.h"
#include "strata/units.h"
#include "zero/engine_impl.h"
#include "zero/keep_plan.h"

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

// Pinned buffers for compute values on their way between the optimizer, the device
// and the parameter tier (one per worker that may hold one at a time, plus one).
constexpr int kParamStaging = 3;

// Gather buffers for at most this many modules ahead of the running one (stage 3,
// engine_gather.cc); the depth used is measured (prefetch_depth.h) within what the
// budget and DeepSpeed's keys leave of it.
constexpr uint64_t kMaxPrefetchModules = 8;

// The NVMe optimizer steps a chunk's shard in pieces of at most this much state
// (master | m | v): small enough that even a tight host budget holds several staging
// sets, so reads run ahead and writes behind while a piece steps; large enough (16
// requests of the default 1 MiB block) that each piece keeps the disk's queue full.
constexpr uint64_t kPieceStateBytes = 16ull << 20;
// Staging sets beyond what four whole-chunk sets would hold buy nothing on one disk:
// reads run ahead of the step by more than the disk can deliver in the meantime.
constexpr uint64_t kStagingChunkSets = 4;

uint64_t Align4K(uint64_t b) { return (b + 4095) / 4096 * 4096; }

// Writes the initial fp32 values of chunk positions [begin, begin + count) into out
// (zeros where no tensor lies: padding stays zero forever, see ReduceChunk).
void FillChunkRange(const zero::Layout& l, int chunk, int64_t begin, int64_t count, const ParamInit& init,
                    float* out) {
  std::fill(out, out + count, 0.0f);
  for (const auto& mod : l.tensors) {
    for (const auto& t : mod) {
      if (t.chunk != chunk) continue;
      int64_t lo = std::max(begin, t.offset), hi = std::min(begin + count, t.offset + t.numel);
      if (lo >= hi) continue;
      init(t.module, t.tensor, lo - t.offset, hi - lo, out + (lo - begin));
    }
  }
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
        std::to_string(n) + " ranks (the gradients and parameters on the GPU are reduced and gathered there); "
        "create one with CreateNcclCommunicator(world, NcclOptions{.device = <the CUDA index>}, ...) and pass it");
  }
  if (d->memory_space() != MemorySpace::kDevice) {
    return InvalidArgumentError("engine: EngineResources.device_comm must be a device (NCCL) communicator; '" +
                                d->name() + "' is " + std::string(d->backend()) + " (host buffers)");
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

void* Engine::Impl::Pool::Take() {
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return !free.empty(); });
  void* p = free.back();
  free.pop_back();
  return p;
}

void* Engine::Impl::Pool::TryTake() {
  std::lock_guard lock(mu);
  if (free.empty()) return nullptr;
  void* p = free.back();
  free.pop_back();
  return p;
}

void Engine::Impl::Pool::Give(void* p) {
  {
    std::lock_guard lock(mu);
    free.push_back(p);
  }
  cv.notify_one();
}

Result<void*> Engine::Impl::DeviceAlloc(uint64_t bytes, const char* what) {
  auto r = device->Allocate(std::max<uint64_t>(bytes, 256));
  if (!r.ok()) return r.status().WithContext(std::string("engine: device memory for ") + what);
  device_allocs.push_back(*r);
  return *r;
}

Result<void*> Engine::Impl::HostAlloc(uint64_t bytes, const char* what) {
  auto r = arena->Allocate(Align4K(std::max<uint64_t>(bytes, 4096)));
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
  // Let queued work finish before the memory under it goes away.
  s.comm_worker.Drain();
  s.fetch_worker.Drain();
  s.opt_worker.Drain();
  // Reads ahead and writes behind may still target pinned buffers (training stopped
  // between steps, or a step failed): they finish before the stores and the arena go.
  if (s.opt_store) {
    s.DropNvmeReads().IgnoreError();
    s.WaitNvmeWrites().IgnoreError();
  }
  if (s.device) {
    s.device->SynchronizeAll().IgnoreError();  // errors were reported by the calls that queued the work
    for (void* p : s.device_allocs) s.device->Free(p);
  }
  s.opt_store.reset();
  s.param_store.reset();
  s.grad_store.reset();
  s.io.reset();
  if (s.arena) {
    for (const auto& b : s.host_blocks) s.arena->Free(b);
  }
}

Result<std::unique_ptr<Engine>> Engine::Create(const Config& config, std::vector<model::ModuleSpec> modules,
                                               const ParamInit& init, const EngineResources& res) {
  if (res.world == nullptr) return InvalidArgumentError("engine: EngineResources.world is required");
  if (res.device == nullptr) return InvalidArgumentError("engine: EngineResources.device is required");
  if (res.world->memory_space() != MemorySpace::kHost) {
    return InvalidArgumentError("engine: EngineResources.world must be a host (MPI) communicator");
  }
  STRATA_ASSIGN_OR_RETURN(Communicator * device_comm, ChooseDeviceComm(res));
  auto impl = std::make_unique<Impl>();
  Impl& s = *impl;
  s.config = config;
  s.modules = std::move(modules);
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
  s.overlap = config.strata.overlap;
  s.opt_tier = TierOf(config.zero.offload_optimizer.device);
  s.param_tier = TierOf(config.zero.offload_param.device);
  s.grad_tier = s.opt_tier == ZeroTier::kDevice ? ZeroTier::kDevice : ZeroTier::kHost;
  if (s.opt_tier == ZeroTier::kNvme && s.stage != 3) {
    return InvalidArgumentError(
        "zero_optimization.offload_optimizer.device: \"nvme\" needs zero_optimization.stage 3 "
        "(as in DeepSpeed's ZeRO-Infinity); got stage " + std::to_string(s.stage));
  }
  if (config.strata.gradients != "auto" && s.opt_tier != ZeroTier::kNvme) {
    return InvalidArgumentError("strata.gradients: \"" + config.strata.gradients +
                                "\" chooses where gradients wait for an NVMe optimizer step; it needs "
                                "zero_optimization.offload_optimizer.device \"nvme\" (leave it \"auto\" otherwise)");
  }
  if (s.stage == 0 && s.opt_tier != ZeroTier::kDevice) {
    return InvalidArgumentError(
        "zero_optimization.offload_optimizer.device: offload needs stage 1, 2 or 3 (DeepSpeed's rule); "
        "got stage 0");
  }
  s.compute = config.bf16 ? DType::kBf16 : (config.fp16.enabled ? DType::kFp16 : DType::kF32);
  s.csize = DTypeSize(s.compute);
  s.adam.lr = static_cast<float>(config.optimizer.lr);
  s.adam.beta1 = static_cast<float>(config.optimizer.beta1);
  s.adam.beta2 = static_cast<float>(config.optimizer.beta2);
  s.adam.eps = static_cast<float>(config.optimizer.eps);
  s.adam.weight_decay = static_cast<float>(config.optimizer.weight_decay);
  s.adam.adamw = config.optimizer.type == OptimizerType::kAdamW;
  s.adam.step = 1;
  STRATA_ASSIGN_OR_RETURN(auto scaler, LossScaler::Create(LossScalerOptions::FromConfig(config)));
  s.scaler = scaler;

  // Every rank must agree on the configuration and the model before any collective.
  nlohmann::json layout_doc = nlohmann::json::array();
  for (const auto& m : s.modules) {
    nlohmann::json mj = {{"name", m.name}, {"tensors", nlohmann::json::array()}};
    for (const auto& t : m.tensors) mj["tensors"].push_back({{"name", t.name}, {"shape", t.shape}});
    layout_doc.push_back(mj);
  }
  STRATA_RETURN_IF_ERROR(CheckConsistency(*s.world, "config", ConfigToJson(config)));
  STRATA_RETURN_IF_ERROR(CheckConsistency(*s.world, "model layout", layout_doc));

  STRATA_ASSIGN_OR_RETURN(s.layout, zero::MakeLayout(s.modules, config.strata.chunk_size, s.world_size));
  s.opt_elems = s.stage == 0 ? s.layout.chunk_elems : s.layout.shard_elems;
  s.opt_offset = s.stage == 0 ? 0 : s.rank * s.layout.shard_elems;
  STRATA_ASSIGN_OR_RETURN(s.h2d, s.device->CreateStream("engine-h2d"));
  STRATA_ASSIGN_OR_RETURN(s.d2h, s.device->CreateStream("engine-d2h"));
  STRATA_ASSIGN_OR_RETURN(s.compute_stream, s.device->CreateStream("engine-compute"));
  STRATA_ASSIGN_OR_RETURN(s.ops, zero::CreateDeviceOps(*s.device, s.compute_stream));
  STRATA_RETURN_IF_ERROR(s.Init(init));
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Status Engine::Impl::Init(const ParamInit& init) {
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

Status Engine::Impl::AllocateMemory() {
  const zero::Layout& l = layout;
  const uint64_t n_chunks = l.num_chunks;
  const uint64_t chunk16 = l.chunk_elems * csize;
  const uint64_t shard16 = l.shard_elems * csize;
  const uint64_t opt_bytes = opt_elems * 4;
  grad_slot_bytes = Align4K(opt_bytes);
  piece_elems = std::max<int64_t>(opt_elems, 1);
  // Both on NVMe: the new 16-bit shard is assembled in one of two buffers and written
  // behind while the next chunk steps into the other; in fp32 it is the master itself.
  publish_behind = opt_tier == ZeroTier::kNvme && stage == 3 && param_tier == ZeroTier::kNvme;
  param_from_master = publish_behind && compute == DType::kF32;
  if (opt_tier == ZeroTier::kNvme) {
    // sub_group_size (DeepSpeed's key) bounds a piece from above; the engine's own cap
    // keeps pieces small enough to pipeline whatever the model's chunk size.
    const int64_t cap = std::min<int64_t>(
        static_cast<int64_t>(std::min<uint64_t>(config.zero.sub_group_size, kPieceStateBytes / 12)), opt_elems);
    const int64_t k = (opt_elems + std::max<int64_t>(cap, 1) - 1) / std::max<int64_t>(cap, 1);
    piece_elems = std::max<int64_t>((opt_elems + k - 1) / k, 1);  // k pieces, none above the cap
    // A gather reads each piece's master into its place in the shard: O_DIRECT wants
    // every piece to start on a 4 KiB boundary there (the shard is a multiple of 2048),
    // so pieces become multiples of 1024 elements: rounded up (no more pieces) unless
    // that passes the cap, then down. A cap below 1024 keeps the parameter swap.
    if (param_from_master && piece_elems % 1024 != 0) {
      const int64_t up = (piece_elems + 1023) / 1024 * 1024;
      if (up <= cap) {
        piece_elems = up;
      } else if (piece_elems > 1024) {
        piece_elems = piece_elems / 1024 * 1024;
      } else {
        param_from_master = false;
      }
    }
  }
  pieces = static_cast<int>((opt_elems + piece_elems - 1) / piece_elems);
  if (pieces == 0) pieces = 1;
  opt_set_bytes = Align4K(3 * piece_elems * 4);
  if (pieces > 1 && 12 * piece_elems < (1 << 20)) {
    STRATA_LOG(kWarn, "engine") << "zero_optimization.sub_group_size " << config.zero.sub_group_size
                                << " cuts each shard's optimizer state into " << pieces << " pieces of "
                                << FormatBytes(12 * piece_elems)
                                << ": NVMe requests that small cost more than they move; raise it, or leave the "
                                   "default and strata takes pieces of up to 16 MiB";
  }
  piece_live.assign(opt_tier == ZeroTier::kNvme ? n_chunks * pieces : 0, 1);
  for (uint64_t c = 0; c < piece_live.size() / pieces; ++c) {
    for (int p = 0; p < pieces; ++p) {
      const int64_t begin = opt_offset + p * piece_elems, end = begin + PieceElems(p);
      for (const auto& [g0, g1] : l.chunk_gaps[c]) {
        if (g0 <= begin && end <= g1) piece_live[PieceKey(static_cast<int>(c), p)] = 0;
      }
    }
  }
  size_t max_module_chunks = 1;
  for (const auto& chunks : l.module_chunks) max_module_chunks = std::max(max_module_chunks, chunks.size());
  grad_buffers = static_cast<int>(max_module_chunks) + 1;
  const uint64_t recv_elems = (stage <= 1) ? l.chunk_elems : l.shard_elems;

  // Fixed needs per tier.
  uint64_t dev = grad_buffers * l.chunk_elems * 4 + recv_elems * 4;
  uint64_t host = 0, nvme = 0;
  uint64_t persistent = 0;    // chunks kept gathered for stage3_param_persistence_threshold
  uint64_t fixed_gather = 0;  // gather buffers every configuration needs (stage 3)
  if (stage < 3) {
    dev += n_chunks * chunk16;
  } else {
    // The running module's chunks, and the chunks of small tensors only, which stay
    // gathered whatever the budget, as DeepSpeed's do; more if it fits.
    const zero::KeepPlan persist = zero::PlanKeep(l, 0, config.zero.stage3_param_persistence_threshold, 0);
    persistent = persist.persistent;
    fixed_gather = zero::PeakGathered(l, persist.kept, /*window=*/0);
    dev += fixed_gather * chunk16;
    if (param_tier == ZeroTier::kDevice) dev += n_chunks * shard16;
    if (param_tier == ZeroTier::kHost) host += n_chunks * Align4K(shard16);
    if (param_tier == ZeroTier::kNvme && !param_from_master) nvme += n_chunks * Align4K(shard16);
  }
  if (stage == 3 || opt_tier != ZeroTier::kDevice) host += kParamStaging * Align4K(opt_elems * csize);
  const bool out16_on_device = stage == 3 && opt_tier == ZeroTier::kDevice && !device->host_accessible();
  if (out16_on_device) dev += opt_elems * csize;
  switch (opt_tier) {
    case ZeroTier::kDevice: dev += n_chunks * (3 * opt_bytes + opt_bytes); break;
    case ZeroTier::kHost: host += n_chunks * (opt_set_bytes + Align4K(opt_bytes)); break;
    case ZeroTier::kNvme:
      host += opt_set_bytes;  // one staging set; the gradients' place is decided below
      nvme += 2 * n_chunks * pieces * opt_set_bytes;  // every slot has a full piece's size
      break;
  }
  if (grad_tier != ZeroTier::kDevice) host += grad_slot_bytes;  // host_recv
  info.num_params = l.num_params;
  info.chunk_elems = l.chunk_elems;
  info.num_chunks = l.num_chunks;
  info.shard_elems = l.shard_elems;
  info.device_need = dev;
  info.host_need = host;
  info.nvme_need = nvme;

  // Which chunks are gathered, kept and released must be the same on every rank (each
  // gather is a collective), and a rank that cannot hold the configuration must not
  // leave the others waiting: every rank plans with the least room any rank has.
  STRATA_ASSIGN_OR_RETURN(const uint64_t dev_have, LeastOverRanks(device->capacity() - device->allocated()));
  if (dev > dev_have) {
    return OutOfBudgetError("engine: the device tier cannot hold this configuration: it needs " + FormatBytes(dev) +
                            " (compute params, gradient buffers" +
                            std::string(opt_tier == ZeroTier::kDevice ? ", optimizer state" : "") +
                            (persistent ? ", " + std::to_string(persistent) +
                                              " chunks kept gathered for stage3_param_persistence_threshold"
                                        : std::string()) +
                            ") and has " + FormatBytes(dev_have) + " of " + FormatBytes(device->capacity()) +
                            "; raise strata.device_budget, use a higher zero stage, or offload "
                            "(offload_optimizer / offload_param)" +
                            (persistent ? std::string(", or lower stage3_param_persistence_threshold") : "") );
  }
  // Optional extras, as the budgets allow: speculation spares and a wider gather window.
  uint64_t host_budget = config.strata.host_budget;
  if (host_budget == 0 && (host > 0 || arena == nullptr)) {
    auto topo = DiscoverTopology();
    host_budget = topo.ok() ? DefaultHostArenaBytes(0, *topo) : 4 * GiB;
  }
  if (arena != nullptr) host_budget = std::min<uint64_t>(host_budget ? host_budget : arena->size(),
                                                         arena->size() - arena->allocated());
  // The arena never splits a block across its 1 GiB segments (io_uring registers each
  // segment as one buffer), so each segment boundary may strand up to one block.
  auto fragmentation = [&](uint64_t bytes) {
    const uint64_t block = std::max({opt_set_bytes, Align4K(chunk16), grad_slot_bytes});
    const uint64_t segment = arena != nullptr ? arena->segment_bytes() : HostArenaOptions{}.segment_bytes;
    // A block can be stranded only in front of a segment boundary of an arena of our own
    // (it starts empty); a shared arena may already be cut up, so allow one block more.
    uint64_t boundaries = bytes / segment + (arena != nullptr ? 1 : 0);
    if ((bytes + boundaries * block) / segment > bytes / segment) ++boundaries;
    return boundaries * block;
  };
  if (publish_behind) host += 2 * Align4K(opt_elems * csize);
  if (opt_tier == ZeroTier::kNvme) {
    // Gradient shards wait for the step in pinned memory if the budget holds them
    // (no extra I/O), else on NVMe beside the state: at least two pinned shards, which
    // also hold a shard read back for a step that needs it from disk.
    const uint64_t on_host = host + n_chunks * grad_slot_bytes;
    const std::string& want = config.strata.gradients;
    // With overlap on and clipping off no step is ever redone, so a shard on the NVMe
    // path never touches the disk (engine_grads.cc): auto takes it then even when the
    // budget would hold the shards, and the freed memory deepens the staging pipeline
    // (100M-parameter stage-3 step at 1200 MiB: 1.70 s against 1.82 s in memory). Not
    // with gradient accumulation: every micro-batch but the last writes and reads back
    // each shard there.
    const bool free_on_nvme = overlap && config.gradient_clipping <= 0 && config.gradient_accumulation_steps <= 1;
    if (want == "nvme" ||
        (want == "auto" && (free_on_nvme || on_host + fragmentation(on_host) > host_budget))) {
      grad_tier = ZeroTier::kNvme;
      host += 2 * grad_slot_bytes;
      nvme += n_chunks * grad_slot_bytes;
    } else {
      host = on_host;
    }
  }
  const uint64_t host_fixed = host;
  if (host > 0) host += fragmentation(host);
  if (host > host_budget) {
    return OutOfBudgetError("engine: the pinned host tier cannot hold this configuration: it needs " +
                            FormatBytes(host) + " and the host budget is " + FormatBytes(host_budget) +
                            "; raise strata.host_budget, offload to nvme, or use more ranks");
  }
  // The extras below may cross more segment boundaries than the fixed part: they fit in
  // what is left once the stranding the whole budget could cause is set aside.
  const uint64_t usable = host_budget - (std::max(fragmentation(host_budget), host - host_fixed) - (host - host_fixed));
  auto host_room = [&] { return usable > host ? usable - host : 0; };
  int spares = 0;
  if (overlap && opt_tier != ZeroTier::kNvme) {
    uint64_t room = opt_tier == ZeroTier::kDevice ? dev_have - dev : host_room();
    spares = static_cast<int>(std::min<uint64_t>(n_chunks, room / std::max<uint64_t>(opt_set_bytes, 1)));
    if (opt_tier == ZeroTier::kDevice) dev += spares * 3 * opt_bytes;
    else host += spares * opt_set_bytes;
  }
  opt_staging_count = 0;
  if (opt_tier == ZeroTier::kNvme) {
    // Read ahead, step and write behind need three sets; more deepen the pipeline, up to
    // what kStagingChunkSets whole-chunk sets would hold.
    const uint64_t room = host_room();
    const uint64_t cap = std::min<uint64_t>(kStagingChunkSets * pieces, n_chunks * pieces) - 1;
    opt_staging_count = 1 + static_cast<int>(std::min<uint64_t>(cap, room / opt_set_bytes));
    host += (opt_staging_count - 1) * opt_set_bytes;
  }
  grad_host_count = 0;
  if (grad_tier == ZeroTier::kNvme) {
    // Shards beyond two let the reductions run ahead of a slower optimizer.
    grad_host_count = 2 + static_cast<int>(std::min<uint64_t>(2, host_room() / grad_slot_bytes));
    host += (grad_host_count - 2) * grad_slot_bytes;
  }
  gather_buffers = 0;
  if (stage == 3) {
    const uint64_t room = dev_have - dev;
    // Room to gather up to kMaxPrefetchModules modules ahead of the running one, as the
    // budget allows.
    uint64_t extra = std::min<uint64_t>(max_module_chunks * (1 + kMaxPrefetchModules), n_chunks) - max_module_chunks;
    uint64_t cap = config.zero.stage3_max_live_parameters
                       ? std::max<uint64_t>(config.zero.stage3_max_live_parameters / l.chunk_elems, max_module_chunks)
                       : n_chunks;
    cap -= std::min<uint64_t>(cap, max_module_chunks);
    extra = std::min<uint64_t>({extra, room / chunk16, cap});
    // Shards on NVMe are read into kParamStaging pinned buffers; a gather beyond those
    // reads only when a buffer frees, on the serial fetch worker, so a deeper window
    // would hold device memory to queue (the 100M bench: 315 MiB of device instead of
    // 183, and no faster).
    if (param_tier == ZeroTier::kNvme) extra = std::min<uint64_t>(extra, kParamStaging);
    // DeepSpeed's stage3_prefetch_bucket_size counts parameters gathered ahead of need.
    if (config.zero.stage3_prefetch_bucket_size) {
      extra = std::min<uint64_t>(extra, config.zero.stage3_prefetch_bucket_size / l.chunk_elems);
    }
    // Less than one module's chunks ahead: no window at all (the buffers kept chunks hold
    // before their forward must not serve as one, or the plan's peak would not hold).
    max_prefetch_modules = static_cast<int>(extra / max_module_chunks);
    prefetch_modules = max_prefetch_modules;  // until a step has measured (MeasuredPrefetch)
    // What is left keeps chunks gathered from forward to backward, nearest reuse first,
    // instead of reading, copying and all-gathering them again (keep_plan.h): as many
    // as the buffers the budget allows hold at the trace's fullest point, which the
    // window and the kept chunks partly share (the last modules are both).
    const int fixed = static_cast<int>(fixed_gather);
    const int allowed = fixed + static_cast<int>(std::min<uint64_t>(room / chunk16, cap));
    auto plan = [&](int spare) {
      return zero::PlanKeep(l, config.zero.stage3_max_reuse_distance, config.zero.stage3_param_persistence_threshold,
                            spare);
    };
    auto peak = [&](const zero::KeepPlan& p) { return zero::PeakGathered(l, p.kept, max_prefetch_modules); };
    // The largest count in [0, n_chunks] whose plan fits (a plan's peak grows with it).
    auto largest_fitting = [&](auto peak_of) {
      int lo = 0, hi = static_cast<int>(n_chunks);
      while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (peak_of(mid) <= allowed) lo = mid;
        else hi = mid - 1;
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
      const std::vector<uint8_t> carried = zero::PlanCarry(l, config.zero.stage3_max_reuse_distance, count);
      return zero::PeakGathered(l, kept_chunk, max_prefetch_modules, carried, micro_batches);
    };
    const int carry = micro_batches > 1 ? largest_fitting(carry_peak) : 0;
    carried_chunk = zero::PlanCarry(l, config.zero.stage3_max_reuse_distance, carry);
    info.carried_chunks = static_cast<int>(std::count(carried_chunk.begin(), carried_chunk.end(), 1));
    gather_buffers = std::max(carry_peak(carry), fixed);
    dev += (gather_buffers - fixed) * chunk16;
  }
  info.device_need = dev;
  info.host_need = host;
  info.nvme_need = nvme;
  info.gradients_on_nvme = grad_tier == ZeroTier::kNvme;
  info.optimizer_pieces = opt_tier == ZeroTier::kNvme ? pieces : 1;
  info.optimizer_piece_elems = opt_tier == ZeroTier::kNvme ? piece_elems : 0;
  info.optimizer_staging_sets = opt_staging_count;
  info.params_in_optimizer_state = param_from_master;
  info.optimizer_padding_pieces = static_cast<int>(std::count(piece_live.begin(), piece_live.end(), 0));
  STRATA_LOG(kDebug, "engine") << "layout: " << l.num_params << " params in " << l.num_chunks << " chunks of "
                              << l.chunk_elems << " (shard " << l.shard_elems << "); device " << FormatBytes(dev)
                              << ", host " << FormatBytes(host) << ", nvme " << FormatBytes(nvme)
                              << "; spares " << spares << ", staging sets " << opt_staging_count << " of "
                              << pieces << " piece(s) per chunk"
                              << ", gather buffers " << gather_buffers << " (prefetch up to " << max_prefetch_modules
                              << " modules, " << info.kept_chunks << " chunks kept from forward to backward, "
                              << info.carried_chunks << " carried between micro-batches)"
                              << (grad_tier == ZeroTier::kNvme ? "; gradients on NVMe" : "");

  if (host > 0 && arena == nullptr) {
    HostArenaOptions ao;
    ao.bytes = host;
    STRATA_ASSIGN_OR_RETURN(own_arena, HostArena::Create(ao));
    arena = own_arena.get();
  }

  // Device tier.
  for (int i = 0; i < grad_buffers; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, DeviceAlloc(l.chunk_elems * 4, "gradient buffers"));
    // Padding must read as zero in every reduce.
    STRATA_RETURN_IF_ERROR(ops->Zero(zero::OpsLane::kTraining, p, l.chunk_elems * 4));
    grad_pool.free.push_back(p);
  }
  {
    STRATA_ASSIGN_OR_RETURN(void* p, DeviceAlloc(recv_elems * 4, "reduce staging"));
    reduce_recv = static_cast<float*>(p);
  }
  if (out16_on_device) {
    STRATA_ASSIGN_OR_RETURN(out16_device, DeviceAlloc(opt_elems * csize, "optimizer output staging"));
  }
  if (stage < 3) {
    STRATA_ASSIGN_OR_RETURN(param_full, DeviceAlloc(n_chunks * chunk16, "compute parameters"));
  } else {
    for (int i = 0; i < gather_buffers; ++i) {
      STRATA_ASSIGN_OR_RETURN(void* p, DeviceAlloc(chunk16, "gathered chunks"));
      gather_pool.free.push_back(p);
    }
  }
  opt.resize(n_chunks);
  if (grad_tier != ZeroTier::kDevice) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(opt_bytes, "gradient staging"));
    host_recv = static_cast<float*>(p);
  }
  for (int i = 0; i < grad_host_count; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(grad_slot_bytes, "gradient shards on their way to NVMe"));
    grad_host.free.push_back(p);
  }
  for (uint64_t c = 0; c < n_chunks; ++c) {
    OptChunk& o = opt[c];
    if (opt_tier == ZeroTier::kDevice) {
      STRATA_ASSIGN_OR_RETURN(void* st, DeviceAlloc(3 * opt_bytes, "optimizer state"));
      STRATA_ASSIGN_OR_RETURN(void* g, DeviceAlloc(opt_bytes, "gradient shards"));
      o.state = static_cast<float*>(st);
      o.grad = static_cast<float*>(g);
    } else {
      if (opt_tier == ZeroTier::kHost) {
        STRATA_ASSIGN_OR_RETURN(void* st, HostAlloc(3 * opt_bytes, "optimizer state"));
        o.state = static_cast<float*>(st);
      }
      if (grad_tier == ZeroTier::kHost) {
        STRATA_ASSIGN_OR_RETURN(void* g, HostAlloc(opt_bytes, "gradient shards"));
        o.grad = static_cast<float*>(g);
      }
    }
    if (o.grad) STRATA_RETURN_IF_ERROR(OpsOn(grad_tier).Zero(zero::OpsLane::kTraining, o.grad, opt_bytes));
  }
  for (int i = 0; i < spares; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, opt_tier == ZeroTier::kDevice ? DeviceAlloc(3 * opt_bytes, "speculation spares")
                                                                   : HostAlloc(3 * opt_bytes, "speculation spares"));
    spare_states.push_back(static_cast<float*>(p));
  }
  for (int i = 0; i < opt_staging_count; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(opt_set_bytes, "NVMe optimizer staging"));
    opt_staging.free.push_back(p);
  }
  if (publish_behind) {
    param_source.resize(n_chunks);
    fresh_shard.assign(n_chunks, nullptr);
  }
  for (int i = 0; publish_behind && i < 2; ++i) {
    STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(opt_elems * csize, "parameter shards on their way to NVMe"));
    out16_staging.free.push_back(p);
  }
  if (stage == 3) {
    param_shard.resize(n_chunks);
    for (uint64_t c = 0; c < n_chunks; ++c) {
      if (param_tier == ZeroTier::kDevice) {
        STRATA_ASSIGN_OR_RETURN(param_shard[c].ptr, DeviceAlloc(shard16, "parameter shards"));
      } else if (param_tier == ZeroTier::kHost) {
        STRATA_ASSIGN_OR_RETURN(param_shard[c].ptr, HostAlloc(shard16, "parameter shards"));
      }
    }
  }
  if (stage == 3 || opt_tier != ZeroTier::kDevice) {
    for (int i = 0; i < kParamStaging; ++i) {
      STRATA_ASSIGN_OR_RETURN(void* p, HostAlloc(opt_elems * csize, "parameter staging"));
      param_staging.free.push_back(p);
    }
  }

  // NVMe tier.
  if (opt_tier == ZeroTier::kNvme || param_tier == ZeroTier::kNvme) {
    IoEngineOptions io_options = IoEngineOptions::FromConfig(config);
    io_options.fault_hook = io_fault_hook;
    STRATA_ASSIGN_OR_RETURN(io, IoEngine::Create(io_options));
    IoBufferRegion region{arena->base(), arena->size()};
    Status reg = io->RegisterBuffers({&region, 1});
    if (!reg.ok()) STRATA_LOG(kWarn, "engine") << "I/O without fixed buffers: " << reg.ToString();
    if (config.strata.nvme_budget && nvme > config.strata.nvme_budget) {
      return OutOfBudgetError("engine: the NVMe tier needs " + FormatBytes(nvme) + " and strata.nvme_budget is " +
                              FormatBytes(config.strata.nvme_budget) + "; raise it or use more ranks");
    }
    if (opt_tier == ZeroTier::kNvme) {
      NvmeStoreOptions so;
      so.paths = SwapPaths(config, config.zero.offload_optimizer);
      so.name = "strata-optim-r" + std::to_string(rank);
      so.slot_size = opt_set_bytes;
      so.slot_count = 2 * n_chunks * pieces;
      so.checksum = config.strata.checksum;
      STRATA_ASSIGN_OR_RETURN(opt_store, NvmeStore::Open(*io, so));
      for (auto& o : opt) {
        for (auto& version : o.slot) {
          version.resize(pieces);
          for (SlotId& slot : version) {
            STRATA_ASSIGN_OR_RETURN(slot, opt_store->Allocate());
          }
        }
      }
    }
    if (grad_tier == ZeroTier::kNvme) STRATA_RETURN_IF_ERROR(OpenGradStore());
    if (param_tier == ZeroTier::kNvme && !param_from_master) {
      NvmeStoreOptions so;
      so.paths = SwapPaths(config, config.zero.offload_param);
      so.name = "strata-param-r" + std::to_string(rank);
      so.slot_size = Align4K(shard16);
      so.slot_count = n_chunks;
      so.checksum = config.strata.checksum;
      STRATA_ASSIGN_OR_RETURN(param_store, NvmeStore::Open(*io, so));
      for (auto& shard : param_shard) {
        STRATA_ASSIGN_OR_RETURN(shard.slot, param_store->Allocate());
      }
    }
  }
  device->ResetHighWater();
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
      STRATA_RETURN_IF_ERROR(CopyToDevice(static_cast<uint8_t*>(param_full) + c * l.chunk_elems * csize, c16.data(),
                                          l.chunk_elems * csize));
    } else {
      // Through pinned staging: the NVMe tier needs aligned, registered buffers.
      void* staged = param_staging.Take();
      std::memcpy(staged, c16.data() + rank * l.shard_elems * csize, l.shard_elems * csize);
      Status st = PublishParams(c, staged, /*from_host=*/true);
      param_staging.Give(staged);
      STRATA_RETURN_IF_ERROR(st);
    }
    // Optimizer state: master = the fp32 values of this rank's part, m = v = 0.
    OptChunk& o = opt[c];
    if (opt_tier == ZeroTier::kNvme) {
      float* set = static_cast<float*>(opt_staging.Take());
      for (int p = 0; p < pieces; ++p) {
        if (!PieceLive(c, p)) continue;
        const int64_t n = PieceElems(p);
        std::memcpy(set, full.data() + opt_offset + p * piece_elems, n * 4);
        std::memset(set + n, 0, 2 * n * 4);
        auto h = opt_store->Write(o.slot[0][p], set, PieceBytes(p), param_from_master ? n * 4 : 0);
        Status st = h.ok() ? h->Wait() : h.status();
        if (!st.ok()) {
          opt_staging.Give(set);
          return st;
        }
        bytes_nvme_written += PieceBytes(p);
      }
      opt_staging.Give(set);
    } else {
      std::vector<float> st(3 * opt_elems, 0.0f);
      std::memcpy(st.data(), full.data() + opt_offset, opt_elems * 4);
      if (opt_tier == ZeroTier::kDevice) {
        STRATA_RETURN_IF_ERROR(CopyToDevice(o.state, st.data(), st.size() * 4));
      } else {
        std::memcpy(o.state, st.data(), st.size() * 4);
      }
    }
  }
  chunk_pending_modules.assign(l.num_chunks, 0);
  return OkStatus();
}

double Engine::loss_scale() const { return impl_->scaler->scale(); }
DType Engine::compute_dtype() const { return impl_->compute; }
model::Backend Engine::model_backend() const { return impl_->ops->model_backend(); }
void* Engine::model_stream() const { return impl_->ops->model_stream(); }
const EngineLayoutInfo& Engine::layout_info() const { return impl_->info; }

}  // namespace strata
