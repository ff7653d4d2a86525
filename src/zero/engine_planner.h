// The engine's plan: what each tier must hold, checked against its budget, and the
// optional parts the budgets leave room for (speculation spares, NVMe staging depth,
// resident optimizer chunks and parameter shards, pinned gradient shards, gather
// buffers). A function of the configuration, the layout, the call order and the
// budgets: it allocates nothing and creates no file (it reads only the free space of the
// swap paths), so `strata plan` runs it for configurations it never trains, tests run
// it alone, and the engine allocates what it says.
//
// The budgets come in measured: the device's is a collective (the least room any rank
// has), and the host's depends on whether the plan needs pinned memory at all.
#pragma once

#include <functional>
#include <vector>

#include "strata/config.h"
#include "strata/dtype.h"
#include "strata/status.h"
#include "zero/budget_check.h"
#include "zero/gather_plan.h"
#include "zero/layout.h"
#include "zero/piece_plan.h"
#include "zero/trace.h"

namespace strata::zero {

// Pinned buffers for compute values on their way between the optimizer, the device and
// the parameter tier (one per worker that may hold one at a time, plus one).
inline constexpr int kParamStaging = 3;
// Stage 3 reading whole shards from NVMe: the fetch window the staging buffers are sized
// for where the host budget has room, in modules. A gather is read into a staging
// buffer, so the buffers bound how far ahead the gathers run (gather_plan.h); three
// modules is the depth PrefetchDepth asks for when a gather takes up to twice a
// module's compute. Beyond kParamStaging only where a module spans several chunks (a
// GPT block's half spans two of them: three buffers hold one module ahead).
inline constexpr int kFetchWindowModules = 3;
// Stage 3, optimizer and parameters on NVMe: buffers for the updated shards on their way
// to NVMe; the last ones filled stay as the next forward's fresh copies.
inline constexpr int kOut16Staging = 2;
// Stage 3 with the optimizer state on NVMe, when shard-sized pinned buffers would not
// fit the host budget: each parameter staging buffer holds two halves of this many
// pieces (a gather reads one half while the other goes to the device), no updated shard
// is kept in memory, the step's compute values go out a piece at a time, and one pinned
// gradient shard waits for the step instead of two. The pinned need then stops growing
// with the module, but for that one gradient shard.
inline constexpr int kStreamPieces = 4;
// Streamed shards whose one pinned gradient shard does not fit either: the gradient goes
// to NVMe and back in pieces (piece_swap.h), through this many pinned pieces on the way
// out and two on the way back (the piece stepped and the next).
inline constexpr int kGradWritePieces = 4;
inline constexpr int kGradReadPieces = 2;
// Ranges a gradient shard is read back in to be accumulated (engine_grads.cc).
inline constexpr int kGradReadRanges = 4;
// Streamed shards whose compute values are not the master (bf16 or fp16 on NVMe, or
// parameters in host or device memory): the step's new values go to the shard a piece at
// a time (to NVMe behind) through this many pinned pieces.
inline constexpr int kStreamWritePieces = 4;
// A reduced gradient reaches a host-side shard through pinned staging of at most this
// much (and at most sub_group_size values), a piece at a time, so the staging does not
// grow with the module.
inline constexpr uint64_t kRecvStagingBytes = 16ull << 20;

struct PlanFacts {
  const Config* config = nullptr;
  const Layout* layout = nullptr;
  const Trace* trace = nullptr;  // the call order expected
  int stage = 0;
  int world_size = 1;
  ZeroTier opt_tier = ZeroTier::kDevice;
  ZeroTier param_tier = ZeroTier::kDevice;
  DType compute = DType::kF32;
  int64_t opt_elems = 0;        // elements of a chunk this rank steps
  int64_t opt_offset = 0;       // where they start in the chunk
  bool overlap = true;          // plan for speculation (its spares)
  bool host_accessible = true;  // whether the host addresses device memory (sim)
  TierBudget device_budget;
  std::function<TierBudget(bool host_needed)> host_budget;
};

struct EnginePlan {
  // The fixed part of each tier's need (then the optional parts' totals below).
  TierNeed device{ZeroTier::kDevice, {}}, host{ZeroTier::kHost, {}}, nvme{ZeroTier::kNvme, {}};
  TierBudget device_budget, host_budget;
  size_t max_module_chunks = 1;  // the most chunks outside runs one module touches
  int grad_buffers = 0;          // gradient buffers of the pool
  uint64_t recv_elems = 0;       // the reduce buffer on the device
  int fixed_gather = 0;          // stage 3: gather buffers every configuration needs
  bool out16_on_device = false;  // the device optimizer's output goes through device staging
  // The NVMe optimizer's pieces, and whether parameters go behind it or come from it.
  PieceShape pieces;
  uint64_t opt_set_bytes = 0, grad_slot_bytes = 0;
  bool publish_behind = false, param_from_master = false;
  ZeroTier grad_tier = ZeroTier::kDevice;  // where the fp32 gradient shard waits
  // By chunk (empty when none): state on the device under a CPU optimizer (ratio);
  // state of the NVMe optimizer kept in pinned memory.
  std::vector<uint8_t> opt_on_device, opt_resident;
  // By chunk (empty when none): state on NVMe, gradient shard kept in pinned memory
  // instead of going to NVMe and back (grad_tier nvme; residency_plan.h).
  std::vector<uint8_t> grad_resident;
  // Stage 3 with a parameter swap: by chunk, the tier of its 16-bit shard, host
  // (strata.param_resident) or device (strata.param_on_device) for those kept off the
  // disk; empty when every shard is on NVMe.
  std::vector<ZeroTier> param_tiers;
  int param_resident_chunks = 0, param_device_chunks = 0;
  // The optional parts.
  int spares = 0;             // speculation spares
  int opt_staging_count = 0;  // NVMe optimizer staging sets
  int grad_host_count = 0;    // pinned gradient shards on their way to NVMe
  int param_staging = 0;      // stage 3: parameter staging buffers, kParamStaging and more
  // Stage 3: pinned bytes of each parameter staging buffer (a shard, or two halves of
  // stream_pieces pieces); stream_pieces 0: whole shards (kStreamPieces).
  uint64_t param_stage_bytes = 0;
  int stream_pieces = 0;
  bool stream_grads = false;  // gradient shards to NVMe and back in pieces (piece_swap.h)
  GatherPlan gather;          // stage 3
  // What each tier will hold, optional parts included; NVMe: only the chunks on disk.
  uint64_t device_need = 0, host_need = 0, nvme_need = 0;
  uint64_t recv_staging_elems = 0;  // the pinned staging of a reduced gradient
};

// PlanEngine's parts, one method per tier and one for the optional parts
// (engine_planner.cc, engine_planner_extras.cc); used once, by PlanEngine.
class EnginePlanner {
 public:
  explicit EnginePlanner(const PlanFacts& facts);
  Result<EnginePlan> Plan();

