// The ZeRO engine: owns a model's 16-bit compute parameters, fp32 master parameters,
// Adam state and gradients, shards them across ranks (stages 0-3) and tiers each rank's
// shards over device, pinned host and NVMe memory (offload_optimizer, offload_param).
//
// Usage (one engine per rank, every rank the same calls in the same order):
//   auto engine = Engine::Create(config, model_decl, init, {.world = comm, .device = dev});
//   for each step:
//     for each micro-batch (gradient_accumulation_steps of them):
//       engine->BeginMicroBatch();
//       model.ForwardBackward(batch, *engine);   // calls the ModuleHooks (module_hooks.h)
//     auto result = engine->Step();
// The model is anything that declares its tensors and modules (ModelDecl) and calls the
// hooks around each use of a module; model::Mlp is one such model.
//
// Layout: every tensor is placed once (a tensor shared by several modules is one
// parameter), in the order modules first use them, in one flat parameter space cut into
// chunks of equal size (strata.chunk_size bytes of fp32 parameters, raised to the
// largest module but outliers, rounded to world size x 2048 elements so every shard of
// every plane is 4 KiB aligned for O_DIRECT). A tensor lies in one chunk, or, larger
// than a chunk (an outlier's: a large vocabulary's embedding), in a run of whole chunks
// of its own; what the model sees of it is still one contiguous span. Each rank owns the
// shard [rank * S, (rank + 1) * S) of every chunk (S = chunk elements / world size).
//
// Call order: the engine assumes the plain order (forward 0..n-1, backward n-1..0)
// until it has recorded one micro-batch, then follows the recording: stage 3 gathers
// ahead along it, and a chunk's gradients are reduced once its last backward use in the
// recording is done. A micro-batch that departs from the recording still trains
// correctly (the engine gathers on demand and reduces at the micro-batch's end) and is
// recorded instead; the log says so.
//
// Stages (DeepSpeed's meaning):
//   0: replicas; gradients all-reduced; every rank steps every parameter.
//   1: optimizer state sharded; gradients all-reduced; each rank steps its shards,
//      then the 16-bit parameters are all-gathered.
//   2: gradients sharded too (reduce-scatter), as stage 1 otherwise.
//   3: 16-bit parameters sharded too: a module's chunks are all-gathered before its
//      forward and backward and released after.
// Where each rank's shards live:
//   offload_optimizer none: master, m, v and gradient shards on the device, the step
//     on the device (sim: the CPU Adam on the device's compute stream; cuda: GPU Adam).
//   offload_optimizer cpu: master, m, v, gradients in pinned host memory; CPU Adam.
//   offload_optimizer nvme: master, m, v on NVMe (two slots each, see below);
//     gradients in pinned host memory; each chunk's state is read, stepped and written
//     back through a pool of pinned buffers sized by the engine from the host budget.
//   offload_param (stage 3 only): the 16-bit shards on host or NVMe between uses.
// Budgets (strata.device_budget / host_budget / nvme_budget) bound every tier: Create
// refuses (OutOfBudget) a configuration whose fixed needs do not fit, naming what it
// needs and what it has; high-water marks are reported in StepResult.
//
// Step semantics (the serial definition; the overlapped schedule must equal it):
//   g = sum over ranks and micro-batches of the gradients (the model divides by the
//       global batch); fp16: overflow anywhere -> step skipped on every rank, the loss
//       scale backs off (DeepSpeed's dynamic loss scaling);
//   norm = ||g / loss_scale||_2 over all shards; clip = max_norm / (norm + 1e-6) when
//       gradient_clipping > 0 and that is < 1, else 1 (DeepSpeed's rule);
//   Adam/AdamW on every owned shard with grad_scale = clip / loss_scale;
//   the updated fp32 master rounded to the compute dtype is what the next forward sees.
// Overlap (strata.overlap true; "auto", the default, times a few steps each way from the
// second on and keeps the faster): a chunk's optimizer step starts as soon as its
// gradient shard is final during the last micro-batch's backward, speculatively with
// clip = 1; Step() commits it when the global norm and overflow flag allow, otherwise
// discards it and steps that chunk again with the right scale. NVMe state is written to
// the block's other slot, so a discarded step costs no extra read.
//
// Threads: the hooks and Step() are called by one thread at a time (the training loop;
// not necessarily the same thread each time). The
// engine runs its own threads for collectives, copies, I/O and the CPU optimizer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/device.h"
#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata {

