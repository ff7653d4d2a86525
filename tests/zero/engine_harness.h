// Shared by the engine tests: a small MLP, configurations for every stage and offload
// combination, and a runner that trains with the engine on the sim device.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "zero/trainer.h"

namespace strata::testing {

struct Combo {
  int stage;
  const char* opt;             // offload_optimizer.device
  const char* param;           // offload_param.device
  const char* grads = "auto";  // strata.gradients (nvme optimizer only)
  // zero_optimization.sub_group_size (0: the default). Small values make the NVMe
  // optimizer step each chunk in several pieces, as large chunks are in real runs.
  int sub_group = 0;
  // strata.optimizer_resident (nvme optimizer only): the fraction of chunks kept in
  // memory; -1 for "auto". 0 by default, so that the NVMe path is what these runs test.
  double resident = 0;
  // offload_optimizer.ratio (cpu optimizer only): the share the CPU steps; the rest of
  // the chunks keep their optimizer state on the device.
  double ratio = 1;
  // strata.param_resident (stage 3, parameters on NVMe): the fraction of chunks whose
  // 16-bit shard stays in memory; -1 for "auto". 0 by default, as `resident`.
  double param_resident = 0;
  // strata.param_on_device (stage 3, parameters on NVMe): the fraction of chunks whose
  // 16-bit shard stays in device memory; -1 for "auto". 0 by default, as `resident`.
  double param_on_device = 0;
  // strata.gradient_resident (nvme optimizer only): the fraction of chunks whose gradient
  // shard stays in pinned memory (the resident ones' included); -1 leaves it "auto".
  double grad_resident = -1;
};

// A sub_group_size that cuts SmallSpec's chunk shards into pieces of 1024 elements, several
// per chunk at world sizes 1, 2 and 4: with fp32 compute and both on NVMe the gathers then
// read the parameter shard from the pieces' masters (EngineLayoutInfo::params_in_optimizer_state).
inline constexpr int kPiecedSubGroup = 1024;
// Pieces of at most 1000 elements: too small to start on a 4 KiB boundary of the shard, so
// the parameter shard keeps a swap of its own.
inline constexpr int kSmallPieceSubGroup = 1000;

// Half the NVMe optimizer's chunks kept in pinned memory, the rest on disk, with each
// parameter tier and gradient path, whole and pieced (with fp32 compute and both on
// NVMe the resident chunks' gathers copy their master from memory).
inline std::vector<Combo> PartialResidencyCombos() {
  return {{3, "nvme", "nvme", "auto", 0, 0.5},
          {3, "nvme", "none", "nvme", 0, 0.5},
          {3, "nvme", "cpu", "host", 0, 0.5},
          {3, "nvme", "nvme", "nvme", kPiecedSubGroup, 0.5},
          {3, "nvme", "nvme", "host", kPiecedSubGroup, 0.5},
          // Gradient shards kept beyond the resident chunks, the rest on the NVMe path.
          {3, "nvme", "nvme", "nvme", 0, 0.25, 1, 0, 0, 0.5},
          {3, "nvme", "none", "auto", kPiecedSubGroup, 0, 1, 0, 0, 0.5}};
}

// A CPU optimizer with part of its chunks on the device (offload_optimizer.ratio), at
// every stage and parameter tier that takes a CPU optimizer.
inline std::vector<Combo> DeviceSplitCombos() {
  return {{1, "cpu", "none", "auto", 0, 0, 0.5},
          {2, "cpu", "none", "auto", 0, 0, 0.5},
          {3, "cpu", "none", "auto", 0, 0, 0.5},
          {3, "cpu", "cpu", "auto", 0, 0, 0.25},
          {3, "cpu", "nvme", "auto", 0, 0, 0.5}};
}

// Half the NVMe parameter shards kept in pinned memory, with each optimizer tier: on the
// device, on the CPU (with and without the device split), and on NVMe with the shard
// published behind the step (pieces too small to read it from the master) and partly
// resident optimizer state.
inline std::vector<Combo> ParamResidencyCombos() {
  return {{3, "none", "nvme", "auto", 0, 0, 1, 0.5},
          {3, "cpu", "nvme", "auto", 0, 0, 1, 0.5},
          {3, "cpu", "nvme", "auto", 0, 0, 0.5, 0.5},
          {3, "nvme", "nvme", "host", kSmallPieceSubGroup, 0, 1, 0.5},
          {3, "nvme", "nvme", "auto", kSmallPieceSubGroup, 0.5, 1, 0.5}};
}

// Half the NVMe parameter shards kept in device memory, with the optimizer on the CPU
// (its publish through host staging) and on NVMe (its write-behind path), and all three
// tiers at once: a quarter of the shards pinned in host memory, a quarter on the device,
// the rest on NVMe beside partly resident optimizer state.
inline std::vector<Combo> ParamDeviceCombos() {
  return {{3, "cpu", "nvme", "auto", 0, 0, 1, 0, 0.5},
          {3, "nvme", "nvme", "host", kSmallPieceSubGroup, 0, 1, 0, 0.5},
          {3, "nvme", "nvme", "auto", kSmallPieceSubGroup, 0.5, 1, 0.25, 0.25}};
}

// Every combination DeepSpeed allows: offload needs stage >= 1, NVMe optimizer offload
// and parameter offload need stage 3.
inline std::vector<Combo> AllCombos() {
  std::vector<Combo> c = {
      {0, "none", "none"}, {1, "none", "none"}, {1, "cpu", "none"}, {2, "none", "none"}, {2, "cpu", "none"}};
  for (const char* o : {"none", "cpu", "nvme"}) {
    for (const char* p : {"none", "cpu", "nvme"}) c.push_back({3, o, p});
  }
  // "auto" puts the gradients of an overlapped, unclipped run on NVMe; both paths are
  // forced here so that each is checked in every setting.
  for (const char* p : {"none", "cpu", "nvme"}) c.push_back({3, "nvme", p, "nvme"});
  for (const char* p : {"none", "cpu", "nvme"}) c.push_back({3, "nvme", p, "host"});
  // Chunks stepped in pieces (the last one shorter), with each gradient path.
  for (const char* g : {"auto", "nvme", "host"}) c.push_back({3, "nvme", "nvme", g, kPiecedSubGroup});
  c.push_back({3, "nvme", "cpu", "auto", kPiecedSubGroup});
  c.push_back({3, "nvme", "nvme", "auto", kSmallPieceSubGroup});
  for (const Combo& r : PartialResidencyCombos()) c.push_back(r);
  for (const Combo& r : DeviceSplitCombos()) c.push_back(r);
  for (const Combo& r : ParamResidencyCombos()) c.push_back(r);
  return c;
}

// AllCombos but the parameter-residency ones, for the multi-rank model tests: their call
// orders are what those tests vary, and resident shards at 2 and 4 ranks are in
// engine_mpi_test (the time they would add is CI's to spend elsewhere).
inline std::vector<Combo> CombosWithoutParamResidency() {
  std::vector<Combo> c;
  for (const Combo& k : AllCombos()) {
    if (k.param_resident == 0) c.push_back(k);
  }
  return c;
}

inline std::string ComboName(const Combo& c) {
  return "stage" + std::to_string(c.stage) + "/opt=" + c.opt + "/param=" + c.param +
         (std::string(c.grads) == "auto" ? "" : std::string("/grads=") + c.grads) +
         (c.sub_group ? "/sub_group=" + std::to_string(c.sub_group) : "") +
         (c.resident != 0 ? "/resident=" + (c.resident < 0 ? std::string("auto") : std::to_string(c.resident))
                          : "") +
         (c.ratio != 1 ? "/ratio=" + std::to_string(c.ratio) : "") +
         (c.param_resident != 0
              ? "/param_resident=" +
                    (c.param_resident < 0 ? std::string("auto") : std::to_string(c.param_resident))
              : "") +
         (c.param_on_device != 0
              ? "/param_on_device=" +
                    (c.param_on_device < 0 ? std::string("auto") : std::to_string(c.param_on_device))
              : "") +
         (c.grad_resident >= 0 ? "/grad_resident=" + std::to_string(c.grad_resident) : "");
}

// A swap directory private to this run. Every rank must name the same one (the config
// is checked for equality across ranks; files are named per rank): under mpirun the
// ranks share their parent process (the launcher's daemon), alone a process uses its own.
inline std::string SwapDir() {
  const bool under_mpirun = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  const long id = under_mpirun ? static_cast<long>(getppid()) : static_cast<long>(getpid());
  auto dir = std::filesystem::temp_directory_path() / ("strata-engine-test-" + std::to_string(id));
  std::filesystem::create_directories(dir);
  // The swap files go with their stores; the folder goes at exit (after every rank's
  // tests: mpi_test_main combines the results before returning).
  struct RemoveAtExit {
    std::filesystem::path dir;
    ~RemoveAtExit() {
      std::error_code ec;  // another rank may have removed it first
      std::filesystem::remove_all(dir, ec);
    }
  };
  static RemoveAtExit remove_at_exit{dir};
  return dir.string();
}

inline Config MakeConfig(const Combo& c, const std::string& extra_json = "") {
  const std::string swap = SwapDir();
  nlohmann::json j = {{"zero_optimization", {{"stage", c.stage}}},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}}},
                      {"strata", {{"device", "sim"}, {"chunk_size", "16KiB"}}}};
  if (std::string(c.opt) != "none") {
    j["zero_optimization"]["offload_optimizer"] = {{"device", c.opt}, {"nvme_path", swap}};
  }
  if (std::string(c.param) != "none") {
    j["zero_optimization"]["offload_param"] = {{"device", c.param}, {"nvme_path", swap}};
  }
  if (std::string(c.grads) != "auto") j["strata"]["gradients"] = c.grads;
  if (c.sub_group) j["zero_optimization"]["sub_group_size"] = c.sub_group;
  if (c.ratio != 1) j["zero_optimization"]["offload_optimizer"]["ratio"] = c.ratio;
  if (std::string(c.opt) == "nvme") {
    j["strata"]["optimizer_resident"] = c.resident < 0 ? nlohmann::json("auto") : nlohmann::json(c.resident);
    if (c.grad_resident >= 0) j["strata"]["gradient_resident"] = c.grad_resident;
  }
  if (c.stage == 3 && std::string(c.param) == "nvme") {
    j["strata"]["param_resident"] =
        c.param_resident < 0 ? nlohmann::json("auto") : nlohmann::json(c.param_resident);
    j["strata"]["param_on_device"] =
        c.param_on_device < 0 ? nlohmann::json("auto") : nlohmann::json(c.param_on_device);
  }
  if (!extra_json.empty()) j.merge_patch(nlohmann::json::parse(extra_json));
  auto cfg = ParseConfig(j);
  EXPECT_TRUE(cfg.ok()) << cfg.status().ToString() << "\n" << j.dump();
  return cfg.ok() ? *cfg : Config{};
}

