// The engine's own state and the parts it holds (the gatherer, the reducer, the optimizer
// backends, the plan it follows), shared by its files: engine.cc (creation, initial
// values), engine_memory.cc (the plan taken, allocation), engine_hooks.cc (the model's
// calls), engine_gather.cc, engine_reduce.cc and engine_grads.cc (their engine sides),
// engine_step.cc and engine_update.cc (Step()), engine_nvme_step.cc (the 16-bit shards
// behind the NVMe optimizer) and engine_checkpoint*.cc.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "strata/adam.h"
#include "strata/comm.h"
#include "strata/engine.h"
#include "strata/grad_stats.h"
#include "strata/host_arena.h"
#include "strata/io.h"
#include "strata/loss_scaler.h"
#include "strata/mlp_kernels.h"
#include "strata/nvme_store.h"
#include "strata/timeline.h"
#include "zero/budget_check.h"
#include "zero/buffer_pool.h"
#include "zero/clock.h"
#include "zero/device_ops.h"
#include "zero/engine_planner.h"
#include "zero/grad_reducer.h"
#include "zero/layout.h"
#include "zero/memory_optimizer.h"
#include "zero/nvme_optimizer.h"
#include "zero/overlap_tuner.h"
#include "zero/param_gatherer.h"
#include "zero/piece_plan.h"
#include "zero/piece_swap.h"
#include "zero/save_gate.h"
#include "zero/serial_worker.h"
#include "zero/trace.h"
#include "zero/write_behind.h"