 private:
  void PlanPieces();
  void PlanDeviceNeed();
  // Also decides where NVMe-optimizer gradients wait, and whether the parameters stream
  // (kStreamPieces): only when whole shards would not fit.
  void PlanHostNeed();
  void PlanHostNeedAs(bool stream, bool stream_grads);
  // Where an NVMe optimizer's gradient shards wait (pinned, or on NVMe: whole, or in
  // pieces), added to the host need `h`; `resident`: chunks whose state stays in memory.
  void PlanNvmeGradients(TierNeed& h, bool stream, bool stream_grads, int resident);
  // NVMe bytes of one chunk's gradient shard: one slot, or a slot per piece.
  uint64_t GradDiskBytes() const;
  // Whether gradient shards on the NVMe path go to disk and back each step: with
  // accumulation, clipping (a redone step), overlap off, or in pieces. Otherwise the
  // speculative step takes each from its pinned buffer (engine_grads.cc).
  bool GradsTouchDisk() const;
  // strata.optimizer_resident set: adds the state of the chunks it asks for to the host
  // need `h`; their count (0 when unset). PlanExtras marks which (residency_plan.h).
  int PlanExplicitResidency(TierNeed& h);
  // strata.<key> (param_resident: `need` is the host's; param_on_device: the device's)
  // as a fraction: the shards it keeps, of `shard_bytes` each, a fixed need.
  void PlanExplicitParamShards(TierNeed& need, const char* key, double fraction, uint64_t shard_bytes);
  void PlanNvmeNeed();
  // strata.param_resident and param_on_device against the layout: InvalidArgument where
  // there is no parameter swap to keep, or the two fractions ask for more than every chunk.
  Status CheckParamKeys() const;
  // The fixed needs of every tier against their budgets, NVMe first (budget_check.h).
  Status PlanMemory();
  // The optional parts, as the budgets leave room: speculation spares, NVMe staging
  // sets, pinned gradient shards, gather buffers; and what each tier will hold.
  void PlanExtras();
  // Marks the parameter shards kept in memory: the explicit count, or (auto) as many as
  // `room` holds; the chunks the forward needs first. Returns the pinned bytes the auto
  // mode adds.
  uint64_t PlanParamResidency(uint64_t room);
  // With a parameter swap: the shards strata.param_on_device keeps on the device (an
  // explicit share; the auto one comes later, PlanParamDevice) and strata.param_resident
  // in host memory (explicit, or as many as `room` pinned bytes hold).
  struct KeptShards {
    int device = 0, host = 0;
  };
  KeptShards KeptParamShards(uint64_t room) const;
  // Stage 3 reading whole parameter shards from NVMe: the staging buffers beyond the
  // fixed kParamStaging that kFetchWindowModules modules want, as `room` pinned bytes
  // allow (0 otherwise).
  int ExtraParamStaging(uint64_t room) const;
  // Auto strata.param_on_device: as many of the shards still on disk as `room` device
  // bytes hold, the next ones the forward needs; returns the device bytes added.
  uint64_t PlanParamDevice(uint64_t room);
  // Moves `count` shards still on NVMe to `tier`: the chunks the forward needs first.
  void MoveParamShards(ZeroTier tier, int count);
  // Stage 3: the gather buffers, prefetch window, kept and carried chunks within `room`
  // device bytes; the device bytes they add beyond the fixed gather buffers.
  uint64_t PlanGatherBuffers(uint64_t room);