struct CheckpointMeta;   // checkpoint.h
struct CheckpointTimes;  // checkpoint.h
class HostArena;
class IoFaultHook;  // io.h: test-only fault injection
class Timeline;

// Writes elements [begin, begin + count) of tensor `tensor` (its id) in fp32. Called by
// Create for the shards this rank owns (and, stages 0-2, the full copy).
using ParamInit = std::function<void(TensorId tensor, int64_t begin, int64_t count, float* out)>;

struct EngineResources {
  Communicator* world = nullptr;  // required; host (MPI) collectives and bootstrap
  Device* device = nullptr;       // required
  // Collectives on device memory (gradient reduction, parameter gathers) with a CUDA
  // device: a device (NCCL) communicator over the same ranks as `world`, same rank
  // order (CreateNcclCommunicator(*world, ...)). Required on cuda when world has more
  // than one rank (Create says so, InvalidArgument, when it is missing, is not a device
  // communicator, or does not match world); unused at world size 1, where the engine
  // issues no device collective, and with the sim device, whose memory is host memory
  // (world serves). Borrowed: it must outlive the engine, and only the engine's comm
  // thread issues collectives on it while the engine lives. Host-tier traffic and the
  // engine's small host collectives always go through `world`.
  Communicator* device_comm = nullptr;
  // Optional; the engine makes its own from strata.host_budget when null.
  HostArena* host_arena = nullptr;
  // Optional; records compute, collectives, copies, I/O and optimizer work.
  Timeline* timeline = nullptr;
  // Tests only: handed to the engine's NVMe I/O engine (IoEngineOptions::fault_hook), so
  // tests drive the engine's own error paths against real files. Null in production.
  std::shared_ptr<IoFaultHook> io_fault_hook = nullptr;
};

// Where the time of a step went, in seconds of wall time on the calling thread, and
// what moved. busy_* count work on the engine's own lanes (they overlap with the rest).
struct StepResult {
  bool skipped = false;   // fp16 overflow: no update
  double loss_scale = 1;  // the scale used by this step's backward
  double grad_norm = 0;   // ||g / loss_scale||, after reduction, before clipping
  double clip_coef = 1;
  int speculative_steps = 0;  // chunks stepped during backward
  int redone_steps = 0;       // of those, stepped again (clipping engaged / overflow)
  double step_wait_s = 0;     // time Step() spent waiting for work still in flight
  // Of the time the training hooks took since the last Step(), the waits for the model's
  // own kernels (on a GPU its compute stream, which Release and EndBackward drain before
  // a buffer is reused): the model's compute, not the engine's. 0 on the sim device.
  double model_wait_s = 0;
  double optimizer_busy_s = 0;
  double comm_busy_s = 0;
  double io_busy_s = 0;
  // Stage 3: how many modules ahead gathers started during this step. Measured, not a
  // setting: from the previous step's mean gather latency and module compute time, within
  // what the device budget, stage3_max_live_parameters and stage3_prefetch_bucket_size
  // leave (the first step prefetches as far as they allow). 0 for stages 0-2.
  int prefetch_modules = 0;
  // Stage 3: gathered chunks released early because no planned gather buffer was free
  // (EnsureGathered); 0 unless the buffer plan (keep_plan.h) and the engine disagree,
  // which costs extra gathers, never a wrong result.
  int gather_evictions = 0;
  // Stage 3, parameters and optimizer on NVMe: parameter shard fetches served from the
  // pinned buffer the last step wrote them from, instead of read back from NVMe (the last
  // chunks the step updates, which the next forward needs first).
  int shards_from_memory = 0;
  uint64_t bytes_nvme_read = 0, bytes_nvme_written = 0;
  uint64_t bytes_h2d = 0, bytes_d2h = 0;
  uint64_t bytes_comm = 0;
  uint64_t device_high_water = 0, host_high_water = 0;
  // Whether this step overlapped the optimizer with its backward: strata.overlap, or
  // with "auto" the trial's or the decision's mode (the result is the same either way).
  bool overlapped = true;
};

