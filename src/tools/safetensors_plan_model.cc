#include "tools/safetensors_plan_model.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "strata/model.h"
#include "strata/units.h"
#include "zero/safetensors_header.h"

namespace strata::tools {
namespace {

// The stand-in's width stays within what a calibration of seconds can step: a narrower
// MLP times the GEMM rate of tiny products, a wider one has layers of over 16M parameters.
constexpr int64_t kMinStandInWidth = 64, kMaxStandInWidth = 4096;

std::string Prefix(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

// The declaration: one tensor per entry, modules by prefix in the order of first use.
Result<ModelDecl> DeclFromHeader(const zero::SafetensorsHeader& h) {
  ModelDecl decl;
  std::map<std::string, int> module_of;
  for (const zero::SafetensorsEntry& e : h.tensors) {
    if (zero::SafetensorsDTypeBytes(e.dtype) == 0) {
      return InvalidArgumentError(h.path + ": tensor \"" + e.name + "\" has dtype " + e.dtype +
                                  "; a plan reads F32, BF16 and F16 tensors only");
    }
    TensorDecl t{e.name, e.shape.empty() ? std::vector<int64_t>{1} : e.shape, std::nullopt};
    if (t.numel() == 0) {
      return InvalidArgumentError(h.path + ": tensor \"" + e.name + "\" has shape " +
                                  zero::ShapeText(e.shape) +
                                  ", no elements; the engine holds no empty tensor");
    }
    const std::string module = Prefix(e.name);
    auto [it, added] = module_of.emplace(module, static_cast<int>(decl.modules.size()));
    if (added) decl.modules.push_back({module, {}});
    decl.modules[it->second].tensors.push_back(static_cast<TensorId>(decl.tensors.size()));
    decl.tensors.push_back(std::move(t));
  }
  if (decl.tensors.empty())
    return InvalidArgumentError(h.path + ": the header declares no tensors; there is no model to plan");
  STRATA_RETURN_IF_ERROR(ValidateModel(decl).WithContext(h.path));
  return decl;
}

// The dimension most matrices (tensors of two or more dimensions) share, the larger on a
// tie; the largest dimension where there is no matrix.
int64_t Width(const ModelDecl& decl) {
  std::map<int64_t, int> count;
  int64_t largest = 1;
  for (const TensorDecl& t : decl.tensors) {
    for (int64_t d : t.shape) {
      largest = std::max(largest, d);
      if (t.shape.size() >= 2) ++count[d];
    }
  }
  int64_t width = largest;
  int best = 0;
  for (const auto& [d, n] : count) {
    if (n >= best) width = d, best = n;
  }
  return std::clamp(width, kMinStandInWidth, kMaxStandInWidth);
}

std::string DTypesText(const zero::SafetensorsHeader& h) {
  std::set<std::string> seen;
  for (const zero::SafetensorsEntry& e : h.tensors) seen.insert(e.dtype);
  std::string s;
  for (const std::string& d : seen) s += (s.empty() ? "" : "/") + d;
  return s;
}

}  // namespace

Result<PlanModel> SafetensorsPlanModel(const std::string& path, int64_t seq) {
  if (seq < 1) return InvalidArgumentError("plan: the sequence length must be at least 1");
  STRATA_ASSIGN_OR_RETURN(zero::SafetensorsHeader header, zero::ReadSafetensorsHeader(path));
  STRATA_ASSIGN_OR_RETURN(ModelDecl decl, DeclFromHeader(header));
  const int64_t width = Width(decl);
  model::MlpSpec stand_in;
  stand_in.input_dim = stand_in.output_dim = width;
  stand_in.hidden.assign(4, width);
  STRATA_ASSIGN_OR_RETURN(PlanModel m, MlpPlanModel(stand_in));
  int64_t params = 0;
  for (const TensorDecl& t : decl.tensors) params += t.numel();
  m.params = params;
  m.description = "safetensors " + path + ": " + FormatCount(static_cast<double>(params)) + " parameters (" +
                  std::to_string(decl.tensors.size()) + " tensors in " + std::to_string(decl.modules.size()) +
                  " modules, " + DTypesText(header) + "), sequences of " + std::to_string(seq) + " tokens";
  m.compute_basis =
      "estimated, not measured: 6 flops per parameter per token (attention's products not counted), ";
  m.compute_basis +=
      std::to_string(seq) + " tokens a sequence, at the rates' compute rate (which --measure times ";
  m.compute_basis +=
      "on a stand-in MLP of width " + std::to_string(width) + "); a header has no forward code to time";
  m.flops_per_sample = 6.0 * static_cast<double>(params) * static_cast<double>(seq);
  m.activation_bytes_per_sample = 0;
  m.activations_counted = false;
  m.decl = std::move(decl);
  // The stand-in steps one row per token: a sequence is seq of its samples.
  m.run_steps = nullptr;  // a header has no forward code: the stand-in's steps are not the model's
  m.run_cut = [inner = std::move(m.run_cut), seq](Communicator& world, const Config& config,
                                                  int64_t micro_batch, int steps) {
    return inner(world, config, micro_batch * seq, steps);
  };
  return m;
}

}  // namespace strata::tools