namespace strata {
namespace ckpt {
struct PendingSave;  // engine_checkpoint.h
}  // namespace ckpt

struct Engine::Impl {
  // --- fixed at creation ---
  Config config;
  ModelDecl model;
  zero::Layout layout;
  // The expected call order and this micro-batch's recording (made once layout is).
  std::optional<zero::CallOrder> order;
  Communicator* world = nullptr;
  // Collectives on device buffers: world on sim (its memory is host memory), the NCCL
  // communicator (EngineResources::device_comm) on cuda; null on cuda at world size 1,
  // where the engine issues no device collective (the data is already in place).
  Communicator* device_comm = nullptr;
  Device* device = nullptr;
  // Arithmetic and copies on device memory (device_ops.h).
  std::unique_ptr<zero::DeviceOps> ops;
  // The ops for buffers on `tier`: the device's for the device tier, the host memory's
  // for pinned buffers (host and NVMe tiers).
  zero::DeviceOps& OpsOn(ZeroTier tier) { return tier == ZeroTier::kDevice ? *ops : zero::HostMemoryOps(); }
  HostArena* arena = nullptr;
  std::unique_ptr<HostArena> own_arena;
  // The error of a Step() or hook that failed, and which call it was ("Step()",
  // "EndBackward(3)"); the engine then trains no more.
  Status failed;
  std::string failed_call;
  Result<StepResult> StepOnce();
  // After a failed Step() or hook (`call` names it): marks the engine failed, waits for
  // what the step left in flight and, with the optimizer on NVMe, cancels what it had
  // committed, so the master stays the one of the last Step() that succeeded.
  void AbandonStep(const Status& why, std::string call, int64_t stepping);
  // A hook's error that may have left the accumulation window incomplete (a gather, a
  // reduction, a kernel): abandons the step as a failed Step() does, so no later Step()
  // applies partial gradients. Returns `st`.
  Status FailHook(Status st, std::string_view hook, int module);
  // Sets `failed` and `failed_call` and posts them on the world communicator and the
  // device one, when that is another (Communicator::PostFailure): the peers' collectives,
  // which this rank will no longer join, end at once instead of at the watchdog's limit.
  void MarkFailed(const Status& why, std::string call);
  // A write error that Flush or GatherMaster saw after Step() returned (the NVMe optimizer has
  // rolled the step back): the engine trains no more, as after a failed Step(). Training
  // thread only. Returns `st`.
  Status FailBehind(Status st);
  // FailedPrecondition naming `failed` once a Step() or hook failed (every hook,
  // BeginMicroBatch, Step).
  Status RefuseAfterFailure() const;
  // FailedPrecondition while a module's hooks hold a gathered chunk or a backward is open
  // (Step, DropGathered).
  Status CheckHooksDone() const;
  std::unique_ptr<IoEngine> io;
  std::shared_ptr<IoFaultHook> io_fault_hook;  // EngineResources::io_fault_hook (tests)
  std::unique_ptr<NvmeStore>
      param_store;  // 16-bit param shard per chunk (stage 3; not with param_from_master)
  std::unique_ptr<NvmeStore> grad_store;  // fp32 gradient shard per chunk (grad_tier nvme)
  // ... or a slot per piece (stream_grads: shards too large for a pinned one).
  std::unique_ptr<zero::PieceSwap> grad_pieces;
  bool stream_grads = false;
  // Streamed 16-bit shards on NVMe (StreamsCompute): their swap, a slot per piece.
  std::unique_ptr<zero::PieceSwap> param_pieces;
  int rank = 0, world_size = 1;
  int stage = 0;
  ZeroTier opt_tier = ZeroTier::kDevice;    // master, m, v
  ZeroTier grad_tier = ZeroTier::kDevice;   // the fp32 gradient shard (nvme: engine_grads.cc)
  ZeroTier param_tier = ZeroTier::kDevice;  // stage 3: the 16-bit shard between uses
  // opt_tier nvme: by chunk, whether its master | m | v stay in pinned host memory
  // instead (partial residency, residency_plan.h); empty when none does. A resident
  // chunk is stepped, saved and restored as on the host tier, and its gradient shard
  // waits in pinned memory.
  std::vector<uint8_t> opt_resident;
  bool Resident(int chunk) const { return !opt_resident.empty() && opt_resident[chunk]; }
  // opt_tier host with offload_optimizer.ratio below 1: by chunk, whether its master |
  // m | v and gradient shard stay on the device instead, stepped there by the device
  // Adam right after the backward (never speculatively: the spares are host memory);
  // empty when none does. Chosen as the chunks the backward finishes last.
  std::vector<uint8_t> opt_on_device;
  bool OnDevice(int chunk) const { return !opt_on_device.empty() && opt_on_device[chunk]; }
  ZeroTier OptTierOf(int chunk) const {
    return OnDevice(chunk) ? ZeroTier::kDevice : Resident(chunk) ? ZeroTier::kHost : opt_tier;
  }
  // grad_tier nvme: by chunk, whether a chunk whose state is on NVMe keeps its gradient
  // shard in pinned memory (residency_plan.h); empty when none does.
  std::vector<uint8_t> grad_resident;
  ZeroTier GradTierOf(int chunk) const {
    if (OnDevice(chunk)) return ZeroTier::kDevice;
    const bool kept = Resident(chunk) || (!grad_resident.empty() && grad_resident[chunk]);
    return kept ? ZeroTier::kHost : grad_tier;
  }
  // Chunks the optimizer steps in place in Step(), before the speculative steps are
  // waited for: the NVMe optimizer's resident chunks and the ratio's device chunks.
  bool StepsInPlace(int chunk) const {
    return (opt_tier == ZeroTier::kNvme && Resident(chunk)) || OnDevice(chunk);
  }
  // Stage 3 with params_from_master: a resident chunk's gathers copy its shard from the
  // master in memory, which is then always its fresh copy (SetFresh).
  void* ResidentShard(int chunk) { return param_from_master && Resident(chunk) ? StateOf(chunk) : nullptr; }
  // Stage 3 with a parameter swap: by chunk, the tier of its parameter shard where it
  // is kept off the disk: pinned host memory (strata.param_resident) or device memory
  // (strata.param_on_device), chosen by the plan (residency_plan.h); empty when none is.
  // Such a chunk is gathered and published as on that tier and has no NVMe slot.
  std::vector<ZeroTier> param_tiers;
  ZeroTier ParamTierOf(int chunk) const { return param_tiers.empty() ? param_tier : param_tiers[chunk]; }
  bool ParamOnDisk(int chunk) const { return ParamTierOf(chunk) == ZeroTier::kNvme; }
  DType compute = DType::kF32;
  size_t csize = 4;        // bytes per compute element
  int64_t opt_elems = 0;   // elements of a chunk this rank steps
  int64_t opt_offset = 0;  // where they start inside the chunk
  bool overlap = true;     // this window's mode (overlap_tuner's choice)
  zero::OverlapTuner overlap_tuner{false, true};
  int64_t window_end_ns = 0;      // when the last Step() ended
  bool window_disturbed = false;  // an evaluation or checkpoint in this window: not timed
  void TuneOverlap(StepResult& r);
  StreamId h2d, d2h, compute_stream;
  EngineLayoutInfo info;
  // Optional recorder (EngineResources::timeline): one track per engine lane.
  Timeline* timeline = nullptr;
  int track_compute = 0, track_comm = 0, track_fetch = 0, track_optimizer = 0, track_nvme = 0;
  std::chrono::steady_clock::time_point module_start;
  void Span(int track, const std::string& name, std::chrono::steady_clock::time_point begin,
            uint64_t bytes = 0) {
    if (timeline) timeline->Record(track, name, begin, std::chrono::steady_clock::now(), bytes);
  }
  AdamParams adam;  // hyper-parameters; step/grad_scale set per step
  std::optional<LossScaler> scaler;

