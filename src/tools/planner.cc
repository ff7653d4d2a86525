#include "tools/planner.h"

#include <algorithm>
#include <optional>

#include "strata/device.h"
#include "strata/units.h"
#include "tools/engine_calibration.h"
#include "tools/mirror_world.h"
#include "tools/step_traffic.h"

namespace strata::tools {
namespace {

struct Combo {
  int stage;
  OffloadDevice opt, param;
};

std::vector<Combo> Combos(bool with_nvme) {
  std::vector<Combo> out;
  const OffloadDevice none = OffloadDevice::kNone, cpu = OffloadDevice::kCpu, nvme = OffloadDevice::kNvme;
  out.push_back({0, none, none});
  for (int stage : {1, 2}) {
    for (OffloadDevice opt : {none, cpu}) out.push_back({stage, opt, none});
  }
  for (OffloadDevice opt : {none, cpu, nvme}) {
    for (OffloadDevice param : {none, cpu, nvme}) {
      if (!with_nvme && (opt == nvme || param == nvme)) continue;
      out.push_back({3, opt, param});
    }
  }
  return out;
}

std::string ComboName(const Combo& c) {
  std::string s = "stage " + std::to_string(c.stage) + ", optimizer " + std::string(OffloadDeviceName(c.opt));
  if (c.stage == 3) s += ", params " + std::string(OffloadDeviceName(c.param));
  return s;
}

// What one candidate's plan and time are, or its refusal.
struct Planning {
  const PlanRequest& r;
  Communicator& world;
  Device& device;
  bool shared_cpu;
  uint64_t process_base;
};

// One way of running a candidate (overlapped or serial): the engine's plan for it, and
// the work and time that plan implies. The two ways can place differently: speculation
// spares take room that a serial step leaves to the gather window (a stage-3 device
// optimizer then keeps more chunks between the forward and the backward).
struct Way {
  EngineLayoutInfo layout;
  LaneWork work;
  PlanTime time;
};

Result<Way> PlanWay(const Planning& g, const Config& c) {
  STRATA_ASSIGN_OR_RETURN(EngineLayoutInfo layout,
                          Engine::Plan(c, g.r.model.decl, EngineResources{&g.world, &g.device}));
  Way w{std::move(layout), {}, {}};
  w.work = PredictTraffic(c, g.r.world_size, w.layout);
  w.work.compute_s = PredictComputeSeconds(g.r.model.flops_per_sample, g.r.micro_batch,
                                           c.gradient_accumulation_steps, g.r.rates.compute_flops_per_s);
  w.time = PredictPlanTime(g.r.rates, w.work, g.shared_cpu, c.zero.offload_optimizer.device, c.zero.stage);
  return w;
}

Result<PlanCandidate> Evaluate(const Planning& g, PlanCandidate p) {
  Result<Way> first = PlanWay(g, p.config);
  if (!first.ok() && first.status().code() != StatusCode::kOutOfBudget &&
      first.status().code() != StatusCode::kInvalidArgument) {
    return first.status().WithContext("planning " + p.name);
  }
  if (!first.ok()) {
    // InvalidArgument: a key of the base config that this combination cannot honour
    // (strata.optimizer_resident without an NVMe optimizer, say), named in the text.
    p.valid = first.status().code() == StatusCode::kOutOfBudget;
    p.refusal = first.status().message();
    return p;
  }
  p.fits = true;
  Way chosen = std::move(*first);
  // The plan decides (strata.overlap "auto" included): its choice is what it timed, each
  // way on its own placement. A serial step needs no more room than an overlapped one;
  // should its plan fail all the same, the candidate stays overlapped.
  if (p.config.strata.overlap) {
    Config serial = p.config;
    serial.strata.overlap = serial.strata.overlap_auto = false;
    Result<Way> off = PlanWay(g, serial);
    if (off.ok()) {
      const double overlapped_s = chosen.time.overlapped_s, serial_s = off->time.serial_s;
      p.config.strata.overlap = overlapped_s <= serial_s;
      if (!p.config.strata.overlap) chosen = std::move(*off);
      chosen.time.overlapped_s = overlapped_s;  // each way's figure from its own placement
      chosen.time.serial_s = serial_s;
    }
  }
  p.config.strata.overlap_auto = false;
  p.layout = std::move(chosen.layout);
  p.work = chosen.work;
  p.time = std::move(chosen.time);
  p.process = EstimateProcessMemory(g.process_base, p.layout, p.config, g.r.model.activation_bytes_per_sample,
                                    g.r.micro_batch);
  p.process.activations_counted = g.r.model.activations_counted;
  p.process.data = g.r.model.data_bytes;
  p.predicted_s = p.config.strata.overlap ? p.time.overlapped_s : p.time.serial_s;
  p.critical_lane = p.config.strata.overlap ? p.time.critical : "serial";
  return p;
}

// A CPU optimizer that fits, with as many of its chunks kept on the device as the room
// its fixed device needs leave holds (offload_optimizer.ratio); nothing when none fits
// there or the base config sets the ratio itself.
Result<std::optional<PlanCandidate>> DeviceSplit(const Planning& g, const PlanCandidate& cpu) {
  if (cpu.config.zero.offload_optimizer.device != OffloadDevice::kCpu || !cpu.fits ||
      g.r.base.zero.offload_optimizer.ratio != 1) {
    return std::optional<PlanCandidate>();
  }
  const EngineLayoutInfo& l = cpu.layout;
  uint64_t fixed = 0;
  for (const EngineNeedPart& p : l.need_parts) fixed += p.tier == "device" ? p.bytes : 0;
  const uint64_t have = g.device.capacity() - g.device.allocated();
  const uint64_t per_chunk = 16ull * l.shard_elems;  // master, m, v and the gradient shard
  int k = static_cast<int>(std::min<uint64_t>(l.num_chunks, have > fixed ? (have - fixed) / per_chunk : 0));
  // The fixed needs grow with the split (device staging on a GPU): fewer until it fits.
  for (; k > 0; k /= 2) {
    PlanCandidate p;
    p.name = cpu.name + ", " + std::to_string(k) + "/" + std::to_string(l.num_chunks) + " on the device";
    p.config = cpu.config;
    p.config.strata.overlap = g.r.base.strata.overlap;
    p.config.zero.offload_optimizer.ratio = static_cast<double>(l.num_chunks - k) / l.num_chunks;
    STRATA_ASSIGN_OR_RETURN(PlanCandidate split, Evaluate(g, std::move(p)));
    if (split.fits) return std::optional<PlanCandidate>(std::move(split));
  }
  return std::optional<PlanCandidate>();
}

bool Faster(const PlanCandidate& a, const PlanCandidate& b) {
  if (a.valid != b.valid) return a.valid;
  if (a.fits != b.fits) return a.fits;
  return a.predicted_s < b.predicted_s;
}

uint64_t Reserved(const PlanCandidate& c) { return c.layout.device_need + c.layout.host_need; }

}  // namespace

Config CandidateConfig(const Config& base, int stage, OffloadDevice opt, OffloadDevice param) {
  Config c = base;
  c.strata.plan = "off";  // this is the plan
  c.zero.stage = stage;
  c.zero.offload_optimizer.device = opt;
  c.zero.offload_param.device = param;
  // An NVMe plane swaps where the base config's swap paths say (as train requires them).
  for (OffloadConfig* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
    if (o->device == OffloadDevice::kNvme && o->nvme_path.empty()) o->nvme_path = SwapPaths(base, *o);
  }
  return c;
}

Result<LaneRates> MeasurePlanRates(const PlanRequest& r) {
  if (r.world_size < 1) return InvalidArgumentError("plan: the world size must be at least 1");
  const std::vector<std::string>& paths = SwapPaths(r.base, r.base.zero.offload_optimizer);
  const int64_t adam = r.model.params / r.world_size;
  STRATA_ASSIGN_OR_RETURN(LaneRates rates, MeasureLaneRates(paths.empty() ? "" : paths.front(), adam));
  STRATA_RETURN_IF_ERROR(CalibrateEngine(r.base, r.model, r.micro_batch, &rates));
  return rates;
}

// Candidates predicted within kTieBand of the fastest are one speed to the plan: its
// error against measured steps is larger (a median of 5% on this machine, and separate
// processes of one configuration differ by up to 10%), so its first choice among them is
// the one that reserves the least memory (device + pinned host), which leaves the most to
// the rest of the machine. Measured: two 100M candidates predicted 0.7% apart ran 10%
// apart, the one holding 2.26 GiB pinned the slower.
void RankCandidates(std::vector<PlanCandidate>& all) {
  std::stable_sort(all.begin(), all.end(), Faster);
  if (all.empty() || !all.front().fits) return;
  const double limit = all.front().predicted_s * (1 + kTieBand);
  auto end = all.begin();
  while (end != all.end() && end->fits && end->predicted_s <= limit) ++end;
  std::stable_sort(all.begin(), end,
                   [](const PlanCandidate& a, const PlanCandidate& b) { return Reserved(a) < Reserved(b); });
}

Result<std::vector<PlanCandidate>> PlanConfigurations(const PlanRequest& r) {
  if (r.micro_batch < 1) return InvalidArgumentError("plan: the micro-batch must be at least 1");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> world, CreateMirrorWorld(r.world_size));
  DeviceOptions dopt;
  dopt.kind = r.base.strata.device;
  dopt.index = r.base.strata.device_index;
  dopt.capacity = r.base.strata.device_budget;
  // On a GPU the model's activations are device memory beside the engine's budget.
  dopt.model_bytes =
      static_cast<uint64_t>(r.model.activation_bytes_per_sample * static_cast<double>(r.micro_batch));
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<Device> device, CreateDevice(dopt));
  const bool shared_cpu = device->kind() != DeviceKind::kCuda;
  const bool with_nvme = !SwapPaths(r.base, r.base.zero.offload_optimizer).empty();
  const Planning g{r, *world, *device, shared_cpu, r.process_base ? r.process_base : MeasureProcessBase()};
  std::vector<PlanCandidate> out;
  for (const Combo& k : Combos(with_nvme)) {
    PlanCandidate p;
    p.name = ComboName(k);
    p.config = CandidateConfig(r.base, k.stage, k.opt, k.param);
    STRATA_ASSIGN_OR_RETURN(PlanCandidate planned, Evaluate(g, std::move(p)));
    STRATA_ASSIGN_OR_RETURN(std::optional<PlanCandidate> split, DeviceSplit(g, planned));
    out.push_back(std::move(planned));
    if (split) out.push_back(std::move(*split));
  }
  RankCandidates(out);
  return out;
}

