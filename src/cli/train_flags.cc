#include "cli/train_flags.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "cli/commands.h"
#include "strata/device.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

Result<nlohmann::json> ReadConfigFile(const std::string& path) {
  if (path.empty()) return nlohmann::json::object();
  std::ifstream in(path);
  if (!in) return NotFoundError("config file \"" + path + "\" cannot be opened");
  try {
    return nlohmann::json::parse(in, nullptr, true, true);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(path + ": not valid JSON: " + e.what());
  }
}

// Sets `key` of `obj` from `flag` when it was given; records where the value came from.
template <typename T>
void Apply(nlohmann::json& obj, const char* key, const std::string& path, const std::optional<T>& flag,
           const char* flag_name, std::map<std::string, std::string>* origin) {
  if (flag) {
    obj[key] = *flag;
    (*origin)[path] = std::string(flag_name);
  } else if (obj.is_object() && obj.contains(key) && !origin->count(path)) {
    (*origin)[path] = "the config file";
  }
}

Status CheckCounts(const TrainFlags& f) {
  for (auto [flag, v] : {std::pair{"--micro-batch", f.micro_batch},
                         {"--gradient-accumulation-steps", f.accumulation},
                         {"--train-batch-size", f.train_batch}}) {
    if (v && *v < 1) {
      return InvalidArgumentError(std::string(flag) + " " + std::to_string(*v) + ": must be at least 1");
    }
  }
  if (f.depth < 1) return InvalidArgumentError("--depth " + std::to_string(f.depth) + ": must be at least 1");
  if (f.steps < 1) return InvalidArgumentError("--steps " + std::to_string(f.steps) + ": must be at least 1");
  return OkStatus();
}

// strata.plan "auto" chooses these; a value given too would be silently replaced.
Status CheckAutoPlanKeys(const nlohmann::json& j, const TrainFlags& f) {
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json& z = j.contains("zero_optimization") ? j["zero_optimization"] : empty;
  const nlohmann::json& s = j.contains("strata") && j["strata"].is_object() ? j["strata"] : empty;
  for (auto [given, key] : {std::pair{z.contains("stage"), "zero_optimization.stage"},
                            {z.contains("offload_optimizer"), "zero_optimization.offload_optimizer"},
                            {z.contains("offload_param"), "zero_optimization.offload_param"},
                            {s.contains("overlap") || f.overlap || f.no_overlap, "strata.overlap"}}) {
    if (given) {
      return InvalidArgumentError(
          std::string(key) +
          ": strata.plan \"auto\" (--config auto) chooses it; give one or the other "
          "(the flags --stage, --offload-optimizer, --offload-optimizer-ratio, --offload-param "
          "and --overlap or --no-overlap "
          "set these keys)");
    }
  }
  return OkStatus();
}

}  // namespace

std::string DefaultSwapDir() { return (std::filesystem::temp_directory_path() / "strata-swap").string(); }

void SetPlanSwapPaths(const TrainFlags& f, Config* config) {
  if (f.nvme_path) {
    config->strata.swap_paths = {*f.nvme_path};
  } else if (config->strata.swap_paths.empty()) {
    config->strata.swap_paths = {DefaultSwapDir()};
  }
}

Result<model::MlpSpec> BuildModel(const TrainFlags& f, uint64_t seed) {
  auto params = ParseCount(f.params);
  if (!params.ok()) return params.status().WithContext("--params");
  auto spec =
      model::MlpSpecForParams(static_cast<double>(*params), f.depth, 256, 16, model::LossKind::kMse, seed);
  // The narrowest MLP at this depth (width 64): anything asked below it would be
  // silently rounded up to a different model, or down to a toy one.
  model::MlpSpec narrow = spec;
  narrow.hidden.assign(f.depth, 64);
  const int64_t least = model::MlpParameterCount(narrow);
  if (static_cast<int64_t>(*params) < least) {
    return InvalidArgumentError("--params " + f.params + ": the reference MLP with " +
                                std::to_string(f.depth) + " hidden layers has at least " +
                                FormatCount(static_cast<double>(least)) +
                                " parameters (width 64); ask for more (e.g. --params 20M) or lower --depth");
  }
  return spec;
}