  int DeviceChunkCount() const;  // what offload_optimizer.ratio keeps on the device
  int RunChunks() const { return layout_.RunChunks(); }
  uint64_t RunGradBytes() const;
  uint64_t RunParamBytes() const;
  uint64_t RecvStagingElems() const;
  uint64_t ResidentStateBytes() const { return Align4K(12ull * opt_elems_); }         // one chunk's, pinned
  uint64_t ParamShardBytes() const { return Align4K(layout_.shard_elems * csize_); }  // pinned
  uint64_t DeviceShardBytes() const { return layout_.shard_elems * csize_; }
  // Stage 3 parameter shards with an NVMe swap of their own (not read from the master).
  bool ParamsSwapped() const {
    return stage_ == 3 && param_tier_ == ZeroTier::kNvme && !out_.param_from_master;
  }

  const PlanFacts& facts_;
  const Config& config_;
  const Layout& layout_;
  const Trace& trace_;
  const int stage_, world_size_;
  const ZeroTier opt_tier_, param_tier_;
  const DType compute_;
  const size_t csize_;
  const int64_t opt_elems_, opt_offset_;
  const bool overlap_;
  EnginePlan out_;
};

// OutOfBudget (naming every tier that cannot hold its fixed part and what would help)
// or InvalidArgument for settings that contradict each other.
Result<EnginePlan> PlanEngine(const PlanFacts& facts);

}  // namespace strata::zero