// One part of a tier's fixed need, as the budget check counts it.
struct EngineNeedPart {
  std::string tier;  // "device", "pinned host", "NVMe"
  std::string what;  // "the optimizer state (fp32 master, m and v) and gradient shards"
  uint64_t bytes = 0;
};

struct EngineLayoutInfo {
  int64_t num_params = 0;  // real parameters
  int64_t chunk_elems = 0;
  int num_chunks = 0;
  int64_t shard_elems = 0;  // per chunk, per rank
  // Chunks held by tensors larger than a chunk (a run each: an embedding of a large
  // vocabulary). Their gathered values and gradients have device buffers of their own.
  int run_chunks = 0;
  // What the engine holds on each tier: the fixed parts (need_parts, which the budgets
  // are checked against) and the optional ones the budgets left room for. NVMe: the
  // stores' slots, none for chunks whose optimizer state is resident (the disk's free
  // space is checked for every chunk).
  uint64_t device_need = 0;
  uint64_t host_need = 0;
  uint64_t nvme_need = 0;
  // The fixed parts of the three needs (the optional ones: speculation spares, staging
  // depth, resident chunks, gather buffers).
  std::vector<EngineNeedPart> need_parts;
  bool gradients_on_nvme = false;  // strata.gradients resolved (optimizer on NVMe only)
  // Optimizer on NVMe: each chunk's shard is stepped in this many pieces (sub-groups) of
  // at most optimizer_piece_elems, bounded by zero_optimization.sub_group_size and by
  // 16 MiB of state, so that a few staging sets pipeline reads, steps and writes.
  int optimizer_pieces = 1;
  int64_t optimizer_piece_elems = 0;
  int optimizer_staging_sets = 0;    // pinned sets of one piece's state each
  int optimizer_padding_pieces = 0;  // this rank's pieces wholly in chunk padding: never moved
  // Optimizer on NVMe: chunks whose master, m and v stay in pinned host memory instead
  // (strata.optimizer_resident; by default as many as the host budget holds beside the
  // NVMe pipeline), chosen as those the backward finishes last. Their step reads and
  // writes no disk.
  int optimizer_resident_chunks = 0;
  // Optimizer and gradients on NVMe, where the shards go to disk and back each step
  // (accumulation, clipping, overlap off): chunks beyond the resident ones whose fp32
  // gradient shard waits in pinned memory instead, as many as the host budget holds
  // (strata.gradients auto), along the same order. With accumulation they are kept
  // before any state is.
  int gradient_resident_chunks = 0;
  // Optimizer on the CPU with offload_optimizer.ratio below 1: the chunks whose optimizer
  // state and gradient shard stay on the device (the (1 - ratio) share, rounded to the
  // nearest chunk), chosen as those the backward finishes last.
  int optimizer_device_chunks = 0;
  // Threads of the CPU optimizer's speculative steps (strata.optimizer_threads resolved).
  int optimizer_threads = 1;
  // Stage 3 with offload_param nvme: chunks whose parameter shard stays in pinned
  // host memory instead (strata.param_resident; by default as many as the host budget
  // holds after everything else), chosen as those the forward needs first. Their gathers
  // and publishes touch no disk. Always 0 with params_in_optimizer_state.
  int param_resident_chunks = 0;
  // Stage 3 with offload_param nvme: chunks whose parameter shard stays in device memory
  // (strata.param_on_device; by default as many as the device budget holds after the
  // gather window and the kept chunks). Their gathers read no disk and copy nothing from
  // the host. Always 0 with params_in_optimizer_state.
  int param_device_chunks = 0;
  // Stage 3, fp32 compute, optimizer and parameters both on NVMe: a gather reads the
  // parameter shard from the master part of the optimizer state on disk, so there is no
  // parameter swap and each step writes 4 bytes per parameter less. False when
  // sub_group_size cuts pieces below 1024 elements (each piece's master must start on a
  // 4 KiB boundary of the shard): the shard then has a swap of its own.
  bool params_in_optimizer_state = false;
  // Stage 3: chunks that stay gathered on the device from their forward use to their
  // backward use instead of being gathered twice: those under
  // stage3_param_persistence_threshold, then the nearest reuses within
  // stage3_max_reuse_distance, as the device budget allows after the prefetch window.
  int kept_chunks = 0;
  // Stage 3 with gradient_accumulation_steps > 1: chunks that stay gathered from the end
  // of one micro-batch's backward to their use in the next micro-batch's forward (the
  // lowest chunks, within stage3_max_reuse_distance, as the same buffers allow).
  int carried_chunks = 0;
  // Stage 3 with the optimizer and the parameters on NVMe: how many chunks' updated
  // shards the step leaves in host memory, where the next forward's first gather takes
  // them without a read (the last ones stepped, which the forward gathers first).
  int fresh_param_shards = 0;
  // Stage 3 with the optimizer state on NVMe, where whole shards would not fit the host
  // budget: shards stream through pinned pieces, this many optimizer pieces to a half of
  // a gather's staging (0: whole shards).
  int param_stream_pieces = 0;
  // ... and where one pinned gradient shard does not fit either: the gradient shards go
  // to NVMe and back a piece at a time.
  bool gradient_pieces_on_nvme = false;
};