  // --- memory ---
  void* param_full = nullptr;  // stages 0-2: every chunk's compute copy, on the device
  // Stage 3 with the optimizer on a device the host cannot address (cuda): the device
  // Adam's compute copy lands here before it goes to pinned staging (Out16Target).
  void* out16_device = nullptr;
  std::vector<void*> device_allocs;
  std::vector<HostBlock> host_blocks;

  struct OptChunk {
    float* grad = nullptr;      // gradient shard, accumulated over micro-batches (device/host)
    SlotId grad_slot = 0;       // ... or its slot in grad_store (nvme)
    GradStats grad_stats;       // nvme: the final shard's stats, taken before it is written
    bool grad_on_disk = false;  // nvme: grad_slot holds this step's final shard
    // A speculative result waits for Step() in its backend (a spare buffer, or the NVMe
    // version that is not current), written by the optimizer worker.
    bool has_pending = false;
    bool speculated = false;  // stepped during backward this step
    std::shared_future<Status> spec_done;
  };
  std::vector<OptChunk> opt;
  // The optimizer state's backends (optimizer_backend.h): on the device (opt_tier device,
  // or the chunks offload_optimizer.ratio keeps there), in pinned host memory (opt_tier
  // host, or the NVMe optimizer's resident chunks), and on NVMe. Each exists when some
  // chunk is on its tier; speculation spares belong to opt_tier's memory backend.
  std::optional<zero::MemoryOptimizer> device_opt, host_opt;
  zero::OptimizerBackend& Backend(int chunk) {
    switch (OptTierOf(chunk)) {
      case ZeroTier::kDevice: return *device_opt;
      case ZeroTier::kHost: return *host_opt;
      case ZeroTier::kNvme: break;
    }
    return *nvme_opt;
  }
  zero::MemoryOptimizer& MemoryBackend(int chunk) {
    return OptTierOf(chunk) == ZeroTier::kDevice ? *device_opt : *host_opt;
  }
  // A chunk's state in memory (device or host tier), master | m | v.
  float* StateOf(int chunk) { return MemoryBackend(chunk).state(chunk); }
  // The arguments of one step of `chunk` at this point of training.
  zero::OptimizerStep StepArgs(int chunk, float grad_scale, bool speculative, int next_chunk);

  // Stage 3: the 16-bit shard of each chunk on param_tier.
  struct ParamShard {
    void* ptr = nullptr;  // device or host tier
    SlotId slot = 0;      // nvme tier
  };
  std::vector<ParamShard> param_shard;

