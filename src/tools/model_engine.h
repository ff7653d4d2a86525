// An engine over a model's declaration with what it borrows (the device and, on a GPU
// with several ranks, an NCCL communicator), shared by `strata train` and `strata bench
// step`.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "strata/comm.h"
#include "strata/config.h"
#include "strata/device.h"
#include "strata/engine.h"
#include "strata/model.h"

namespace strata::tools {

// Members in destruction order: the engine goes first, then what it borrowed.
struct ModelEngine {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> device_comm;  // cuda with world size > 1 only
  std::unique_ptr<Engine> engine;
};

// Every rank's node, as a hash of its host name (equal for ranks on one node), by rank.
// Collective over `world`.
Result<std::vector<uint64_t>> NodeOfEachRank(Communicator& world);

// This rank's place among the ranks on its node: 0 .. ranks on the node - 1, in rank
// order. Collective over `world`.
Result<int> NodeLocalRank(Communicator& world);

// Creates the device the config names (on a GPU, strata.device_index plus the rank's
// NodeLocalRank where the process sees several GPUs), then the engine over `world` for `model`,
// initialised by `init`. `model_device_bytes`: what the model's driver allocates on a GPU
// itself (its activations at the micro-batch), which the device budget leaves room for
// (DeviceOptions::model_bytes). Collective over `world`. `timeline` may be null. Errors:
// those of CreateDevice, CreateNcclCommunicator and Engine::Create.
Result<ModelEngine> CreateModelEngine(Communicator& world, const Config& config, ModelDecl model,
                                      const ParamInit& init, Timeline* timeline,
                                      uint64_t model_device_bytes = 0);

// The reference MLP's engine (model::MlpModules, initialised by model::InitMlpTensor),
// with its activations at `micro_batch` (the rows it will run) beside the device budget.
Result<ModelEngine> CreateMlpEngine(Communicator& world, const Config& config, const model::MlpSpec& model,
                                    int64_t micro_batch, Timeline* timeline);

}  // namespace strata::tools