class Engine : public ModuleHooks {
 public:
  // Lays out the model's tensors, checks budgets, allocates every tier and initialises the
  // parameters with `init`. Collective over resources.world (all ranks call it with
  // the same config and modules; a mismatch is InvalidArgument naming the first
  // differing key). Errors: InvalidArgument (config/layout), OutOfBudget (a tier that
  // cannot hold what the configuration needs), Unavailable (missing device or MPI),
  // IoError/ResourceExhausted (swap files); Unavailable for a CUDA device in a build
  // without CUDA.
  static Result<std::unique_ptr<Engine>> Create(const Config& config, ModelDecl model, const ParamInit& init,
                                                const EngineResources& resources);
  // The plan Create would follow, allocating nothing and creating no file: the layout and
  // each tier's need (the memory account `strata plan` ranks). Collective over
  // resources.world as Create; the same errors, up to and including OutOfBudget.
  static Result<EngineLayoutInfo> Plan(const Config& config, ModelDecl model,
                                       const EngineResources& resources);
  ~Engine() override;

  // --- hooks the model calls (ModuleHooks) ---
  // Fetch and BeginBackward: the module's full compute parameters are on the device; the
  // pointers stay valid until the matching Release / EndBackward. BeginBackward also
  // hands out the gradient buffers (fp32; accumulate per tensor, module_hooks.h). Once
  // the last backward use of a chunk's tensors in the micro-batch is done, its gradients
  // are reduced (asynchronously) into the gradient shards.
  // The uses of a micro-batch must include every backward use of a module that the
  // recording says was already final for its chunk: a backward of a module whose
  // chunk's reduction has started is refused (FailedPrecondition; the engine fails),
  // which happens only when modules gain backward uses with an unchanged forward (a
  // frozen module unfrozen mid-run).
  // An argument error (module out of range) changes nothing. Any other error (a gather
  // that failed to read, a reduction that failed) leaves the engine failed as a failed
  // Step() does (below): every later hook, BeginMicroBatch and Step return
  // FailedPrecondition naming the hook and the error, so no step applies an
  // incomplete window's gradients. With several ranks, a rank whose engine fails (in a
  // hook, in Step() or in a write behind Step()) posts that on the world communicator
  // and on the device one (EngineResources::device_comm, NCCL) when that is another
  // (Communicator::PostFailure): the other ranks' collectives end at once with Aborted
  // naming it, their engines fail the same way, and the world is then failed for good
  // (end the job; GatherMaster, a collective, no longer works there).
  Result<ModuleParams> Fetch(int module) override;
  Status Release(int module) override;
  Result<ModuleBackward> BeginBackward(int module) override;
  Status EndBackward(int module) override;