  using Pool = zero::BufferPool;
  // The NVMe optimizer's pieces, planned by PlanPieces (one piece a chunk off NVMe).
  zero::PieceShape piece_shape;
  // offload_optimizer nvme: the chunks' state on disk and its pipeline (nvme_optimizer.h).
  std::optional<zero::NvmeOptimizer> nvme_opt;
  // Waits for every write behind (optimizer state and parameter shards) and returns the
  // buffers; the first error, if `report` (false once a failed step's writes were waited
  // for and logged: AbandonStep).
  Status WaitNvmeWrites(bool report = true);
  // Stage 3: buffers of param_stage_bytes for shards on their way to the device (whole
  // shards, or stream_pieces > 0 pieces per half: EnginePlan).
  Pool param_staging;
  uint64_t param_stage_bytes = 0;
  int stream_pieces = 0;
  // Streamed shards whose compute values are not the master (bf16 or fp16 on NVMe, or
  // parameters on the host or the device): the step hands them out a piece at a time
  // (SetPieceOutputs), to param_pieces or through out_pieces to their tier.
  bool StreamsCompute() const { return stream_pieces > 0 && !param_from_master; }
  Pool out_pieces;  // StreamsCompute without param_pieces: pinned pieces, a slot long
  Result<float*> TakeOutPiece();
  void GiveOutPiece(float* buf);
  // A shard of compute values (any host memory) to param_pieces through its pinned
  // pieces; returns once it is on disk.
  Status WriteShardPieces(int chunk, const uint8_t* src);
  // Out16Target's shard where staging holds only pieces (StreamsCompute): heap memory,
  // used by one stepping thread at a time.
  std::vector<uint8_t> out16_scratch;
  // Gives an Out16Target buffer back (to param_staging, unless it is the scratch).
  void ReleaseOut16(void* out, bool on_host);
  void SetPieceOutputs(int chunk, zero::OptimizerStep& args);  // engine_nvme_step.cc
  // Where StepChunkNvme's compute values go as a whole (null: nowhere, or by pieces).
  Result<void*> NvmeStepOutput(int chunk, bool* on_host);
  // The optimizer's gradient pieces from `reader` (stream_grads), timed as I/O.
  void SetGradPieces(int chunk, zero::PieceReader* reader, zero::OptimizerStep& args);
  // Parameters on NVMe too: the step assembles a chunk's new 16-bit shard here, piece by
  // piece, and writes it behind (nothing waits for it before the next forward).
  Pool out16_staging;
  zero::WriteBehind param_writes{&out16_staging};  // 16-bit shards written behind
  bool publish_behind = false;
  // publish_behind with fp32 compute: the parameter shard is bit for bit the master, which
  // the optimizer state write already puts on disk, so there is no parameter swap. A
  // gather reads the master part of the chunk's optimizer slots (written with that
  // prefix, NvmeStore::Write), of the version its last commit chose (param_source): one
  // write of 4 bytes per parameter less each step, and a rolled-back step's parameters go
  // back with its state.
  bool param_from_master = false;
  // param_from_master: out16 buffers that hold fresh shards, never written; the oldest
  // is reused first (optimizer thread).
  std::deque<void*> out16_kept;
  Result<void*> TakeOut16Staging();
  // Where the next gather of each chunk reads its shard, and the writes that must be on
  // disk first: the last write to param_store, or (param_from_master) the version of the
  // optimizer slots and their writes, which may still be in flight when the next forward
  // gathers the chunk. The optimizer and training threads set it: at a commit (Step(),
  // no gather in flight), or when a lost write rolls a step back, which only points it
  // at a version already on disk that no later write touches; the fetch and training
  // threads read it.
  struct ParamSource {
    int version = 0;  // param_from_master: the optimizer state version (nvme_opt)
    std::vector<IoHandle> writes;
  };
  std::mutex param_write_mu;
  std::vector<ParamSource> param_source;  // by chunk, guarded by param_write_mu
  bool ParamWriteDone(int chunk);
  Status WaitParamWrite(int chunk);
  // param_from_master: points the chunk's parameter source at the version its commit
  // chose (the pending one while the commit is deferred) and the writes of it still
  // queued. Optimizer or training thread, as opt[chunk].
  void SyncParamSource(int chunk);
  // The out16 buffer that still holds each chunk's last shard written behind, until the
  // step takes it again: the last chunks stepped are the first the next forward needs,
  // and it copies them from memory instead of waiting for the write and reading it back.
  // Set by the optimizer thread, borrowed by the training thread for fetch_worker's copy;
  // a buffer is overwritten only once no copy from it is in progress.
  std::mutex fresh_mu;
  std::condition_variable fresh_cv;
  std::vector<void*> fresh_shard;   // by chunk; nullptr when the disk is the only copy
  std::map<void*, int> fresh_lent;  // buffer -> copies from it in progress
  int shards_from_memory = 0;       // this step's (StepResult); training thread
  void* BorrowFresh(int chunk);     // nullptr when none; else ReturnFresh it after the copy
  void ReturnFresh(void* buf);
  // nullptr forgets the chunk's (a resident chunk's master takes its place)
  void SetFresh(int chunk, void* buf);
  void ForgetFreshBuffer(void* buf);  // before buf is overwritten; waits for copies from it
  uint64_t opt_set_bytes = 0;         // master | m | v of one piece: a staging set, one NVMe slot
  uint64_t grad_slot_bytes = 0;       // one gradient shard, 4 KiB aligned
  int opt_staging_count = 0;
  int param_staging_count = 0;  // parameter staging buffers (the plan's)

