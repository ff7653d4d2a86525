#include "tools/plan_model.h"

#include <algorithm>
#include <vector>

#include "strata/units.h"

namespace strata::tools {
namespace {

constexpr int64_t kCutParams = 48 << 20;
// The calibration runs the whole model up to these: on two cores a step of 32 GFLOP is
// about half a second, and a cut of three layers of the 100M MLP (10 GFLOP a step)
// measured its step beyond the compute 13% above the whole model's per element.
constexpr int64_t kWholeParams = 128 << 20;
constexpr double kWholeStepFlops = 32e9;

// How many of `layers` layers of `per_layer` parameters (besides `fixed`) the cut keeps:
// one to four, within kCutParams. Fewer than about four measured the optimizer at twice
// its per-parameter cost in the whole model.
int64_t CutLayers(int64_t layers, int64_t per_layer, int64_t fixed) {
  const int64_t room = std::max<int64_t>(kCutParams - fixed, 0) / std::max<int64_t>(per_layer, 1);
  return std::clamp<int64_t>(std::min(room, layers), 1, std::min<int64_t>(4, layers));
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// A model the calibration may run: its steps, parameters and flops per sample.
struct Runner {
  StepRunner run;
  int64_t params = 0;
  double flops_per_sample = 0;
};

// run_cut: the whole model where it is small enough at this micro-batch, else the cut;
// each figure its median over the steps after the first. Medians, not the fastest step:
// the step a run reports is the mean over its steps, which the fastest understates.
auto CutFrom(Runner cut, Runner whole) {
  return [cut = std::move(cut), whole = std::move(whole)](Communicator& world, const Config& config,
                                                          int64_t micro_batch, int steps) -> Result<CutRun> {
    const double mb = static_cast<double>(micro_batch);
    const Runner& r =
        whole.params <= kWholeParams && whole.flops_per_sample * mb <= kWholeStepFlops ? whole : cut;
    StepRunOptions o;
    o.steps = 1 + steps;
    o.micro_batch = micro_batch;
    STRATA_ASSIGN_OR_RETURN(StepLog log, r.run(world, config, o));
    const EngineLayoutInfo& l = log.layout;
    std::vector<double> step, compute, optimizer;
    for (size_t i = 1; i < log.timing.size(); ++i) {
      step.push_back(log.timing[i].total_s());
      compute.push_back(log.timing[i].compute_s());
      optimizer.push_back(log.results[i].optimizer_busy_s);
    }
    return CutRun{Median(step),
                  Median(compute),
                  Median(optimizer),
                  static_cast<double>(l.num_chunks) * static_cast<double>(l.chunk_elems),
                  l,
                  r.params,
                  r.flops_per_sample * mb};
  };
}

// Per layer and token: two LayerNorm outputs with their statistics, q|k|v, attention's
// scores and probabilities (2 x n_head x seq), its output, projection and residual, the
// MLP's 4x hidden before and after GELU, its projection and residual (16 n_embd + 4 +
// 2 n_head seq floats); besides the blocks, the embedding, the final LayerNorm, and the
// logits with their probabilities. With recompute, one block's worth and each block's
// input. Measured here (0.84M GPT, seq 128, no recompute): 6.2 MiB a sequence against
// 6.4 MiB counted.
}  // namespace

double GptActivationBytes(const model::GptSpec& s, int64_t seq, bool recompute) {
  const double c = static_cast<double>(s.n_embd), t = static_cast<double>(seq);
  const double layer = t * (16 * c + 4 + 2.0 * s.n_head * t);
  const double blocks = recompute ? layer + s.n_layer * t * c : s.n_layer * layer;
  // The backward's scratch: the residual stream's gradient, a temporary of its width, one
  // of the MLP's (4 n_embd) and the qkv gradient (3 n_embd).
  const double backward = 9 * t * c;
  return 4 * (blocks + backward + t * (2 * c + 2 + 2.0 * s.vocab_size));
}

// Each layer's pre-activation and output, two gradient buffers of the widest layer, the
// input and the targets, with the per-sample losses.
double MlpActivationBytes(const model::MlpSpec& s) {
  const std::vector<int64_t> dims = model::MlpDims(s);
  double outputs = 0, widest = 0;
  for (size_t k = 1; k < dims.size(); ++k) outputs += static_cast<double>(dims[k]);
  for (int64_t d : dims) widest = std::max(widest, static_cast<double>(d));
  return 4 * (2 * outputs + 2 * widest + static_cast<double>(dims.front() + 2 * dims.back()) + 2);
}

Result<PlanModel> MlpPlanModel(const model::MlpSpec& spec) {
  STRATA_RETURN_IF_ERROR(model::ValidateSpec(spec));
  model::MlpSpec cut = spec;
  const int64_t width = spec.hidden.empty() ? 1 : spec.hidden.front();
  cut.hidden.resize(std::min<size_t>(spec.hidden.size(),
                                     CutLayers(static_cast<int64_t>(spec.hidden.size()), width * width, 0)));
  PlanModel m;
  m.params = model::MlpParameterCount(spec);
  m.description = "MLP of " + FormatCount(static_cast<double>(m.params)) + " parameters (" +
                  std::to_string(spec.hidden.size()) + " hidden layers of " + std::to_string(width) + ")";
  m.decl = model::MlpModules(spec);
  m.flops_per_sample = 6.0 * static_cast<double>(m.params);
  m.activation_bytes_per_sample = MlpActivationBytes(spec);
  const int64_t cut_params = model::MlpParameterCount(cut);
  m.run_cut = CutFrom({MlpStepRunner(cut), cut_params, 6.0 * static_cast<double>(cut_params)},
                      {MlpStepRunner(spec), m.params, m.flops_per_sample});
  m.run_steps = MlpStepRunner(spec);
  return m;
}

Result<PlanModel> GptPlanModel(const model::GptSpec& spec, int64_t seq, const std::string& train_path,
                               bool recompute) {
  STRATA_RETURN_IF_ERROR(model::ValidateSpec(spec));
  Result<model::TokenFile> file = model::TokenFile::Open(train_path);
  if (!file.ok()) return file.status().WithContext("training data");
  auto train = std::make_shared<const model::TokenFile>(std::move(*file));
  if (seq < 1 || seq > spec.block_size) {
    return InvalidArgumentError("plan: the sequence length must be within 1.." +
                                std::to_string(spec.block_size));
  }
  model::GptSpec one = spec, two = spec;
  one.n_layer = 1;
  two.n_layer = 2;
  const int64_t per_layer = model::GptParameterCount(two) - model::GptParameterCount(one);
  const int64_t fixed = model::GptParameterCount(one) - per_layer;  // embeddings, final LayerNorm, head
  model::GptSpec cut = spec;
  cut.n_layer = CutLayers(spec.n_layer, per_layer, fixed);
  PlanModel m;
  m.params = model::GptParameterCount(spec);
  m.description = "GPT of " + FormatCount(static_cast<double>(m.params)) + " parameters (" +
                  std::to_string(spec.n_layer) + " layers, n_embd " + std::to_string(spec.n_embd) + ", " +
                  std::to_string(spec.n_head) + " heads, vocab " + std::to_string(spec.vocab_size) +
                  ", sequences of " + std::to_string(seq) + ")";
  m.decl = model::GptModel(spec);
  m.flops_per_sample = model::GptFlopsPerSequence(spec, seq);
  m.activation_bytes_per_sample = GptActivationBytes(spec, seq, recompute);
  m.run_cut = CutFrom({GptStepRunner(cut, seq, train, recompute), model::GptParameterCount(cut),
                       model::GptFlopsPerSequence(cut, seq)},
                      {GptStepRunner(spec, seq, train, recompute), m.params, m.flops_per_sample});
  m.run_steps = GptStepRunner(spec, seq, train, recompute);
  return m;
}

}  // namespace strata::tools
