// MLP description, module layout and deterministic parameter initialisation.
#include "strata/model.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <string>

namespace strata::model {

Status ValidateSpec(const MlpSpec& spec) {
  if (spec.input_dim < 1)
    return InvalidArgumentError("MLP: input_dim must be >= 1, got " + std::to_string(spec.input_dim));
  for (size_t i = 0; i < spec.hidden.size(); ++i) {
    if (spec.hidden[i] < 1) {
      return InvalidArgumentError("MLP: hidden width " + std::to_string(i) + " must be >= 1, got " +
                                  std::to_string(spec.hidden[i]));
    }
  }
  const int64_t min_out = spec.loss == LossKind::kCrossEntropy ? 2 : 1;
  if (spec.output_dim < min_out) {
    return InvalidArgumentError("MLP: output_dim must be >= " + std::to_string(min_out) + " for loss " +
                                std::string(LossKindName(spec.loss)) + ", got " +
                                std::to_string(spec.output_dim));
  }
  return OkStatus();
}

Result<LossKind> ParseLossKind(std::string_view name) {
  if (name == "mse" || name == "regression") return LossKind::kMse;
  if (name == "ce" || name == "cross_entropy" || name == "classification") return LossKind::kCrossEntropy;
  return InvalidArgumentError("unknown loss '" + std::string(name) + "': use mse or ce");
}

std::string_view LossKindName(LossKind kind) { return kind == LossKind::kMse ? "mse" : "ce"; }

std::vector<int64_t> MlpDims(const MlpSpec& spec) {
  std::vector<int64_t> dims{spec.input_dim};
  dims.insert(dims.end(), spec.hidden.begin(), spec.hidden.end());
  dims.push_back(spec.output_dim);
  return dims;
}

ModelDecl MlpModules(const MlpSpec& spec) {
  const std::vector<int64_t> dims = MlpDims(spec);
  ModelDecl model;
  for (size_t k = 0; k + 1 < dims.size(); ++k) {
    const std::string name = "layer" + std::to_string(k);
    const int layer = static_cast<int>(k);
    model.tensors.push_back(TensorDecl{name + ".weight", {dims[k + 1], dims[k]}, std::nullopt});
    model.tensors.push_back(TensorDecl{name + ".bias", {dims[k + 1]}, std::nullopt});
    model.modules.push_back(ModuleDecl{name, {MlpTensorId(layer, 0), MlpTensorId(layer, 1)}});
  }
  return model;
}

int64_t MlpParameterCount(const MlpSpec& spec) {
  int64_t n = 0;
  for (const TensorDecl& t : MlpModules(spec).tensors) n += t.numel();
  return n;
}

MlpSpec MlpSpecForParams(double target_params, int depth, int64_t input_dim, int64_t output_dim,
                         LossKind loss, uint64_t seed) {
  // params ~ (depth - 1) w^2 + (input + output + depth) w: solve for w.
  const double a = std::max(depth - 1, 0), b = static_cast<double>(input_dim + output_dim + depth);
  double w = a > 0 ? (-b + std::sqrt(b * b + 4 * a * target_params)) / (2 * a) : target_params / b;
  const int64_t width = std::max<int64_t>(1, (static_cast<int64_t>(w) + 63) / 64 * 64);
  MlpSpec spec;
  spec.input_dim = input_dim;
  spec.hidden.assign(std::max(depth, 0), width);
  spec.output_dim = output_dim;
  spec.loss = loss;
  spec.seed = seed;
  return spec;
}

namespace {
// SplitMix64 finaliser: a well-mixed 64-bit bijection.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

float HashUniform(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t h = Mix(Mix(Mix(seed + 0x9e3779b97f4a7c15ULL) ^ stream) + index * 0x9e3779b97f4a7c15ULL);
  // 24 random bits -> [0, 1) exactly representable, then [-1, 1).
  return static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

void InitTensorSlice(const MlpSpec& spec, int module, int tensor, int64_t begin, int64_t count, float* out) {
  const std::vector<int64_t> dims = MlpDims(spec);
  STRATA_CHECK(module >= 0 && module + 1 < static_cast<int>(dims.size()) && (tensor == 0 || tensor == 1));
  const float bound = 1.0f / std::sqrt(static_cast<float>(dims[module]));
  const uint64_t stream = static_cast<uint64_t>(module) * 2 + static_cast<uint64_t>(tensor) + 1;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, 1 << 16),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      for (int64_t i = r.begin(); i < r.end(); ++i) {
                        out[i] = bound * HashUniform(spec.seed, stream, static_cast<uint64_t>(begin + i));
                      }
                    });
}

}  // namespace strata::model