void AddFlags(CLI::App* cmd, TrainFlags* f, int default_steps) {
  f->steps = default_steps;
  cmd->add_option(
      "--config", f->config_path,
      "JSON config (DeepSpeed keys + strata block); a flag given overrides its key; train: \"auto\" "
      "chooses the stage and offloads by `strata plan`");
  f->mlp_options = {
      cmd->add_option("--params", f->params, "MLP parameter count, e.g. 20M, 2e9")->capture_default_str(),
      cmd->add_option("--depth", f->depth, "MLP hidden layers")->capture_default_str()};
  cmd->add_option("--lr", f->lr, "optimizer.params.lr");
  cmd->add_option("--stage", f->stage, "zero_optimization.stage (0-3)");
  cmd->add_option("--offload-optimizer", f->offload_optimizer,
                  "zero_optimization.offload_optimizer.device: none|cpu|nvme");
  cmd->add_option(
      "--offload-optimizer-ratio", f->optimizer_ratio,
      "zero_optimization.offload_optimizer.ratio: the share (0-1) the CPU steps, the rest on the device");
  cmd->add_option("--offload-param", f->offload_param,
                  "zero_optimization.offload_param.device: none|cpu|nvme (stage 3)");
  cmd->add_option("--nvme-path", f->nvme_path,
                  "swap directory of every nvme offload (default $TMPDIR/strata-swap)");
  cmd->add_option("--device", f->device, "strata.device: sim|cuda|auto (default sim)");
  cmd->add_option("--device-budget", f->device_budget, "strata.device_budget, e.g. 2GiB");
  cmd->add_option("--host-budget", f->host_budget, "strata.host_budget, e.g. 4GiB");
  cmd->add_option("--chunk-size", f->chunk_size, "strata.chunk_size, e.g. 64MiB (default 16MiB here)");
  f->steps_option = cmd->add_option("--steps", f->steps, "steps to run")->capture_default_str();
  cmd->add_option("--micro-batch", f->micro_batch,
                  "train_micro_batch_size_per_gpu: samples per rank per micro-batch (default " +
                      std::to_string(kDefaultGptMicroBatch) + " for the GPT, " +
                      std::to_string(kDefaultMicroBatch) + " for the MLP)");
  cmd->add_option("--gradient-accumulation-steps", f->accumulation, "gradient_accumulation_steps");
  cmd->add_option("--train-batch-size", f->train_batch,
                  "train_batch_size (= micro batch x accumulation x ranks)");
  CLI::Option* on = cmd->add_flag("--overlap", f->overlap, "strata.overlap true (every step, not auto)");
  cmd->add_flag("--no-overlap", f->no_overlap, "strata.overlap false")->excludes(on);
  cmd->add_flag("--json", f->json, "print the report as JSON");
  cmd->add_option("--trace", f->trace, "write a Chrome trace (open in Perfetto)");
}

// A flag given for the model that was not chosen would silently do nothing.
Status CheckModelFlags(const TrainFlags& f) {
  const bool gpt = f.model == "gpt";
  for (const CLI::Option* o : gpt ? f.mlp_options : f.gpt.options) {
    if (o->count() > 0) {
      return InvalidArgumentError(o->get_name() + " is a flag of --model " + (gpt ? "mlp" : "gpt") +
                                  ", and this run trains --model " + f.model +
                                  "; drop it or choose the other model");
    }
  }
  return gpt ? CheckGptFlags(f.gpt) : OkStatus();
}

