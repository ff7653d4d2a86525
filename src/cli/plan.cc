// `strata plan`: before a run, which stage and offload configurations of a model fit the
// budgets, where each byte goes, and how long each step should take (tools/planner.h).
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/gpt_flags.h"
#include "cli/plan_text.h"
#include "cli/table.h"
#include "cli/train_flags.h"
#include "strata/comm.h"
#include "strata/units.h"
#include "tools/planner.h"
#include "tools/safetensors_plan_model.h"

namespace strata::cli {

std::string RefusalSummary(std::string s) {
  if (s.rfind("engine: ", 0) == 0) s.erase(0, 8);
  const size_t needs = s.find("it needs ");
  const size_t open = needs == std::string::npos ? needs : s.find(" (", needs);
  if (open != std::string::npos) {
    int depth = 0;
    for (size_t i = open + 1; i < s.size(); ++i) {
      depth += s[i] == '(' ? 1 : s[i] == ')' ? -1 : 0;
      if (depth == 0) {
        s.erase(open, i + 1 - open);
        break;
      }
    }
  }
  // What binds, and the largest model that fits.
  size_t end = s.find(". ");
  if (end != std::string::npos) end = s.find(". ", end + 2);
  return end == std::string::npos ? s : s.substr(0, end + 1);
}

std::string ChoiceFlags(const Config& c) {
  std::string s = "--stage " + std::to_string(c.zero.stage);
  if (c.zero.stage > 0)
    s += " --offload-optimizer " + std::string(OffloadDeviceName(c.zero.offload_optimizer.device));
  if (c.zero.stage == 3)
    s += " --offload-param " + std::string(OffloadDeviceName(c.zero.offload_param.device));
  if (c.zero.offload_optimizer.ratio != 1)
    s += " --offload-optimizer-ratio " + FormatDouble("%.4g", c.zero.offload_optimizer.ratio);
  if (!c.strata.overlap_auto) s += c.strata.overlap ? " --overlap" : " --no-overlap";
  return s;
}

namespace {

struct PlanFlags {
  TrainFlags train;
  int world_size = 1;
  std::string profile, save_profile;
  bool measure = false;
  std::string model_file;  // a safetensors file whose header is the model
  CLI::Option* model_option = nullptr;
  CLI::Option* seq_option = nullptr;  // the one model flag --model-file takes
};

Result<tools::LaneRates> LoadProfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("--profile " + path + ": cannot be opened (" + std::strerror(errno) + ")");
  try {
    Result<tools::LaneRates> r = tools::RatesFromJson(nlohmann::json::parse(in));
    if (!r.ok()) return r.status().WithContext("--profile " + path);
    for (double v : {r->compute_flops_per_s, r->device_optimizer.optimizer_params_per_s,
                     r->host_optimizer.optimizer_params_per_s, r->nvme_optimizer.optimizer_params_per_s}) {
      if (v > 0) continue;
      return InvalidArgumentError(
          "--profile " + path +
          ": it has no compute rate or engine calibration (a bench step report's rates are the probes "
          "only); write a whole profile with `strata plan --save-profile FILE`");
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError("--profile " + path + ": not valid JSON: " + e.what());
  }
}

std::string RatesLine(const tools::LaneRates& r) {
  auto engine = [](const char* where, const tools::EngineRates& e) {
    return std::string(where) + " optimizer " + FormatDouble("%.0f", e.optimizer_params_per_s / 1e6) +
           " Mparams/s + " + FormatDouble("%.2f", e.other_s_per_param * 1e9) + " ns/param, overlap x" +
           FormatDouble("%.2f", e.overlap_factor) + "; ";
  };
  return "compute " + FormatDouble("%.1f", r.compute_flops_per_s / 1e9) + " GFLOP/s; " +
         engine("device", r.device_optimizer) + engine("device split", r.device_split) +
         engine("host", r.host_optimizer) + engine("host at stage 3", r.host_optimizer_stage3) +
         engine("NVMe", r.nvme_optimizer) +
         engine("NVMe with the parameters in its master", r.nvme_optimizer_master) + "Adam alone " +
         FormatDouble("%.0f", r.adam_params_per_s / 1e6) + " Mparams/s, copies " +
         FormatDouble("%.1f", r.copy_bytes_per_s / 1e9) + " GB/s, NVMe read " +
         FormatDouble("%.2f", r.nvme_read_bytes_per_s / 1e9) + " / write " +
         FormatDouble("%.2f", r.nvme_write_bytes_per_s / 1e9) + " / mixed " +
         FormatDouble("%.2f", r.nvme_mixed_bytes_per_s / 1e9) + " GB/s";
}

std::string Report(const tools::PlanRequest& r, const std::vector<tools::PlanCandidate>& all,
                   const std::string& rates_from) {
  std::string out = "plan: " + r.model.description + ", micro-batch " + std::to_string(r.micro_batch) +
                    " x " + std::to_string(r.base.gradient_accumulation_steps) + " accumulation, " +
                    std::to_string(r.world_size) + (r.world_size == 1 ? " rank" : " ranks") + ", overlap " +
                    (r.base.strata.overlap ? "on" : "off") + "\n";
  out += "rates (" + rates_from + "): " + RatesLine(r.rates) + "\n";
  if (!r.model.compute_basis.empty()) out += "compute: " + r.model.compute_basis + "\n";
  if (!r.model.activations_counted) {
    out +=
        "activations: not counted (the model has no forward code to count them from); the process "
        "column leaves them out\n";
  }
  out += "\n";
  Table t({"#", "configuration", "device", "pinned host", "process", "NVMe", "resident", "overlap", "step",
           "waits on"});
  int n = 0;
  for (const tools::PlanCandidate& c : all) {
    if (!c.fits) continue;
    const EngineLayoutInfo& l = c.layout;
    const std::string of = "/" + std::to_string(l.num_chunks);
    std::string resident = c.config.zero.offload_optimizer.device == OffloadDevice::kNvme
                               ? std::to_string(l.optimizer_resident_chunks) + of
                           : l.optimizer_device_chunks > 0
                               ? std::to_string(l.optimizer_device_chunks) + of + " on device"
                               : "-";
    // Parameter shards off the disk: "params 2/5" in pinned memory, "+ 3/5 on device".
    std::string params;
    if (l.param_resident_chunks > 0) params = std::to_string(l.param_resident_chunks) + of;
    if (l.param_device_chunks > 0) {
      params += (params.empty() ? "" : " + ") + std::to_string(l.param_device_chunks) + of + " on device";
    }
    if (!params.empty()) resident = (resident == "-" ? "" : resident + ", ") + "params " + params;
    if (l.gradient_resident_chunks > 0) {
      resident = (resident == "-" ? "" : resident + ", ") + "grads +" +
                 std::to_string(l.gradient_resident_chunks) + of;
    }
    t.AddRow({std::to_string(++n), c.name, FormatBytes(l.device_need), FormatBytes(l.host_need),
              FormatBytes(c.process.total()), FormatBytes(l.nvme_need), resident,
              c.config.strata.overlap ? "on" : "off", FormatSeconds(c.predicted_s), c.critical_lane});
  }
  out += n > 0 ? t.Render() : "no configuration fits the budgets\n";
  bool header = false;
  for (const tools::PlanCandidate& c : all) {
    if (c.fits || !c.valid) continue;
    if (!header) out += "\ndoes not fit:\n", header = true;
    out += "  " + c.name + ": " + RefusalSummary(c.refusal) + "\n";
  }
  if (n > 0) {
    const tools::PlanCandidate& best = all.front();
    out += "\nfirst choice: " + best.name + " (" + ChoiceFlags(best.config) + "), " +
           FormatSeconds(best.predicted_s) + " a step: " + tools::ChoiceReason(all) + "\n";
    for (const EngineNeedPart& p : best.layout.need_parts)
      out += "  " + p.tier + ": " + FormatBytes(p.bytes) + "  " + p.what + "\n";
    const tools::ProcessMemory& m = best.process;
    out += "  process: " + FormatBytes(m.total()) + "  the binary, libraries and MPI as loaded (" +
           FormatBytes(m.base) + "), the engine's creation scratch (" + FormatBytes(m.creation) + "), " +
           (m.data > 0 ? "the token files (" + FormatBytes(m.data) + "), " : "") + "and " +
           (!m.activations_counted ? "not the activations (not counted), not pinned\n"
            : m.activations_on_device
                ? "not the activations, which on a GPU are device memory beside its budget (" +
                      FormatBytes(m.activations) + ", an upper bound), not pinned\n"
                : "the activations (" + FormatBytes(m.activations) + ", an upper bound), not pinned\n");
    out +=
        "  (each tier's total above also holds what its budget leaves room for: spares, staging depth, "
        "resident chunks, gather buffers)\n";
  }
  return out;
}

// The model the flags describe: a safetensors header, the reference MLP, or the GPT on
// its token files (the default corpus is prepared on first use, as `strata train` does).
tools::PlanModel BuildPlanModel(const PlanFlags& p, const Config& config) {
  const TrainFlags& f = p.train;
  Result<tools::PlanModel> m = InvalidArgumentError("plan: no model");
  if (!p.model_file.empty()) {
    m = tools::SafetensorsPlanModel(p.model_file, f.gpt.seq);
    if (!m.ok()) throw CliError(m.status().WithContext("--model-file"));
  } else if (f.model == "mlp") {
    auto spec = BuildModel(f, config.seed);
    ThrowIfError(spec.status());
    m = tools::MlpPlanModel(*spec);
  } else {
    auto paths = FindOrPrepareData(f.gpt);
    ThrowIfError(paths.status());
    auto train = model::TokenFile::Open(paths->train);  // for its vocabulary
    ThrowIfError(train.status().WithContext("training data"));
    auto spec = GptSpecFromFlags(f.gpt, train->vocab(), config.seed);
    ThrowIfError(spec.status());
    m = tools::GptPlanModel(*spec, f.gpt.seq, paths->train, config.activation_checkpointing);
    auto val = model::TokenFile::Open(paths->val);
    ThrowIfError(val.status().WithContext("validation data"));
    if (m.ok()) m->data_bytes = train->token_bytes() + val->token_bytes();
  }
  ThrowIfError(m.status());
  return *m;
}

Status CheckFlags(const PlanFlags& f) {
  if (f.measure && !f.profile.empty())
    return InvalidArgumentError("--measure and --profile: give one (the rates are measured or read)");
  for (auto [flag, v] : {std::pair{"--world-size", std::optional<int64_t>(f.world_size)},
                         {"--depth", std::optional<int64_t>(f.train.depth)},
                         {"--micro-batch", f.train.micro_batch},
                         {"--gradient-accumulation-steps", f.train.accumulation}}) {
    if (v && *v < 1)
      return InvalidArgumentError(std::string(flag) + " " + std::to_string(*v) + ": must be at least 1");
  }
  if (f.model_file.empty()) return CheckModelFlags(f.train);
  if (f.model_option->count() > 0)
    return InvalidArgumentError("--model and --model-file: give one (the model is built in or read)");
  std::vector<const CLI::Option*> others(f.train.mlp_options.begin(), f.train.mlp_options.end());
  others.insert(others.end(), f.train.gpt.options.begin(), f.train.gpt.options.end());
  for (const CLI::Option* o : others) {
    if (o != f.seq_option && o->count() > 0) {
      return InvalidArgumentError(o->get_name() +
                                  " is a flag of the built-in models; the model of --model-file " +
                                  f.model_file + " comes from its header (--seq applies)");
    }
  }
  if (f.train.gpt.seq < 1)
    return InvalidArgumentError("--seq " + std::to_string(f.train.gpt.seq) + ": must be at least 1");
  return OkStatus();
}

// The run starts MPI before its engine (Prepare), and MPI's own memory is part of the
// run's resident set (about 10 MB with OpenMPI here): the plan starts it too before it
// measures the process, so that the account holds what the run will, and ends it after.
class WorldForTheAccount {
 public:
  WorldForTheAccount() {
    auto world = InitWorld(CommOptions{"plan"});
    ThrowIfError(world.status().WithContext("plan: starting MPI as the run will, to count its memory"));
    world_ = std::move(*world);
  }
  ~WorldForTheAccount() {
    world_.reset();
    Status st = FinalizeWorld();
    if (!st.ok()) std::fprintf(stderr, "strata: warning: %s\n", st.ToString().c_str());
  }
  WorldForTheAccount(const WorldForTheAccount&) = delete;
  WorldForTheAccount& operator=(const WorldForTheAccount&) = delete;

