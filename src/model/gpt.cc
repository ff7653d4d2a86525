// The GPT's spec, its tensors and modules as the engine sees them, and its initialisation.
#include "strata/gpt.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "strata/model.h"

namespace strata::model {

namespace {

Status AtLeast(const char* field, int64_t value, int64_t min) {
  if (value >= min) return OkStatus();
  return InvalidArgumentError(std::string("GPT: ") + field + " must be >= " + std::to_string(min) + ", got " +
                              std::to_string(value));
}

const char* const kBlockTensorNames[kGptTensorsPerBlock] = {
    "ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
    "ln2.weight", "ln2.bias", "mlp.fc.weight",   "mlp.fc.bias",   "mlp.proj.weight",  "mlp.proj.bias"};

std::vector<int64_t> BlockTensorShape(int64_t c, int i) {
  switch (static_cast<GptBlockTensor>(i)) {
    case GptBlockTensor::kQkvWeight: return {3 * c, c};
    case GptBlockTensor::kQkvBias: return {3 * c};
    case GptBlockTensor::kAttnProjWeight: return {c, c};
    case GptBlockTensor::kFcWeight: return {4 * c, c};
    case GptBlockTensor::kFcBias: return {4 * c};
    case GptBlockTensor::kMlpProjWeight: return {c, 4 * c};
    default: return {c};  // LayerNorm weights and biases, the projections' biases
  }
}

// How a tensor starts out (GPT-2's scheme).
enum class InitKind { kZero, kOne, kNormal, kResidualNormal };

InitKind KindOf(const GptSpec& spec, TensorId id) {
  if (id == kGptWte || id == kGptWpe) return InitKind::kNormal;
  const TensorId lnf = GptLnfWeightId(spec);
  if (id == lnf) return InitKind::kOne;
  if (id == lnf + 1) return InitKind::kZero;
  if (id == lnf + 2) return InitKind::kNormal;  // lm_head.weight
  switch (static_cast<GptBlockTensor>((id - 2) % kGptTensorsPerBlock)) {
    case GptBlockTensor::kLn1Weight:
    case GptBlockTensor::kLn2Weight: return InitKind::kOne;
    case GptBlockTensor::kQkvWeight:
    case GptBlockTensor::kFcWeight: return InitKind::kNormal;
    // GPT-2 scales the projections into the residual stream so that its variance does not
    // grow with depth: each block adds two of them.
    case GptBlockTensor::kAttnProjWeight:
    case GptBlockTensor::kMlpProjWeight: return InitKind::kResidualNormal;
    default: return InitKind::kZero;
  }
}

}  // namespace

Status ValidateSpec(const GptSpec& spec) {
  STRATA_RETURN_IF_ERROR(AtLeast("vocab_size", spec.vocab_size, 2));
  if (spec.vocab_size > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError("GPT: vocab_size must fit token ids of int32, got " +
                                std::to_string(spec.vocab_size));
  }
  STRATA_RETURN_IF_ERROR(AtLeast("block_size", spec.block_size, 1));
  STRATA_RETURN_IF_ERROR(AtLeast("n_layer", spec.n_layer, 1));
  STRATA_RETURN_IF_ERROR(AtLeast("n_head", spec.n_head, 1));
  STRATA_RETURN_IF_ERROR(AtLeast("n_embd", spec.n_embd, 1));
  if (spec.n_embd % spec.n_head != 0) {
    return InvalidArgumentError("GPT: n_embd (" + std::to_string(spec.n_embd) +
                                ") must be a multiple of n_head (" + std::to_string(spec.n_head) + ")");
  }
  return OkStatus();
}

ModelDecl GptModel(const GptSpec& spec) {
  STRATA_CHECK_MSG(ValidateSpec(spec).ok(), ValidateSpec(spec).message());
  const int64_t c = spec.n_embd;
  ModelDecl model;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    model.tensors.push_back(TensorDecl{std::move(name), std::move(shape), std::nullopt});
  };
  add("wte", {spec.vocab_size, c});
  add("wpe", {spec.block_size, c});
  model.modules.push_back(ModuleDecl{"embed", {kGptWte, kGptWpe}});
  for (int64_t l = 0; l < spec.n_layer; ++l) {
    const std::string prefix = "h" + std::to_string(l) + ".";
    for (int i = 0; i < kGptTensorsPerBlock; ++i) add(prefix + kBlockTensorNames[i], BlockTensorShape(c, i));
    ModuleDecl attn{prefix + "attn", {}}, mlp{prefix + "mlp", {}};
    for (int i = 0; i < kGptTensorsPerBlock / 2; ++i) {
      attn.tensors.push_back(GptBlockTensorId(l, static_cast<GptBlockTensor>(i)));
      mlp.tensors.push_back(GptBlockTensorId(l, static_cast<GptBlockTensor>(i + kGptTensorsPerBlock / 2)));
    }
    model.modules.push_back(std::move(attn));
    model.modules.push_back(std::move(mlp));
  }
  add("lnf.weight", {c});
  add("lnf.bias", {c});
  if (!spec.tied_head) add("lm_head.weight", {spec.vocab_size, c});
  model.modules.push_back(
      ModuleDecl{"head", {GptLnfWeightId(spec), GptLnfBiasId(spec), GptHeadWeightId(spec)}});
  return model;
}

int64_t GptParameterCount(const GptSpec& spec) {
  int64_t n = 0;
  for (const TensorDecl& t : GptModel(spec).tensors) n += t.numel();
  return n;
}

double GptFlopsPerSequence(const GptSpec& spec, int64_t seq) {
  return 6.0 * static_cast<double>(GptParameterCount(spec)) * static_cast<double>(seq) +
         12.0 * static_cast<double>(spec.n_layer) * static_cast<double>(seq) * static_cast<double>(seq) *
             static_cast<double>(spec.n_embd);
}

void InitGptTensor(const GptSpec& spec, TensorId tensor, int64_t begin, int64_t count, float* out) {
  const TensorId last = GptLnfWeightId(spec) + (spec.tied_head ? 1 : 2);
  STRATA_CHECK_MSG(tensor >= 0 && tensor <= last && begin >= 0 && count >= 0, "GPT: no such tensor or slice");
  const InitKind kind = KindOf(spec, tensor);
  if (kind == InitKind::kZero || kind == InitKind::kOne) {
    std::fill(out, out + count, kind == InitKind::kOne ? 1.0f : 0.0f);
    return;
  }
  const double std_dev =
      kind == InitKind::kNormal ? 0.02 : 0.02 / std::sqrt(2.0 * static_cast<double>(spec.n_layer));
  const uint64_t stream = static_cast<uint64_t>(tensor) + 1;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, count, 1 << 14), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t i = r.begin(); i < r.end(); ++i) {
          // Box-Muller over two uniforms of element i's own: u1 in (0, 1] keeps the log finite.
          const uint64_t index = 2 * static_cast<uint64_t>(begin + i);
          const double u1 = (1.0 - HashUniform(spec.seed, stream, index)) / 2.0;
          const double u2 = (1.0 + HashUniform(spec.seed, stream, index + 1)) / 2.0;
          const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
          out[i] = static_cast<float>(std_dev * z);
        }
      });
}

}  // namespace strata::model