  // Hands in the gradient of one tensor computed outside the hooks, by code that runs its
  // own autograd (PyTorch): adds `grad` (the tensor's elements, fp32, bf16 or fp16; host
  // memory on sim, device memory on cuda, written on the model stream) into the tensor's
  // gradient for this micro-batch. It counts as a backward use in the recorded call order,
  // so the tensor's chunk is reduced once every gradient and backward the recording
  // expects of it has come. The tensor's parameters need not be fetched. Errors:
  // InvalidArgument (id, null data or dtype; nothing changed), otherwise as the hooks.
  Status AccumulateGrad(TensorId tensor, const void* grad, DType dtype);

  // Evaluation passes (a validation loss, sampling): between Step() and the next
  // micro-batch, SetEvaluating(true) makes Fetch/Release serve forward passes that belong
  // to no micro-batch. They are not recorded in the call order and start no micro-batch;
  // at stage 3 they gather on demand and release what no module holds. BeginBackward,
  // AccumulateGrad, BeginMicroBatch and Step are refused (FailedPrecondition, nothing
  // changed) until SetEvaluating(false). Inside a micro-batch, or while module hooks hold
  // chunks: FailedPrecondition.
  Status SetEvaluating(bool evaluating);

  // Sets the learning rate of every optimizer step from the next one on (until then:
  // optimizer.params.lr). A schedule's rate for the next step is LearningRateAt
  // (lr_schedule.h). Call it between Step() (or Create) and the next BeginMicroBatch:
  // chunks are stepped speculatively during a window's backward, so the rate must not
  // change inside one. Every rank must set the same rate (not checked: replicas and
  // shards would drift apart). Errors, nothing changed: InvalidArgument for a rate that
  // is negative or not finite in fp32; FailedPrecondition inside a micro-batch or an open
  // accumulation window (BeginMicroBatch, or a hook that began one, since the last
  // Step()), or once the engine has failed.
  Status SetLearningRate(double lr);
  // The rate the next step uses, in fp32 as the optimizer applies it.
  double learning_rate() const;

  // Marks the start of a micro-batch (the training loop calls it before each forward).
  // The engine counts micro-batches to know which one is the last before Step().
  Status BeginMicroBatch();
  // Ends the accumulation window: waits for gradient reduction, computes the global
  // norm and overflow, runs (or commits) the optimizer on every owned shard and puts
  // the updated compute parameters where the next forward needs them.
  // Called while module hooks hold chunks: FailedPrecondition, nothing changed. Any
  // other error (e.g. an NVMe write that failed) leaves the engine failed: what the step
  // left in flight is waited for, and with the optimizer state on NVMe (the tier with
  // I/O to fail) what it had committed is cancelled, so GatherMaster reads the
  // parameters of the last Step() that succeeded. With the optimizer in memory a step
  // whose parameter writes fail still completes its update of the master, so
  // GatherMaster reads a whole step: that one, or the one before when the failure came
  // in a speculative step during the backward; BeginMicroBatch and Step
  // then return FailedPrecondition naming the error (train on with a new engine).
  Result<StepResult> Step();
  // Step() returns before the optimizer's last writes reach NVMe: they finish while the
  // next forward runs (every read of what they write waits for them, and the next step
  // writes no optimizer state before they are all on disk). Flush waits for them, e.g.
  // before timing the end of a run or saving a checkpoint; the destructor does so too.
  // Call it on the training thread between Step() and the next micro-batch; the first
  // write error. A write that fails after its Step() returned (seen here, by
  // GatherMaster, or by the next step's hooks or Step()) undoes that whole step on every
  // chunk, so GatherMaster reads the step before it, and leaves the engine failed as a
  // failed Step() does ("an earlier write behind Step() failed").
  Status Flush();

