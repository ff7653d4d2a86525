#include <string>
#include <vector>

#include "strata/module_hooks.h"

namespace strata {

Status ValidateModel(const ModelDecl& model) {
  if (model.modules.empty()) return InvalidArgumentError("model: no modules declared");
  const int n = static_cast<int>(model.tensors.size());
  for (const TensorDecl& t : model.tensors) {
    if (t.numel() <= 0) return InvalidArgumentError("model: tensor \"" + t.name + "\" has no elements");
  }
  std::vector<uint8_t> used(n, 0);
  for (const ModuleDecl& m : model.modules) {
    if (m.tensors.empty()) return InvalidArgumentError("model: module \"" + m.name + "\" has no tensors");
    std::vector<uint8_t> here(n, 0);
    for (TensorId id : m.tensors) {
      if (id < 0 || id >= n) {
        return InvalidArgumentError("model: module \"" + m.name + "\" names tensor id " + std::to_string(id) +
                                    "; the model declared " + std::to_string(n) + " tensors");
      }
      if (here[id]) {
        return InvalidArgumentError("model: module \"" + m.name + "\" lists tensor \"" +
                                    model.tensors[id].name + "\" twice");
      }
      here[id] = used[id] = 1;
    }
  }
  for (int id = 0; id < n; ++id) {
    if (!used[id]) {
      return InvalidArgumentError(
          "model: tensor \"" + model.tensors[id].name +
          "\" is in no module (a parameter no module reads would never get a gradient)");
    }
  }
  return OkStatus();
}

}  // namespace strata
