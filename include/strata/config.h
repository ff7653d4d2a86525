// strata's configuration: a JSON document with DeepSpeed's keys where they mean the
// same thing, and strata's own settings under "strata".
//
// Contract:
//  - ParseConfig validates everything: an unknown key, a wrong type or an impossible
//    value is InvalidArgument naming the key path and what is accepted, e.g.
//      zero_optimization.offload_optimizer.device: expected one of none|cpu|nvme, got "gpu"
//  - A DeepSpeed key whose feature strata does not implement yet is rejected as
//    "not supported yet" (never accepted and ignored). docs/config.md lists every key.
//  - Byte sizes accept a number or a string with a unit ("64MiB", "1.5GB", 2e9).
//  - Config is a plain value; thread-safe to read.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "strata/lr_schedule.h"
#include "strata/status.h"

namespace strata {

enum class OffloadDevice { kNone, kCpu, kNvme };
std::string_view OffloadDeviceName(OffloadDevice d);

struct OffloadConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::vector<std::string> nvme_path;  // one path per NVMe device; blocks stripe across them
  bool pin_memory = true;
  int buffer_count = 0;        // 0: derived by the engine (DeepSpeed's knob; accepted as an upper bound)
  uint64_t buffer_size = 0;    // offload_param only; 0: derived
  bool pipeline_read = true;   // offload_optimizer only
  bool pipeline_write = true;  // offload_optimizer only
  // offload_optimizer only, DeepSpeed's meaning: the fraction of the optimizer state (by
  // chunk, rounded to the nearest) that the CPU Adam steps; the rest stays on the device.
  // Below 1 it needs device "cpu".
  double ratio = 1;
};

struct ZeroConfig {
  int stage = 0;
  OffloadConfig offload_optimizer;
  OffloadConfig offload_param;
  uint64_t reduce_bucket_size = 500'000'000;
  uint64_t allgather_bucket_size = 500'000'000;
  bool overlap_comm = true;
  uint64_t stage3_prefetch_bucket_size = 0;  // parameters; 0: up to 3 modules ahead, device budget allowing
  uint64_t stage3_max_live_parameters = 0;   // 0: bounded by the device budget only
  uint64_t stage3_max_reuse_distance = 1'000'000'000;
  uint64_t stage3_param_persistence_threshold = 0;
  uint64_t sub_group_size = 1'000'000'000;
};

struct AioConfig {
  uint64_t block_size = 1 * 1024 * 1024;
  int queue_depth = 32;
  int intra_op_parallelism = 1;  // I/O threads, one ring each
  bool single_submit = false;
  bool overlap_events = true;
};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0;  // 0: dynamic
  int initial_scale_power = 16;
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1;
};

enum class OptimizerType { kAdamW, kAdam };