  // Stage 3: which chunks are gathered on the device, and when (param_gatherer.h); made
  // with the layout, configured once memory is. Other stages only time modules with it.
  std::optional<zero::ParamGatherer> gatherer;
  zero::GatherPlan gather_plan;  // PlanGatherBuffers'
  // Queued NVMe fetches that will take a parameter staging buffer on fetch_worker.
  std::atomic<int> fetches_awaiting_staging{0};
  // The gradient buffers handed to the model during backward and their reductions
  // (grad_reducer.h); made with the buffers (AllocateBuffers).
  std::optional<zero::GradReducer> reducer;
  int grad_buffers = 0;  // planned (PlanDeviceNeed)
  // The reducer's sink, on comm_worker: adds this rank's reduced part into the chunk's
  // gradient shard on its tier and, after the last micro-batch, starts its speculative
  // step (engine_reduce.cc).
  Status TakeReduced(int chunk, const float* part, bool first_in_window, bool last);
  // Stage 3: by chunk, its place in its run's own gather buffer (nullptr outside runs).
  std::vector<void*> run_params;
  std::vector<int> open_pos;  // by module: trace position of its latest use
  int open_backward = -1;     // the module between BeginBackward and EndBackward
  bool evaluating = false;    // Engine::SetEvaluating
  // FailedPrecondition naming `call` while evaluating (it belongs to training).
  Status RefuseWhileEvaluating(const char* call) const;
  float* host_recv = nullptr;       // host staging of a reduced gradient, recv_staging_elems long
  uint64_t recv_staging_elems = 0;  // the plan's
  Pool grad_host;                   // grad_tier nvme: pinned shards on their way to disk
  // Accumulation's writes of gradient shards that the next micro-batch reads back: no one
  // waits for them when they are issued (comm worker; drained by WaitNvmeWrites).
  zero::WriteBehind grad_writes{&grad_host};
  int grad_host_count = 0;

  // --- checkpoints (engine_checkpoint.cc) ---
  // The save StartCheckpoint began and FinishCheckpoint has not completed; its blocks
  // not yet read are held in save_gate, which StepChunk and NvmeOptimizer wait on
  // before they overwrite one. save_worker writes its files.
  std::shared_ptr<ckpt::PendingSave> pending_save;
  zero::SaveGate save_gate;

  // --- threads ---
  zero::SerialWorker save_worker{"checkpoint"};
  zero::SerialWorker comm_worker{"comm"};
  zero::SerialWorker fetch_worker{"fetch"};
  zero::SerialWorker opt_worker{"optimizer"};
  // Speculative steps run in an arena of their own: in the shared arena their tasks would
  // queue behind the model's backward, which keeps every oneTBB worker busy, and would
  // start only when backward ends. Its size is strata.optimizer_threads (SpeculationThreads).
  std::optional<tbb::task_arena> speculation_arena;
  std::deque<std::shared_future<Status>> fetches;

  // --- per-step state ---
  int micro_batch = 0;  // index within the accumulation window
  bool in_micro_batch = false;
  int64_t step_count = 0;
  // Step() calls of the run before this engine's first (LoadCheckpoint): a checkpoint
  // records resumed_step_calls + step_epoch, the run's Step() calls so far.
  int64_t resumed_step_calls = 0;
  // Step() calls that returned, skipped ones included (step_count leaves those out): tags
  // the NVMe optimizer writes and commits of each step, so that a write lost after its
  // Step() returned undoes that whole step (NvmeOptimizer::RollBack).
  int64_t step_epoch = 0;
  std::atomic<int> speculative_count{0};
  std::atomic<uint64_t> bytes_nvme_read{0}, bytes_nvme_written{0}, bytes_h2d{0}, bytes_d2h{0}, bytes_comm{0};
  std::atomic<int64_t> opt_busy_ns{0}, comm_busy_ns{0}, io_busy_ns{0};

