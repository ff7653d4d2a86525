#include "tools/model_engine.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tools/plan_model.h"

namespace strata::tools {

Result<std::vector<uint64_t>> NodeOfEachRank(Communicator& world) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const uint64_t mine = std::hash<std::string>{}(host);
  std::vector<uint64_t> all(static_cast<size_t>(world.size()));
  STRATA_RETURN_IF_ERROR(world.AllGather(&mine, all.data(), 2, DType::kF32).Wait());  // 8 bytes a rank
  return all;
}

Result<int> NodeLocalRank(Communicator& world) {
  STRATA_ASSIGN_OR_RETURN(const std::vector<uint64_t> nodes, NodeOfEachRank(world));
  return static_cast<int>(std::count(nodes.begin(), nodes.begin() + world.rank(), nodes[world.rank()]));
}

Result<ModelEngine> CreateModelEngine(Communicator& world, const Config& config, ModelDecl model,
                                      const ParamInit& init, Timeline* timeline,
                                      uint64_t model_device_bytes) {
  ModelEngine e;
  DeviceOptions dopt;
  dopt.kind = config.strata.device;
  dopt.index = config.strata.device_index;
  // Several ranks on a node take a GPU each, as DeepSpeed's LOCAL_RANK does (on the sim
  // device the index is not used).
  // A launcher that shows each rank one GPU (CUDA_VISIBLE_DEVICES, SLURM's binding) has
  // already chosen: then the index stays.
  if (world.size() > 1) {
    STRATA_ASSIGN_OR_RETURN(const int local, NodeLocalRank(world));
    if (ProbeCuda().device_count > 1) dopt.index += local;
  }
  dopt.capacity = config.strata.device_budget;
  dopt.model_bytes = model_device_bytes;
  STRATA_ASSIGN_OR_RETURN(e.device, CreateDevice(dopt));
  EngineResources res{&world, e.device.get()};
  res.timeline = timeline;
  // On a GPU the engine reduces and gathers device buffers over NCCL (one rank needs no
  // collective there).
  if (e.device->kind() == DeviceKind::kCuda && world.size() > 1) {
    NcclOptions nopt;
    nopt.device = dopt.index;
    CommOptions copt;
    copt.name = "engine-nccl";
    copt.collective_timeout_s = config.strata.collective_timeout_s;
    STRATA_ASSIGN_OR_RETURN(e.device_comm, CreateNcclCommunicator(world, nopt, copt));
    res.device_comm = e.device_comm.get();
  }
  STRATA_ASSIGN_OR_RETURN(e.engine, Engine::Create(config, std::move(model), init, res));
  return e;
}

Result<ModelEngine> CreateMlpEngine(Communicator& world, const Config& config, const model::MlpSpec& model,
                                    int64_t micro_batch, Timeline* timeline) {
  ParamInit init = [model](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(model, id, b, n, out);
  };
  const double activations = MlpActivationBytes(model) * static_cast<double>(micro_batch);
  return CreateModelEngine(world, config, model::MlpModules(model), init, timeline,
                           static_cast<uint64_t>(activations));
}

}  // namespace strata::tools