struct OptimizerConfig {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

enum class DeviceKind { kAuto, kSim, kCuda };
std::string_view DeviceKindName(DeviceKind k);
enum class IoBackendKind { kAuto, kIoUring, kPsync };
std::string_view IoBackendKindName(IoBackendKind k);

// strata's own settings (the "strata" key).
struct StrataConfig {
  DeviceKind device = DeviceKind::kAuto;
  int device_index = 0;
  uint64_t device_budget = 0;  // 0: the device's free memory (sim: 8 GiB)
  uint64_t host_budget = 0;    // 0: derived from memlock limit and free memory
  uint64_t nvme_budget = 0;    // 0: free space on the swap paths
  uint64_t chunk_size = 64ull << 20;
  std::vector<std::string> swap_paths;  // default: offload nvme_path, else ./strata-swap
  std::string trace_file;               // Chrome trace (Perfetto) output, "" = none
  IoBackendKind io_backend = IoBackendKind::kAuto;
  bool io_sqpoll = false;
  bool checksum = true;
  // Overlap the optimizer with the backward (engine.h). overlap_auto ("auto", the
  // default): the engine times a few steps each way and keeps the faster
  // (zero/overlap_tuner.h); `overlap` is then the mode it starts in. true or false: fixed.
  bool overlap = true;
  bool overlap_auto = true;
  // Threads of the CPU optimizer's speculative steps, which run beside the backward: a
  // number (at most this machine's cores), or 0 ("auto"): every core when the device
  // computes (cuda), one on the sim device, whose backward runs on the cores. The steps
  // after the backward (and every step with overlap off) use every core.
  int optimizer_threads = 0;
  // Where the fp32 gradient shards wait for the step when the optimizer state is on
  // NVMe: "host", "nvme", or "auto" (NVMe when overlap is on and clipping off, since
  // they never reach the disk then; else pinned host memory if the host budget holds
  // them; else NVMe). Other offload settings keep them beside the optimizer state.
  std::string gradients = "auto";
  // "auto": `strata train` chooses zero_optimization.stage, both offload devices and
  // strata.overlap with `strata plan` before the engine starts, and refuses a config
  // that also sets any of them. The engine itself refuses "auto" (a program that creates
  // the engine plans with tools::PlanConfigurations). "off".
  std::string plan = "off";
  // The optimizer state on NVMe: the fraction of chunks whose master, m and v stay in
  // pinned host memory instead (0-1), or -1 ("auto"): as many as the host budget holds
  // beside the NVMe pipeline of the rest.
  double optimizer_resident = -1;
  // The optimizer state on NVMe, gradients on the NVMe path: the fraction of chunks whose
  // fp32 gradient shard waits in pinned host memory instead (0-1; the resident chunks'
  // always do), or -1 ("auto"): where the shards would go to disk and back each step,
  // as many as the host budget holds (residency_plan.h), else none beyond the resident.
  double gradient_resident = -1;
  // Stage 3 with offload_param nvme: the fraction of chunks whose 16-bit parameter shard
  // stays in pinned host memory instead (0-1), or -1 ("auto"): as many as the host
  // budget holds after everything else (optimizer residency included).
  double param_resident = -1;
  // Stage 3 with offload_param nvme: the fraction of chunks whose 16-bit parameter shard
  // stays in device memory instead (0-1, a fixed device need), or -1 ("auto"): as many
  // as the device budget holds after the gather window and the kept chunks.
  double param_on_device = -1;
  double collective_timeout_s = 300;
};

struct Config {
  ZeroConfig zero;
  AioConfig aio;
  bool bf16 = false;
  Fp16Config fp16;
  double gradient_clipping = 0;  // 0: off
  // DeepSpeed's three batch keys, tied by train_batch_size = micro batch x accumulation
  // x world size. As parsed, 0 (and accumulation_given false) means the key was absent;
  // ResolveBatchSizes fills in the rest once the world size is known.
  int gradient_accumulation_steps = 1;
  bool gradient_accumulation_given = false;
  int train_micro_batch_size_per_gpu = 0;
  int train_batch_size = 0;
  OptimizerConfig optimizer;
  // DeepSpeed's `scheduler` block: the learning rate of each optimizer step, with
  // LearningRateAt(scheduler, step, optimizer.lr) (lr_schedule.h). Absent: kConstant,
  // optimizer.lr every step.
  LrSchedule scheduler;
  // DeepSpeed's `activation_checkpointing` block is present: a model that can recompute
  // activations in the backward does (model::Gpt: every block, Gpt::set_recompute).
  bool activation_checkpointing = false;
  StrataConfig strata;
  uint64_t seed = 1234;
};

// The swap directories of a store kept for `offload` (the optimizer's or the
// parameters'): its nvme_path, else strata.swap_paths. One rule for the engine's stores
// and for the tools that measure their disk.
const std::vector<std::string>& SwapPaths(const Config& config, const OffloadConfig& offload);

// DeepSpeed's batch rule over `world_size` ranks: whichever of train_batch_size,
// train_micro_batch_size_per_gpu and gradient_accumulation_steps the config left out is
// derived from the others (with train_batch_size alone, accumulation is 1; with neither
// batch size, the micro batch is `default_micro_batch`, where DeepSpeed would refuse).
// InvalidArgument naming the three values when the given ones disagree or do not
// divide. Idempotent: a resolved config stays as it is.
Status ResolveBatchSizes(Config* config, int world_size, int default_micro_batch);

// Parses and validates a configuration document.
Result<Config> ParseConfig(const nlohmann::json& doc);
Result<Config> ParseConfigText(std::string_view json_text);
// Reads a file; a missing file is NotFound naming the path, bad JSON is
// InvalidArgument with line and column.
Result<Config> LoadConfigFile(const std::string& path);
// The canonical JSON form of a config (every key, defaults filled in). Used for the
// cross-rank consistency hash and for `strata info --json`.
nlohmann::json ConfigToJson(const Config& config);

}  // namespace strata