 private:
  std::unique_ptr<Communicator> world_;
};

void Run(PlanFlags& f) {
  ThrowIfError(CheckFlags(f));
  std::map<std::string, std::string> origin;
  auto config = BuildConfig(f.train, &origin);
  ThrowIfError(config.status());
  SetPlanSwapPaths(f.train, &*config);
  const bool sequences = f.train.model == "gpt" || !f.model_file.empty();
  ThrowIfError(
      ResolveBatchSizes(&*config, f.world_size, sequences ? kDefaultGptMicroBatch : kDefaultMicroBatch));
  tools::PlanRequest r;
  r.base = *config;
  r.model = BuildPlanModel(f, *config);
  r.world_size = f.world_size;
  r.micro_batch = config->train_micro_batch_size_per_gpu;
  WorldForTheAccount world;
  r.process_base = tools::MeasureProcessBase();  // before the probes' buffers
  Result<tools::LaneRates> rates = f.profile.empty() ? tools::MeasurePlanRates(r) : LoadProfile(f.profile);
  ThrowIfError(rates.status());
  r.rates = *rates;
  if (!f.save_profile.empty()) {
    std::ofstream out(f.save_profile);
    out << tools::RatesToJson(r.rates).dump(2) << "\n";
    if (!out) {
      throw CliError(IoError("--save-profile " + f.save_profile + ": cannot be written (" +
                             std::strerror(errno) + "); give a path in a writable directory"));
    }
  }
  auto all = tools::PlanConfigurations(r);
  ThrowIfError(all.status());
  if (f.train.json) {
    nlohmann::json j = {{"world_size", f.world_size},
                        {"model", r.model.description},
                        {"params", r.model.params},
                        {"micro_batch", r.micro_batch},
                        {"compute_estimated", !r.model.compute_basis.empty()},
                        {"activations_counted", r.model.activations_counted},
                        {"rates", tools::RatesToJson(r.rates)},
                        {"candidates", nlohmann::json::array()}};
    for (const tools::PlanCandidate& c : *all) j["candidates"].push_back(tools::ToJson(c));
    if (!r.model.compute_basis.empty()) j["compute_basis"] = r.model.compute_basis;
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::cout << Report(r, *all, f.profile.empty() ? "measured now" : "profile " + f.profile);
}

}  // namespace

void AddPlanCommand(CLI::App& app) {
  auto* f = new PlanFlags;
  auto* cmd = app.add_subcommand(
      "plan",
      "which ZeRO stage and offloads fit the budgets, the memory of each tier and the predicted step, "
      "fastest first");
  TrainFlags& t = f->train;
  t.model = "gpt";
  cmd->add_option("--config", t.config_path,
                  "JSON config (DeepSpeed keys); the plan varies stage and offloads");
  f->model_option = cmd->add_option("--model", t.model, "gpt (as strata train) or mlp, the reference MLP")
                        ->check(CLI::IsMember({"gpt", "mlp"}))
                        ->capture_default_str();
  cmd->add_option("--model-file", f->model_file,
                  "plan the model a safetensors file's header describes (names, shapes, dtypes; no tensor "
                  "data is read; compute estimated from flops, activations not counted)");
  t.mlp_options = {cmd->add_option("--params", t.params, "MLP parameter count")->capture_default_str(),
                   cmd->add_option("--depth", t.depth, "MLP hidden layers")->capture_default_str()};
  GptFlags& g = t.gpt;
  g.options = {
      cmd->add_option("--data", g.data_dir, "GPT token files' directory (default: the fortunes corpus)"),
      cmd->add_option("--n-layer", g.n_layer, "GPT blocks")->capture_default_str(),
      cmd->add_option("--n-head", g.n_head, "GPT attention heads")->capture_default_str(),
      cmd->add_option("--n-embd", g.n_embd, "GPT width")->capture_default_str(),
      f->seq_option = cmd->add_option("--seq", g.seq, "tokens per sequence (the GPT's, or --model-file's)")
                          ->capture_default_str(),
      cmd->add_flag("--untied", g.untied, "GPT head not tied to the token embedding")};
  cmd->add_option("--world-size", f->world_size, "ranks to plan for")->capture_default_str();
  cmd->add_option("--micro-batch", t.micro_batch,
                  "train_micro_batch_size_per_gpu (default 8 sequences for the GPT, 32 samples for the MLP)");
  cmd->add_option("--gradient-accumulation-steps", t.accumulation, "gradient_accumulation_steps");
  cmd->add_option("--nvme-path", t.nvme_path, "swap directory (default $TMPDIR/strata-swap)");
  cmd->add_option("--device-budget", t.device_budget, "strata.device_budget, e.g. 2GiB");
  cmd->add_option("--host-budget", t.host_budget, "strata.host_budget, e.g. 4GiB");
  cmd->add_option("--chunk-size", t.chunk_size, "strata.chunk_size (default 16MiB)");
  cmd->add_flag("--no-overlap", t.no_overlap, "strata.overlap false");
  cmd->add_flag("--measure", f->measure, "measure the rates on this machine (the default without --profile)");
  cmd->add_option("--profile", f->profile, "lane rates from a file written by --save-profile");
  cmd->add_option("--save-profile", f->save_profile, "write the rates used to this file");
  cmd->add_flag("--json", t.json, "print the plan as JSON");
  cmd->callback([f] { Run(*f); });
}

}  // namespace strata::cli