std::string ChoiceReason(const std::vector<PlanCandidate>& ranked) {
  if (ranked.empty() || !ranked.front().fits) return "";
  const PlanCandidate& first = ranked.front();
  const PlanCandidate* fastest = &first;
  for (const PlanCandidate& c : ranked) {
    if (c.fits && c.predicted_s < fastest->predicted_s) fastest = &c;
  }
  if (fastest == &first) return "the fastest predicted";
  return "within " + FormatDouble("%.0f%%", kTieBand * 100) + " of the fastest predicted (" + fastest->name +
         ", " + FormatSeconds(fastest->predicted_s) + "), and of those the least memory reserved (" +
         FormatBytes(Reserved(first)) + " device + pinned host against " + FormatBytes(Reserved(*fastest)) +
         ")";
}

nlohmann::json ToJson(const PlanCandidate& c) {
  nlohmann::json j = {{"name", c.name},
                      {"stage", c.config.zero.stage},
                      {"offload_optimizer", OffloadDeviceName(c.config.zero.offload_optimizer.device)},
                      {"offload_param", OffloadDeviceName(c.config.zero.offload_param.device)},
                      {"offload_optimizer_ratio", c.config.zero.offload_optimizer.ratio},
                      {"valid", c.valid},
                      {"fits", c.fits}};
  if (!c.fits) {
    j["refusal"] = c.refusal;
    return j;
  }
  const EngineLayoutInfo& l = c.layout;
  nlohmann::json parts = nlohmann::json::array();
  for (const EngineNeedPart& p : l.need_parts)
    parts.push_back({{"tier", p.tier}, {"what", p.what}, {"bytes", p.bytes}});
  j["memory"] = {{"device", l.device_need},
                 {"host", l.host_need},
                 {"nvme", l.nvme_need},
                 {"fixed_parts", parts},
                 {"process",
                  {{"base", c.process.base},
                   {"creation", c.process.creation},
                   {"activations", c.process.activations_counted ? nlohmann::json(c.process.activations)
                                                                 : nlohmann::json(nullptr)},
                   {"data", c.process.data},
                   {"total", c.process.total()}}}};
  j["layout"] = {{"params", l.num_params},
                 {"chunks", l.num_chunks},
                 {"chunk_elems", l.chunk_elems},
                 {"run_chunks", l.run_chunks},
                 {"optimizer_resident_chunks", l.optimizer_resident_chunks},
                 {"optimizer_device_chunks", l.optimizer_device_chunks},
                 {"gradient_resident_chunks", l.gradient_resident_chunks},
                 {"optimizer_staging_sets", l.optimizer_staging_sets},
                 {"param_resident_chunks", l.param_resident_chunks},
                 {"param_device_chunks", l.param_device_chunks},
                 {"kept_chunks", l.kept_chunks},
                 {"gradients_on_nvme", l.gradients_on_nvme},
                 {"params_in_optimizer_state", l.params_in_optimizer_state}};
  j["work"] = {{"compute_s", c.work.compute_s},
               {"adam_params", c.work.adam_params},
               {"copy_bytes", c.work.copy_bytes},
               {"comm_bytes", c.work.comm_bytes},
               {"nvme_read_bytes", c.work.nvme_read_bytes},
               {"nvme_write_bytes", c.work.nvme_write_bytes}};
  j["time"] = ToJson(c.time);
  j["overlap"] = c.config.strata.overlap;
  j["predicted_step_s"] = c.predicted_s;
  j["critical_lane"] = c.critical_lane;
  return j;
}

}  // namespace strata::tools