  // --- engine.cc, engine_memory.cc ---
  // Checks the config against the model and lays it out; creates and allocates nothing
  // (Init makes the streams, the device ops and the memory).
  static Result<std::unique_ptr<Impl>> Make(const Config& config, ModelDecl model,
                                            const EngineResources& res);
  Status Init(const ParamInit& init);
  // Plans every tier, refuses (OutOfBudget) before allocating anything or creating any
  // file when a tier cannot hold the fixed part, then allocates and opens the stores.
  Status AllocateMemory();
  // Plans every tier (zero::PlanEngine with this engine's budgets) and takes the plan's
  // choices; fills info. OutOfBudget before anything exists.
  Status PlanLayout(zero::EnginePlan& plan);
  // The choices of the plan the engine follows (the rest it only allocates).
  void TakePlan(const zero::EnginePlan& plan);
  Status AllocateBuffers(const zero::EnginePlan& plan);  // gradient, reduce, gather and staging buffers
  // One zeroed device buffer per run of `elem_bytes` values a chunk element; `places`
  // by chunk (empty without runs).
  Status AllocateRuns(uint64_t elem_bytes, const char* what, std::vector<void*>& places);
  Status AllocateShards(const zero::EnginePlan& plan);  // optimizer state, gradient and parameter shards
  Status OpenNvmeStores();
  Status InitParams(const ParamInit& init);
  Result<void*> DeviceAlloc(uint64_t bytes, const char* what);
  Result<void*> HostAlloc(uint64_t bytes, const char* what);
  Status CopyToDevice(void* dst, const void* src, uint64_t bytes);
  Status CopyToHost(void* dst, const void* src, uint64_t bytes);
  // The least of `v` over the ranks (collective over world; v itself at world size 1).
  Result<uint64_t> LeastOverRanks(uint64_t v);

  // --- engine_budgets.cc ---
  // The device room, the least over the ranks (collective), and where it comes from.
  Result<zero::TierBudget> DeviceBudget();
  // host_needed: whether the plan needs pinned memory before its optional parts.
  zero::TierBudget HostBudget(bool host_needed) const;

  // --- engine_gather.cc (stage 3) ---
  void* ChunkParams(int chunk);  // compute copy of a chunk (stage 3: gathered)
  // ops->WaitForModel, its time counted as the model's (StepResult::model_wait_s). A CPU
  // model is done when its hook is called: nothing to wait for or count.
  Status WaitForModel() {
    if (ops->model_backend() == ::strata::Backend::kCpu) return OkStatus();
    const auto t0 = std::chrono::steady_clock::now();
    Status st = ops->WaitForModel();
    if (!evaluating) model_wait += std::chrono::steady_clock::now() - t0;
    return st;
  }
  std::chrono::steady_clock::duration model_wait{};  // training thread only
  void TimeModule() {
    gatherer->NoteModuleCompute(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - module_start)
            .count());
  }
  // Releases every gathered chunk (Step(): the parameters are about to change).
  Status DropGathered();
  // The gatherer's StartFn: brings this rank's shard of `chunk` in from its tier and
  // all-gathers the chunk into `buf` on fetch_worker and comm_worker.
  std::shared_future<Status> StartChunkGather(int chunk, void* buf);
  // Reads this rank's 16-bit shard of `chunk` from NVMe into `staged`, as urgent I/O:
  // one read, or one per live piece (param_from_master). Its writes must be done.
  Result<std::vector<IoHandle>> ReadParamShard(int chunk, void* staged);
  // param_from_master: pieces [first, end) of the master of `version`, each at its place
  // from `staged` on (piece `first` at its start); zeros for a piece never written.
  Result<std::vector<IoHandle>> ReadMasterPieces(int chunk, int version, void* staged, int first, int end);
  uint64_t ShardReadBytes(int chunk, int first = 0, int end = -1) const;  // bytes read from disk
  // stream_pieces > 0: the shard through the halves of `staged`, stream_pieces pieces at
  // a time, each half's read in flight while the other half goes to the device.
  Status StreamShard(int chunk, uint8_t* dst, uint8_t* staged);
  // NVMe tier: `fresh` is a borrowed copy in memory (BorrowFresh; returned here), else
  // `reads` are the reads already issued into `staged`, or none to read now.
  Status FetchShard(int chunk, void* dst, void* staged, std::vector<IoHandle> reads, void* fresh,
                    std::chrono::steady_clock::time_point start);
  // Reads the optimizer state of the chunks the backward steps first into free staging
  // sets (last micro-batch, optimizer on NVMe, overlap on); runs on opt_worker.
  void ReadStatesAhead();

