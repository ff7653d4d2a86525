// The reference model strata trains: an MLP stack (Linear + GELU), its module layout, its
// deterministic parameter initialisation and a synthetic, deterministic dataset.
//
// Contract:
//  - An MlpSpec describes the model: input dim, hidden widths, output dim, loss, seed.
//    Layer k is Linear(d_k -> d_{k+1}) with d = [input, hidden..., output]; every layer but
//    the last is followed by GELU (tanh approximation, see mlp_kernels.h). The last layer's
//    output goes into the loss.
//  - Modules, in execution order of the forward pass, are the Linear layers: module k holds
//    "layer<k>.weight" [out, in] (row-major) and "layer<k>.bias" [out], in that order
//    (MlpModules: the ModelDecl the engine registers); the backward pass visits modules in
//    reverse order.
//  - Parameters are a pure function of (spec.seed, module, tensor, element index): any rank
//    initialises any slice of any tensor without communication, and gets the same values as
//    the single-rank reference (InitTensorSlice). Values follow PyTorch's default nn.Linear
//    init: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
//  - Data (SyntheticData): every sample is a pure function of (data seed, global sample
//    index). A step's global batch has G = world_size * accumulation_steps * micro_batch
//    samples, numbered step * G + s. Micro-batch m of rank r holds
//        s = m * (world_size * micro_batch) + r * micro_batch + j,   j in [0, micro_batch).
//    So micro-batch m of all ranks together is the contiguous range of world_size *
//    micro_batch samples, and world size N with micro-batch B sees exactly the samples (and
//    the micro-batch grouping) of world size 1 with micro-batch N * B. The loss is a mean
//    over the global batch: pass G as the normaliser to every rank's loss, and the sum of
//    all ranks' and micro-batches' gradients is the gradient of the global batch.
//  - Inputs are U(-sqrt(3), sqrt(3)) (unit variance). Targets come from a fixed random
//    "teacher" MLP (input -> teacher_hidden, tanh, -> output, evaluated in double):
//    regression: teacher output + noise_std * N(0, 1); classification: argmax of the
//    teacher's output (output dim = number of classes). The teacher depends on the data seed
//    only, so a falling loss means the model is learning the teacher.
//  - Thread-safety: all types are values; SyntheticData is immutable after construction and
//    its const methods may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/half.h"
#include "strata/module_hooks.h"
#include "strata/status.h"

namespace strata::model {

enum class LossKind { kMse, kCrossEntropy };

// Parameters handed to the kernels are of strata::DType (strata/half.h: kF32, kBf16, kFp16;
// 16-bit values as Bf16 / Fp16 bit patterns). Gradients are always fp32.

struct MlpSpec {
  int64_t input_dim = 0;
  std::vector<int64_t> hidden;  // widths of the hidden layers; may be empty (one Linear)
  int64_t output_dim = 0;       // regression outputs, or number of classes
  LossKind loss = LossKind::kMse;
  uint64_t seed = 0;  // parameter initialisation seed
};

// InvalidArgument if a dimension is < 1 (or < 2 classes for cross entropy).
Status ValidateSpec(const MlpSpec& spec);

// "mse" / "ce" (also "cross_entropy", "classification", "regression").
Result<LossKind> ParseLossKind(std::string_view name);
std::string_view LossKindName(LossKind kind);

// The model as the engine sees it: tensor 2k is "layer<k>.weight" and 2k + 1
// "layer<k>.bias"; module k is "layer<k>" with those two. Requires a valid spec.
ModelDecl MlpModules(const MlpSpec& spec);
inline TensorId MlpTensorId(int layer, int tensor) { return 2 * layer + tensor; }
int64_t MlpParameterCount(const MlpSpec& spec);
// Layer dimensions [input, hidden..., output].
std::vector<int64_t> MlpDims(const MlpSpec& spec);

// Builds a spec of `depth` hidden layers of width `width` whose parameter count is close to
// `target_params` when width is 0 (width is then chosen), for benchmarks.
MlpSpec MlpSpecForParams(double target_params, int depth, int64_t input_dim, int64_t output_dim,
                         LossKind loss, uint64_t seed);

// Writes elements [begin, begin + count) of tensor `tensor` of module `module` into `out`.
// Parallel (oneTBB) for large counts; the values do not depend on the thread count or on
// how a tensor is cut into slices.
void InitTensorSlice(const MlpSpec& spec, int module, int tensor, int64_t begin, int64_t count, float* out);
// The same by tensor id (MlpTensorId): the engine's ParamInit for an MLP.
inline void InitMlpTensor(const MlpSpec& spec, TensorId id, int64_t begin, int64_t count, float* out) {
  InitTensorSlice(spec, id / 2, id % 2, begin, count, out);
}

// A micro-batch: x [batch, input_dim]; targets [batch, output_dim] for MSE, labels [batch]
// (class indices) for cross entropy.
struct Batch {
  int64_t size = 0;
  std::vector<float> x;
  std::vector<float> targets;
  std::vector<int32_t> labels;
};

// Which part of the global batch a rank computes; see the numbering above.
struct BatchSlice {
  int64_t step = 0;
  int rank = 0;
  int world_size = 1;
  int micro_batch_index = 0;  // 0 .. accumulation_steps - 1
  int accumulation_steps = 1;
  int64_t micro_batch_size = 1;      // per rank
  int64_t GlobalBatchSize() const;   // the loss normaliser
  int64_t FirstSampleIndex() const;  // global index of the slice's first sample
};

struct DataSpec {
  uint64_t seed = 1;
  int64_t teacher_hidden = 32;
  float noise_std = 0.01f;  // regression only
};

class SyntheticData {
 public:
  // The model spec gives dimensions and loss kind; requires a valid spec.
  SyntheticData(const MlpSpec& model, DataSpec data = {});

  // Samples [first, first + count) of the infinite dataset, into `batch` (resized).
  void Fill(int64_t first, int64_t count, Batch* batch) const;
  // The slice's micro-batch; InvalidArgument for an impossible slice (rank >= world, ...).
  Result<Batch> Make(const BatchSlice& slice) const;
  Status Fill(const BatchSlice& slice, Batch* batch) const;

 private:
  MlpSpec model_;
  DataSpec data_;
  std::vector<double> w1_, b1_, w2_, b2_;  // teacher
};

// Counter-based hash -> uniform float in [-1, 1): the primitive behind init and data.
float HashUniform(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace strata::model
