// The step-time model: from the bandwidth of each lane, measured on this machine in the
// same run, and the work each lane must do in one step, the time a step cannot beat
// (the bound) and the time it would take if nothing overlapped (the serial time).
//
// Lanes that share a resource count as one: on the sim device the model's compute, the
// CPU Adam, the host<->device copies and the host collectives all run on the same CPU
// cores, so the bound is max(sum of the CPU lanes, sum of the NVMe lanes) there; on a
// GPU, compute, copies and the CPU Adam are separate resources.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/status.h"

namespace strata::tools {

// What a real step of the engine adds to the probes (engine_calibration.h), per element
// its optimizer steps (chunk padding included).
struct EngineRates {
  double optimizer_params_per_s = 0;  // the optimizer lane's busy time in a serial step
  // The rest of a serial step beyond the lanes; negative where they overlap within it.
  double other_s_per_param = 0;
  double overlap_factor = 1;  // the overlapped step over the serial one
};

struct LaneRates {
  double adam_params_per_s = 0;  // CPU Adam, fp32 grads with the 16-bit copy
  double copy_bytes_per_s = 0;   // memcpy between pinned buffers (the sim device's copies)
  double nvme_read_bytes_per_s = 0;
  double nvme_write_bytes_per_s = 0;
  // Reads and writes at once, in the step's proportion: what the disk does for the mix a
  // pipelined step gives it (below the additive rate when the two interfere).
  double nvme_mixed_bytes_per_s = 0;
  std::string nvme_backend;
  // From the engine's own steps (engine_calibration.h); 0 when not measured: the model's
  // forward and backward, and the engine with its optimizer on the device, on the host,
  // and on NVMe (its state held in pinned memory, so the code path without the disk).
  double compute_flops_per_s = 0;
  EngineRates device_optimizer, host_optimizer, nvme_optimizer;
  // The host optimizer at stage 3 (its gathers and hooks); a profile without it uses
  // host_optimizer's.
  EngineRates host_optimizer_stage3;
  // A CPU optimizer's chunks on the device (offload_optimizer.ratio): stage 1 with every
  // chunk there; a profile without it uses device_optimizer's.
  EngineRates device_split;
  // The NVMe optimizer whose master is the parameter shard (fp32, parameters on NVMe:
  // EngineLayoutInfo::params_in_optimizer_state); a profile without it uses
  // nvme_optimizer's.
  EngineRates nvme_optimizer_master;
};

// A saved profile: {"adam_params_per_s": ..., "copy_bytes_per_s": ..., ...}, the
// "rates" object of `strata bench step --json` and of `strata plan --json`.
nlohmann::json RatesToJson(const LaneRates& r);
// Reads RatesToJson's object, or a whole plan report holding one under "rates".
// InvalidArgument naming a key that is missing (the probes' adam and copy rates, and
// each field of an engine calibration given) or not a number >= 0 (other_s_per_param
// may be negative). A bench step
// report's rates lack the compute and engine rates: those read as 0 (unmeasured).
Result<LaneRates> RatesFromJson(const nlohmann::json& j);

// Measures the rates: Adam over `adam_params` parameters (1M-16M of them), memcpy over
// 64 MiB, and when nvme_dir is not empty, O_DIRECT reads and writes of a file of
// nvme_probe_bytes there (at least 64 MiB) with the I/O engine (1 MiB blocks, queue depth 32, buffers on huge
// pages as the engine's). A probe as large as a step's traffic measures the rate the
// disk sustains over a step, not a burst its write cache absorbs; each rate is the best
// of three passes. The mixed pass reads and writes at once, read_fraction of its bytes
// read. Takes a few seconds.
Result<LaneRates> MeasureLaneRates(const std::string& nvme_dir, int64_t adam_params,
                                   uint64_t nvme_probe_bytes = 256ull << 20, double read_fraction = 0.5);

// Each rate the better of a and b (two probes of the same machine).
LaneRates BestOf(const LaneRates& a, const LaneRates& b);

struct LaneWork {
  double compute_s = 0;  // measured: the model's passes without the hooks' waits
  double adam_params = 0;
  double adam_params_device = 0;  // of adam_params, those a CPU optimizer leaves on the device (ratio)
  double copy_bytes = 0;
  double comm_bytes = 0;
  double nvme_read_bytes = 0;
  double nvme_write_bytes = 0;
  // Of nvme_read_bytes, the parameter shards the gathers read (the forward and backward
  // wait for them); 0 where not predicted.
  double nvme_param_read_bytes = 0;
  // With accumulation over `micro_batches`, the gradient bytes the disk moves before the
  // last micro-batch's backward (its shards written and read back between micro-batches):
  // work the step's own state traffic cannot share the disk with. Part of the read and
  // write totals above.
  int micro_batches = 1;
  double nvme_between_read_bytes = 0, nvme_between_write_bytes = 0;
  bool params_in_optimizer_state = false;  // the layout's: the NVMe master is the parameter shard
  // The NVMe optimizer's own traffic (part of the totals above) and the staging sets it
  // pipelines through; with fewer than zero::kMinStagingSets a piece's read, step and
  // write follow one another (0 sets: no state on disk).
  struct StatePipeline {
    double read_bytes = 0, write_bytes = 0, params = 0;
    int staging_sets = 0;
  } nvme_state;
};

struct StepModel {
  std::vector<std::pair<std::string, double>> lanes;  // name -> seconds
  double cpu_s = 0, nvme_s = 0;
  double bound_s = 0;   // the time a step cannot beat
  double serial_s = 0;  // the sum of every lane
  // The same bound with the disk's reads and writes timed together at the mixed rate
  // (a pipelined step mixes them); 0 when no mixed rate was measured.
  double nvme_mixed_s = 0, bound_mixed_s = 0;
};

StepModel ModelStep(const LaneRates& rates, const LaneWork& work, bool shared_cpu);
nlohmann::json ToJson(const StepModel& m);

}  // namespace strata::tools