// The config from the file and the flags given, with where each setting came from.
Result<Config> BuildConfig(const TrainFlags& f, std::map<std::string, std::string>* origin) {
  const bool auto_plan = f.config_path == "auto";
  STRATA_ASSIGN_OR_RETURN(nlohmann::json j, ReadConfigFile(auto_plan ? "" : f.config_path));
  if (!j.is_object())
    return InvalidArgumentError(f.config_path + ": expected a JSON object at the top level");
  nlohmann::json& z = j["zero_optimization"];
  if (f.config_path.empty() && !f.stage && !f.offload_optimizer && !f.offload_param) {
    // No arguments: the configuration strata exists for (ZeRO-Infinity: stage 3 with
    // optimizer state and parameters on NVMe, here in the temp directory).
    z["stage"] = 3;
    z["offload_optimizer"]["device"] = "nvme";
    z["offload_param"]["device"] = "nvme";
    (*origin)["zero_optimization.stage"] = "default with no arguments: stage 3, everything on NVMe";
  }
  Apply(z, "stage", "zero_optimization.stage", f.stage, "--stage", origin);
  if (f.offload_optimizer) z["offload_optimizer"]["device"] = *f.offload_optimizer;
  if (f.offload_param) z["offload_param"]["device"] = *f.offload_param;
  if (z.contains("offload_optimizer") || f.optimizer_ratio) {
    Apply(z["offload_optimizer"], "ratio", "zero_optimization.offload_optimizer.ratio", f.optimizer_ratio,
          "--offload-optimizer-ratio", origin);
  }
  const std::string tmp_swap = DefaultSwapDir();
  for (const char* k : {"offload_optimizer", "offload_param"}) {
    if (!z.contains(k) || z[k].value("device", "") != "nvme") continue;
    if (f.nvme_path)
      z[k]["nvme_path"] = *f.nvme_path;
    else if (!z[k].contains("nvme_path"))
      z[k]["nvme_path"] = tmp_swap;
  }
  nlohmann::json& s = j["strata"];
  if (auto_plan) {
    s["plan"] = "auto";
    (*origin)["strata.plan"] = "--config auto";
  }
  if (s.is_object() && s.value("plan", "off") == "auto") STRATA_RETURN_IF_ERROR(CheckAutoPlanKeys(j, f));
  Apply(s, "device", "strata.device", f.device, "--device", origin);
  if (!s.contains("device")) s["device"] = "sim", (*origin)["strata.device"] = "default";
  Apply(s, "device_budget", "strata.device_budget", f.device_budget, "--device-budget", origin);
  Apply(s, "host_budget", "strata.host_budget", f.host_budget, "--host-budget", origin);
  Apply(s, "chunk_size", "strata.chunk_size", f.chunk_size, "--chunk-size", origin);
  // Several chunks even for small models, so the pipeline shows.
  if (!s.contains("chunk_size")) s["chunk_size"] = f.model == "gpt" ? "1MiB" : "16MiB";
  if (f.lr) {
    j["optimizer"]["params"]["lr"] = *f.lr;
    (*origin)["optimizer.params.lr"] = "--lr";
  } else if (j.contains("optimizer") && j["optimizer"].contains("params") &&
             j["optimizer"]["params"].contains("lr")) {
    (*origin)["optimizer.params.lr"] = "the config file";
  }
  if (f.overlap) s["overlap"] = true;
  if (f.no_overlap) s["overlap"] = false;
  if (f.swap_bench && !s.contains("optimizer_resident") && z.contains("offload_optimizer") &&
      z["offload_optimizer"].value("device", "") == "nvme") {
    s["optimizer_resident"] = 0;
    (*origin)["strata.optimizer_resident"] = "bench swap: 0 unless the config sets it (all on NVMe)";
  }
  for (const char* key : {"param_resident", "param_on_device"}) {
    if (f.swap_bench && !s.contains(key) && z.value("stage", 0) == 3 && z.contains("offload_param") &&
        z["offload_param"].value("device", "") == "nvme") {
      s[key] = 0;
      (*origin)[std::string("strata.") + key] = "bench swap: 0 unless the config sets it (all on NVMe)";
    }
  }
  if (!f.trace.empty()) s["trace_file"] = f.trace;
  Apply(j, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu", f.micro_batch, "--micro-batch",
        origin);
  Apply(j, "gradient_accumulation_steps", "gradient_accumulation_steps", f.accumulation,
        "--gradient-accumulation-steps", origin);
  Apply(j, "train_batch_size", "train_batch_size", f.train_batch, "--train-batch-size", origin);
  for (const char* k : {"device_budget", "host_budget", "nvme_budget"}) {
    const std::string key = std::string("strata.") + k;
    if (!origin->count(key)) {
      (*origin)[key] = k[0] == 'd'   ? "default: the device's capacity"
                       : k[0] == 'h' ? "default: from the memlock limit and free memory"
                                     : "default: free space on the swap paths";
    }
  }
  if (z.empty()) j.erase("zero_optimization");  // z is not used past here
  STRATA_ASSIGN_OR_RETURN(Config config, ParseConfig(j));
  // Resolved once here, so that the reports and the step model say which it is.
  if (config.strata.device == DeviceKind::kAuto) {
    config.strata.device = ProbeCuda().available ? DeviceKind::kCuda : DeviceKind::kSim;
  }
  if (config.strata.plan == "auto") SetPlanSwapPaths(f, &config);
  if (!config.gradient_accumulation_given && config.train_batch_size == 0) {
    (*origin)["gradient_accumulation_steps"] = "default";
  }
  if (config.train_micro_batch_size_per_gpu == 0) {
    (*origin)["train_micro_batch_size_per_gpu"] =
        config.train_batch_size ? "derived from train_batch_size" : "default";
  }
  return config;
}

Prepared Prepare(const TrainFlags& f, std::map<std::string, std::string>* origin) {
  ThrowIfError(CheckCounts(f));
  ThrowIfError(CheckModelFlags(f));
  auto config = BuildConfig(f, origin);
  ThrowIfError(config.status());
  model::MlpSpec mlp;
  if (f.model == "mlp" && config->activation_checkpointing) {
    throw CliError(InvalidArgumentError(
        "activation_checkpointing: the reference MLP (--model mlp, bench step) has no activation recompute; "
        "remove the block, or train the GPT, which recomputes every block in backward"));
  }
  if (f.model == "mlp") {
    auto model = BuildModel(f, config->seed);
    ThrowIfError(model.status());
    mlp = *model;
  }
  auto world = InitWorld(CommOptions{"world", config->strata.collective_timeout_s});
  ThrowIfError(world.status());
  ThrowIfError(ResolveBatchSizes(&*config, (*world)->size(),
                                 f.model == "gpt" ? kDefaultGptMicroBatch : kDefaultMicroBatch));
  return {*config, mlp, std::move(*world)};
}

}  // namespace strata::cli