  // The loss scale the model must multiply its loss by (1 unless fp16).
  double loss_scale() const;
  DType compute_dtype() const;
  // How the model must run its kernels on the engine's device: Backend::kCpu on
  // sim (the hooks hand out host-addressable memory), kCuda on a GPU, with
  // model_stream() (a cudaStream_t as void*; nullptr on sim) as the Mlp's stream:
  // EndBackward (and at stage 3 Release) synchronizes that stream before the
  // engine touches what the module's kernels read or wrote.
  Backend model_backend() const;
  void* model_stream() const;
  const EngineLayoutInfo& layout_info() const;

  // Copies the full fp32 master parameters (gathered from all ranks, every tier) of
  // tensor `tensor` (its id) into `out`. Collective over the world.
  Status GatherMaster(TensorId tensor, std::vector<float>* out);

  // Checkpoints (checkpoint.h: the directory's layout, CheckpointPath, LatestCheckpoint,
  // KeepNewestCheckpoints). Each call is collective over the world (every rank, the same
  // `dir` on a file system all ranks share) and is made on the training thread between
  // Step() and the next micro-batch.
  // StartCheckpoint begins saving the state as of the last Step(): this rank's fp32
  // master, Adam m and v from whatever tier holds them, the optimizer step count, the
  // loss scaler, the learning rate, the recorded call order and meta.json. It returns
  // once the save knows where every block is (after a Flush()); a worker thread writes
  // the files while training goes on, and the optimizer waits before it overwrites a
  // block the save has not read yet (NVMe state is overwritten two steps on, memory
  // state one step on when stepped in place). State on the device is written out before
  // it returns. A save still in progress is finished first. Host memory while it runs:
  // 24 MiB of stream buffers and two optimizer pieces (NVMe), whatever the model size.
  // Errors: InvalidArgument for meta.json that is not JSON, FailedPrecondition for a
  // `dir` that holds something else or an engine that cannot save now, Aborted naming a
  // rank that cannot; the engine and `dir` are as they were.
  Status StartCheckpoint(const std::string& dir, const CheckpointMeta& meta);
  // FinishCheckpoint waits for this rank's files, then (rank 0) writes the manifest and
  // renames the save into place: `dir` appears, complete, only once every rank's files
  // are on disk, replacing an older checkpoint at `dir` atomically. Call it after a later
  // Step() (or at once); FailedPrecondition without a save in progress. A failed save
  // (IoError / ResourceExhausted from the disk, Aborted naming a rank that failed)
  // leaves `dir` as it was and training may go on. Returns where the training thread
  // and the optimizer waited for the save.
  Result<CheckpointTimes> FinishCheckpoint();
  bool checkpoint_in_progress() const;
  // SaveCheckpoint is StartCheckpoint and FinishCheckpoint at once.
  Status SaveCheckpoint(const std::string& dir, const CheckpointMeta& meta);
  // LoadCheckpoint (a save in progress is finished first) restores what SaveCheckpoint
  // saved into this engine's tiers (any
  // offload, stage, world size and chunk size: a checkpoint laid out otherwise is
  // resharded, each rank pulling its shards tensor by tensor from the saving ranks'
  // files), republishes the compute parameters, and fills *meta (may be null). Given the
  // same batches, the steps that follow are bit-identical to the saving run's with as
  // many ranks (with another chunk size too, unless gradient clipping sums its norm in
  // another order); the learning rate is restored too (a schedule may set it anew).
  // Refused with nothing changed: NotFound (no manifest, a missing file naming its
  // rank), InvalidArgument naming a tensor whose name or shape differs (another model),
  // Corruption for a file of the wrong size, and (resharding) Corruption naming the file
  // and chunk for a checksum mismatch in any saved chunk it reads. Without resharding, a
  // checksum mismatch or an I/O error found while restoring leaves the engine failed (as
  // a failed Step(): create a new engine); the world stays usable. Host memory it adds:
  // 24 MiB, and while it republishes, one chunk shard's master and compute copy.
  Status LoadCheckpoint(const std::string& dir, CheckpointMeta* meta);

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata
