// What a model declares to the engine (its parameter tensors, by id, and its modules as
// lists of tensor ids) and the hooks it calls around every use of a module. The engine
// implements ModuleHooks; a model depends on this header only, never on the engine.
//
// Declaration:
//  - A tensor's id is its index in ModelDecl::tensors. A module lists the ids of the
//    tensors its kernels read; one id may appear in several modules (a tied embedding
//    and LM head), never twice in one module. Every tensor is in some module.
//  - Modules are numbered by their index in ModelDecl::modules, in the order of the
//    forward pass (the engine assumes that order until it has recorded the real one).
//
// Calls, for each use of module m in a micro-batch (any order, any number of times):
//   forward or recompute:  Fetch(m)  -> kernels read params  -> Release(m)
//   backward:              BeginBackward(m) -> kernels read params and write or add
//                          gradients -> EndBackward(m)
//  - The pointers handed out stay valid until the matching Release / EndBackward.
//  - Gradients are fp32. ModuleGrads::accumulate[i] says whether tensor i already holds
//    gradient from an earlier use in this micro-batch: the model adds to it when set and
//    overwrites it when not. EndBackward(m) means module m's gradients are written.
//  - A hook's error stops the pass: return it (the engine names the module).
//  - Hooks are called by one thread at a time (any thread, not concurrently).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/half.h"
#include "strata/status.h"

namespace strata {

using TensorId = int;

struct TensorDecl {
  std::string name;            // "layer0.weight"
  std::vector<int64_t> shape;  // row-major
  // The compute dtype the model's kernels read. Unset: the engine's (fp32, or bf16/fp16
  // from the config); a different one is refused at Create (one dtype per engine).
  std::optional<DType> dtype;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return shape.empty() ? 0 : n;
  }
};

struct ModuleDecl {
  std::string name;               // "layer0"
  std::vector<TensorId> tensors;  // the order in which hooks hand out pointers
};

struct ModelDecl {
  std::vector<TensorDecl> tensors;
  std::vector<ModuleDecl> modules;  // in forward execution order
};

// InvalidArgument naming the first fault: no modules, a module without tensors, an id out
// of range or repeated in a module, a tensor in no module, a tensor without elements.
Status ValidateModel(const ModelDecl& model);

struct ModuleParams {
  DType dtype = DType::kF32;
  std::vector<const void*> tensors;  // in ModuleDecl::tensors order
};

struct ModuleGrads {
  std::vector<float*> tensors;      // in ModuleDecl::tensors order
  std::vector<uint8_t> accumulate;  // per tensor: add to the gradient (1) or overwrite it (0)
};

struct ModuleBackward {
  ModuleParams params;
  ModuleGrads grads;
};

// Where the hooks' pointers live and where the model must run its kernels: host memory
// and the CPU kernels, or CUDA device memory and the CUDA kernels (Engine::model_backend).
enum class Backend { kCpu, kCuda };

class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual Result<ModuleParams> Fetch(int module) = 0;
  virtual Status Release(int /*module*/) { return OkStatus(); }
  virtual Result<ModuleBackward> BeginBackward(int module) = 0;
  virtual Status EndBackward(int /*module*/) { return OkStatus(); }
};

}  // namespace strata