  // --- engine_hooks.cc ---
  Status CheckModule(int module) const;  // InvalidArgument naming the index and the count
  ModuleParams ParamsOf(int module);     // the compute copies of the module's tensors
  // FailedPrecondition (the engine fails) when `chunk` already had its final reduction in
  // this micro-batch: `what` ("backward of module \"x\"") came after the recording said
  // the chunk's gradients were complete.
  Status CheckNotFinal(int chunk, const std::string& what, std::string_view hook, int index);
  // After a backward use or a gradient of `chunk`: reduces it when the recording expects
  // no more in this micro-batch (and the micro-batch has followed the recording so far).
  void CountBackwardUse(int chunk);
  // Stage 3: gathers the module's chunks (waiting for them) and starts the prefetch after
  // trace position `pos`. Other stages: nothing to do.
  Status EnterModule(int module, int pos);

  // --- engine_reduce.cc ---
  // Reduces what is still held and, in the window's last micro-batch, every chunk not
  // yet final; records the call order (a change is logged).
  Status EndMicroBatch();

  // --- engine_grads.cc (grad_tier nvme) ---
  Status OpenGradStore();
  // Adds this rank's reduced part (device memory) into the chunk's shard on NVMe; after
  // the last micro-batch, records its stats and starts its speculative step.
  Status AccumulateGradOnNvme(int chunk, const float* part, bool first_in_window, bool last_micro_batch);
  // Reads the chunk's shard from grad_store into `buf` in kGradReadRanges ranges, all in
  // flight at once (NvmeStore::ReadInRanges), and adds `part` to each range as it lands.
  // Waits for every read, also on an error (`buf` is then free to go back).
  Status ReadAndAccumulateGrad(int chunk, float* buf, const float* part);
  // A grad_host buffer for the comm worker: one its finished writes gave back, or the
  // oldest write's once it is on disk, before waiting for another thread's Give.
  Result<float*> TakeGradBuffer();
  // The same a piece at a time through grad_pieces (stream_grads).
  Status AccumulateGradPieces(int chunk, const float* part, bool first_in_window, bool last_micro_batch);
  Status OpenGradPieces(NvmeStoreOptions so);
  Status OpenParamPieces(NvmeStoreOptions so);  // OpenNvmeStores' swap, with StreamsCompute
  // A PieceSwap of `so`'s paths and name with a slot per live piece of the chunks on_disk.
  Result<std::unique_ptr<zero::PieceSwap>> OpenPieceSwap(NvmeStoreOptions so, size_t elem_bytes,
                                                         const std::function<bool(int)>& on_disk);  //
  // OpenGradStore's, with stream_grads
  // dst[i] += part[i] for `elems` values (opt_elems when -1): `part` on the device, `dst`
  // in host memory, through host_recv a piece at a time. Comm worker only (host_recv is
  // its own).
  Status AccumulateToHost(float* dst, const float* part, int64_t elems = -1);

