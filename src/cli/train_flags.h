// The flags `strata train` and `strata bench step|swap` share, and how they become a
// config, a model and a world. A flag overrides the config file's key only when it is
// given; what neither sets keeps the config's default (or the tool's, named in the
// start-up summary). A flag of the model not chosen is refused, not ignored.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/cli_fwd.h"
#include "cli/gpt_flags.h"
#include "cli/run_checkpoints.h"
#include "strata/comm.h"
#include "strata/config.h"
#include "strata/model.h"

namespace strata::cli {

inline constexpr int kDefaultMicroBatch = 32;    // MLP samples
inline constexpr int kDefaultGptMicroBatch = 8;  // GPT sequences

struct TrainFlags {
  std::string model = "mlp";  // `strata train` makes gpt the default
  GptFlags gpt;
  SaveSettings save;  // strata train (either model): --save, --save-every, --keep, --resume
  std::vector<CLI::Option*> mlp_options;  // --params, --depth
  CLI::Option* steps_option = nullptr;
  int mlp_steps = 0;  // --model mlp without --steps
  std::optional<double> lr;
  std::string config_path;
  std::string params = "20M";  // with the default chunk size: a few chunks, seconds per step
  int depth = 4;
  std::optional<int> stage;
  std::optional<std::string> offload_optimizer, offload_param, nvme_path, device;
  std::optional<std::string> device_budget, host_budget, chunk_size;
  std::optional<double> optimizer_ratio;  // zero_optimization.offload_optimizer.ratio
  std::optional<int64_t> micro_batch, accumulation, train_batch;
  int steps = 0;
  bool overlap = false, no_overlap = false, json = false, keep_swap = false;
  bool swap_bench = false;  // bench swap: the optimizer state swaps unless the config says
  int repeat = 1;           // bench step: whole rounds, medians reported
  bool no_probes = false;   // bench step: no lane probes, so no bound (steps and bytes only)
  std::string trace;
};

// Registers the shared flags on `cmd`; `default_steps` when --steps is not given.
void AddFlags(CLI::App* cmd, TrainFlags* f, int default_steps);
// InvalidArgument naming a flag given for the model that was not chosen.
Status CheckModelFlags(const TrainFlags& f);
// Where NVMe planes swap without --nvme-path or a path in the config: $TMPDIR/strata-swap.
std::string DefaultSwapDir();
// Where a plan may put an NVMe plane: --nvme-path when given (over the config's
// strata.swap_paths, as every flag over its key), else the config's, else the default.
void SetPlanSwapPaths(const TrainFlags& f, Config* config);
// The reference MLP --params and --depth ask for; InvalidArgument naming the flag for a
// count below the narrowest MLP of that depth.
Result<model::MlpSpec> BuildModel(const TrainFlags& f, uint64_t seed);
// The config from the file and the flags given, with where each setting came from.
Result<Config> BuildConfig(const TrainFlags& f, std::map<std::string, std::string>* origin);

// What both commands start from: the config with its batch sizes resolved over the
// world, the model, and the world itself. Refusals come before MPI starts.
struct Prepared {
  Config config;
  model::MlpSpec model;
  std::unique_ptr<Communicator> world;
};

// Throws CliError for a refusal (before MPI starts) or a failed MPI start.
Prepared Prepare(const TrainFlags& f, std::map<std::string, std::string>* origin);

}  // namespace strata::cli
