// The engine for the reference MLP with what it borrows (device and, on a GPU with
// several ranks, an NCCL communicator), shared by `strata train` and `strata bench step`.
#pragma once

#include <memory>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/model.h"

namespace strata::tools {

// Members in destruction order: the engine goes first, then what it borrowed.
struct MlpEngine {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> device_comm;  // cuda with world size > 1 only
  std::unique_ptr<Engine> engine;
};

// Creates the device the config names, then the engine over `world` for `model`'s
// modules, initialised by model::InitTensorSlice. Collective over `world`. `timeline`
// may be null. Errors: those of CreateDevice, CreateNcclCommunicator and Engine::Create.
Result<MlpEngine> CreateMlpEngine(Communicator& world, const Config& config, const model::MlpSpec& model,
                                  Timeline* timeline);

}  // namespace strata::tools