inline zero::TrainSpec SmallSpec(int steps = 20) {
  zero::TrainSpec spec;
  spec.model.input_dim = 64;
  spec.model.hidden = {96, 80, 64};
  spec.model.output_dim = 10;
  spec.model.loss = model::LossKind::kMse;
  spec.model.seed = 7;
  spec.data.seed = 11;
  spec.steps = steps;
  spec.micro_batch = 8;
  return spec;
}

struct EngineRun {
  zero::TrainLog log;
  std::vector<std::vector<std::vector<float>>> params;  // [module][tensor]
  uint64_t device_high_water = 0, device_capacity = 0;
  uint64_t host_need = 0;
  int kept_chunks = 0, carried_chunks = 0, num_chunks = 0;  // from layout_info()
  int resident_chunks = 0;                                  // optimizer_resident_chunks
  int device_chunks = 0;                                    // optimizer_device_chunks
  int param_resident_chunks = 0;                            // param_resident_chunks
  int param_device_chunks = 0;                              // param_device_chunks
  int grad_resident_chunks = 0;                             // gradient_resident_chunks
  Status status;
};

// The engine's device for a run: `kind`, of device_capacity bytes when not 0 (else
// strata.device_budget).
inline Result<std::unique_ptr<Device>> EngineDevice(const Config& config, DeviceKind kind = DeviceKind::kSim,
                                                    uint64_t device_capacity = 0) {
  DeviceOptions dopt;
  dopt.kind = kind;
  dopt.capacity = device_capacity ? device_capacity : config.strata.device_budget;
  return CreateDevice(dopt);
}

