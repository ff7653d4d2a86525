#include "tools/model_engine.h"

namespace strata::tools {

Result<ModelEngine> CreateModelEngine(Communicator& world, const Config& config, ModelDecl model,
                                      const ParamInit& init, Timeline* timeline) {
  ModelEngine e;
  DeviceOptions dopt;
  dopt.kind = config.strata.device;
  dopt.index = config.strata.device_index;
  dopt.capacity = config.strata.device_budget;
  STRATA_ASSIGN_OR_RETURN(e.device, CreateDevice(dopt));
  EngineResources res{&world, e.device.get()};
  res.timeline = timeline;
  // On a GPU the engine reduces and gathers device buffers over NCCL (one rank needs no
  // collective there).
  if (e.device->kind() == DeviceKind::kCuda && world.size() > 1) {
    NcclOptions nopt;
    nopt.device = config.strata.device_index;
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
                                    Timeline* timeline) {
  ParamInit init = [model](TensorId id, int64_t b, int64_t n, float* out) {
    model::InitMlpTensor(model, id, b, n, out);
  };
  return CreateModelEngine(world, config, model::MlpModules(model), init, timeline);
}

}  // namespace strata::tools