  // --- engine_update.cc: Step()'s update, in the order of engine.h's definition ---
  struct GlobalStats {
    double sum_sq = 0;       // of the gradient (loss-scaled) over every shard
    bool overflow = false;   // inf or NaN anywhere
    int prefetch_depth = 0;  // stage 3: the deepest any rank measured
  };
  // Ends the micro-batch and waits for its reductions.
  Status FinishReductions();
  // Waits for the speculative steps still running (the NVMe ones may outlast the
  // reductions by the disk's time); the first error.
  Status WaitSpeculation();
  Result<GlobalStats> AgreeStats();       // collective over the world (stages 1-3)
  Status UndoSpeculation(StepResult& r);  // overflow: the step is skipped
  // Commits speculative steps that hold (clip 1), steps the rest but `stepped`,
  // publishes parameters.
  Status ApplyUpdate(double clip, double loss_scale, StepResult& r, const std::vector<int>& stepped);
  // Steps `chunks` (not speculatively), in order; a chunk whose parameters cannot be
  // published leaves the rest stepped but unpublished, and its error is returned.
  Status StepChunks(const std::vector<int>& chunks, float grad_scale);
  float GradScale(double clip, double loss_scale) const;
  // Resets the window's gradients and flags and updates the loss scale.
  Status EndWindow(bool overflow);
  void TakeCounters(StepResult& r, int prefetch_depth);

  // --- engine_step.cc ---
  bool LastMicroBatch() const { return micro_batch + 1 == config.gradient_accumulation_steps; }
  // grad: the chunk's final gradient shard, in pinned memory the step may read (nvme
  // gradients hand theirs over; nullptr: o.grad). done runs once the step no longer reads
  // it; its error is the task's.
  void MaybeSpeculate(int chunk, const float* grad = nullptr, std::function<Status()> done = {});
  // next_chunk: the chunk likely stepped next (-1: unknown), read ahead on NVMe.
  // grad: the gradient shard to step with; nullptr: o.grad, or for grad_tier nvme the
  // shard read from disk with the state.
  // Optimizer in memory (device/host tiers): publish false updates the state only;
  // *updated tells whether the state now holds the new step, even when the call failed
  // (its parameters could not be published). Ignored on the NVMe tier.
  Status StepChunk(int chunk, float grad_scale, bool speculative, int next_chunk = -1,
                   const float* grad = nullptr, bool publish = true, bool* updated = nullptr);
  Status StepChunkNvme(int chunk, float grad_scale, bool speculative, int next_chunk, const float* grad);
  // Puts the shard a step wrote to `out` where the next forward reads it (st: the step's
  // status; on failure only the buffer goes back); returns the first error.
  Status PlaceSteppedShard(int chunk, void* out, bool on_host, Status st);
  // nvme_opt's view of the engine (NvmeOptimizer::Hooks).
  zero::NvmeOptimizer::Hooks NvmeHooks();
  Status CommitChunk(int chunk);
  Status DiscardChunk(int chunk);
  Status RestoreParams(int chunk);
  Status PublishParams(int chunk, const void* out16_src, bool from_host);
  Status AllGatherParams();
  Result<GradStats> LocalGradStats();
  // GatherMaster's part: the master values of `chunk`, whole, summed over the ranks
  // (collective); `tensor` names the caller in errors.
  Status GatherChunkMaster(int chunk, TensorId tensor, std::vector<float>& full);
  void* Out16Target(int chunk, bool* on_host);

  // --- views for tests (engine_corruption_test.cc): they change nothing the engine does ---
  // A nested class may reach the engine's private state; tests get it only through here.
  static Impl& Of(Engine& engine) { return *engine.impl_; }
  // The optimizer store slot the next read of a piece's state uses: the committed version,
  // which SettleCommit makes current before any read when its commit is still deferred.
  // The other slot is the one the next step writes. On the training thread while no
  // step runs (between Step() and the next backward).
  SlotId NextStateSlot(int chunk, int piece) const {
    return nvme_opt->Slot(chunk, nvme_opt->ReadVersion(chunk), piece);
  }
  SlotId NextStateWriteSlot(int chunk, int piece) const {
    return nvme_opt->Slot(chunk, nvme_opt->WriteVersion(chunk), piece);
  }
  // Whether the next gather of `chunk` may copy its shard from memory (BorrowFresh)
  // instead of reading it from param_store.
  bool HasFreshShard(int chunk) {
    std::lock_guard lock(fresh_mu);
    return !fresh_shard.empty() && fresh_shard[chunk] != nullptr;
  }
  // Waits until the reductions submitted so far have run, with the gradient shard writes
  // they wait for; their results stay for whoever collects them. Training thread.
  void WaitForReductions() const { reducer->WaitRun(); }
};

}  // namespace strata