// The reference MLP's initial values (spec must outlive the returned function).
inline ParamInit MlpInit(const zero::TrainSpec& spec) {
  return [&spec](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(spec.model, id, b, n, out);
  };
}

// kind: the engine's device (cuda: engine_cuda_gpu_test, one rank, no device communicator).
// device_capacity: the sim device's size when not 0 (else strata.device_budget).
inline EngineRun RunEngine(Communicator& world, const Config& config, const zero::TrainSpec& spec,
                           DeviceKind kind = DeviceKind::kSim, uint64_t device_capacity = 0) {
  EngineRun run;
  auto dev = EngineDevice(config, kind, device_capacity);
  if (!dev.ok()) {
    run.status = dev.status();
    return run;
  }
  auto modules = model::MlpModules(spec.model);
  ParamInit init = MlpInit(spec);
  auto engine = Engine::Create(config, modules, init, EngineResources{&world, dev->get()});
  if (!engine.ok()) {
    run.status = engine.status();
    return run;
  }
  auto log = zero::TrainWithEngine(**engine, world, config, spec);
  if (!log.ok()) {
    run.status = log.status();
    return run;
  }
  run.log = *log;
  for (size_t m = 0; m < modules.modules.size(); ++m) {
    run.params.emplace_back();
    for (size_t t = 0; t < modules.modules[m].tensors.size(); ++t) {
      std::vector<float> p;
      run.status = (*engine)->GatherMaster(modules.modules[m].tensors[t], &p);
      if (!run.status.ok()) return run;
      run.params.back().push_back(std::move(p));
    }
  }
  run.device_high_water = (*dev)->high_water();
  run.device_capacity = (*dev)->capacity();
  run.host_need = (*engine)->layout_info().host_need;
  run.kept_chunks = (*engine)->layout_info().kept_chunks;
  run.num_chunks = (*engine)->layout_info().num_chunks;
  run.resident_chunks = (*engine)->layout_info().optimizer_resident_chunks;
  run.device_chunks = (*engine)->layout_info().optimizer_device_chunks;
  run.param_resident_chunks = (*engine)->layout_info().param_resident_chunks;
  run.param_device_chunks = (*engine)->layout_info().param_device_chunks;
  run.grad_resident_chunks = (*engine)->layout_info().gradient_resident_chunks;
  run.carried_chunks = (*engine)->layout_info().carried_chunks;
  return run;
}

// Largest |a - b| / (atol + rtol |b|) over every parameter; <= 1 means within tolerance.
inline double ParamError(const EngineRun& run, const zero::ReferenceRun& ref, double atol, double rtol) {
  double worst = 0;
  for (size_t m = 0; m < ref.params.size(); ++m) {
    for (size_t t = 0; t < ref.params[m].size(); ++t) {
      const auto& a = run.params[m][t];
      const auto& b = ref.params[m][t];
      if (a.size() != b.size()) return INFINITY;
      for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::fabs(double(a[i]) - b[i]) / (atol + rtol * std::fabs(double(b[i]))));
      }
    }
  }
  return worst;
}

// Mean loss of the first and of the last four steps: the batches are small and
// noisy, so single steps say little.
inline bool LossWentDown(const std::vector<double>& losses) {
  if (losses.size() < 8) return false;
  double first = 0, last = 0;
  for (size_t i = 0; i < 4; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  return last < 0.8 * first;
}

inline bool BitIdentical(const EngineRun& a, const EngineRun& b) {
  return a.params == b.params && a.log.losses == b.log.losses;
}

}  // namespace strata::testing
