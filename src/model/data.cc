// Synthetic, deterministic data: inputs from a counter-based hash, targets from a teacher MLP.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <numbers>

#include "strata/model.h"

namespace strata::model {

namespace {
// Streams of HashUniform under the data seed; sample streams are offset by the sample index.
constexpr uint64_t kTeacherW1 = 1, kTeacherB1 = 2, kTeacherW2 = 3, kTeacherB2 = 4;
constexpr uint64_t kInput = 16, kNoiseA = 17, kNoiseB = 18;
}  // namespace

int64_t BatchSlice::GlobalBatchSize() const {
  return static_cast<int64_t>(world_size) * accumulation_steps * micro_batch_size;
}

int64_t BatchSlice::FirstSampleIndex() const {
  return step * GlobalBatchSize() + static_cast<int64_t>(micro_batch_index) * world_size * micro_batch_size +
         static_cast<int64_t>(rank) * micro_batch_size;
}

SyntheticData::SyntheticData(const MlpSpec& model, DataSpec data) : model_(model), data_(data) {
  STRATA_CHECK(ValidateSpec(model).ok() && data.teacher_hidden >= 1);
  const int64_t in = model.input_dim, th = data.teacher_hidden, out = model.output_dim;
  w1_.resize(in * th);
  b1_.resize(th);
  w2_.resize(th * out);
  b2_.resize(out);
  // Scaled so that pre-activations have about unit variance for unit-variance inputs.
  const double s1 = std::sqrt(3.0 / static_cast<double>(in)), s2 = std::sqrt(3.0 / static_cast<double>(th));
  for (size_t i = 0; i < w1_.size(); ++i) w1_[i] = s1 * HashUniform(data.seed, kTeacherW1, i);
  for (size_t i = 0; i < b1_.size(); ++i) b1_[i] = 0.5 * HashUniform(data.seed, kTeacherB1, i);
  for (size_t i = 0; i < w2_.size(); ++i) w2_[i] = s2 * HashUniform(data.seed, kTeacherW2, i);
  for (size_t i = 0; i < b2_.size(); ++i) b2_[i] = 0.1 * HashUniform(data.seed, kTeacherB2, i);
}

void SyntheticData::Fill(int64_t first, int64_t count, Batch* batch) const {
  const int64_t in = model_.input_dim, th = data_.teacher_hidden, out = model_.output_dim;
  const bool mse = model_.loss == LossKind::kMse;
  batch->size = count;
  batch->x.resize(count * in);
  batch->targets.resize(mse ? count * out : 0);
  batch->labels.resize(mse ? 0 : count);
  const float scale = std::sqrt(3.0f);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, count, 4), [&](const tbb::blocked_range<int64_t>& r) {
    std::vector<double> h(th), o(out);
    for (int64_t s = r.begin(); s < r.end(); ++s) {
      const uint64_t sample = static_cast<uint64_t>(first + s);
      float* x = batch->x.data() + s * in;
      for (int64_t i = 0; i < in; ++i) {
        x[i] = scale * HashUniform(data_.seed, kInput + (sample << 8), static_cast<uint64_t>(i));
      }
      for (int64_t j = 0; j < th; ++j) {
        double acc = b1_[j];
        for (int64_t i = 0; i < in; ++i) acc += w1_[j * in + i] * x[i];
        h[j] = std::tanh(acc);
      }
      for (int64_t k = 0; k < out; ++k) {
        double acc = b2_[k];
        for (int64_t j = 0; j < th; ++j) acc += w2_[k * th + j] * h[j];
        o[k] = acc;
      }
      if (mse) {
        for (int64_t k = 0; k < out; ++k) {
          // Box-Muller from two hashed uniforms in (0, 1].
          const double u1 = 0.5 * (1.0 - HashUniform(data_.seed, kNoiseA + (sample << 8), k));
          const double u2 = 0.5 * (1.0 + HashUniform(data_.seed, kNoiseB + (sample << 8), k));
          const double n = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
          batch->targets[s * out + k] = static_cast<float>(o[k] + data_.noise_std * n);
        }
      } else {
        int64_t best = 0;
        for (int64_t k = 1; k < out; ++k) {
          if (o[k] > o[best]) best = k;
        }
        batch->labels[s] = static_cast<int32_t>(best);
      }
    }
  });
}

Status SyntheticData::Fill(const BatchSlice& slice, Batch* batch) const {
  if (slice.world_size < 1 || slice.rank < 0 || slice.rank >= slice.world_size ||
      slice.accumulation_steps < 1 || slice.micro_batch_index < 0 ||
      slice.micro_batch_index >= slice.accumulation_steps || slice.micro_batch_size < 1 || slice.step < 0) {
    return InvalidArgumentError(
        "synthetic data: impossible batch slice (step " + std::to_string(slice.step) + ", rank " +
        std::to_string(slice.rank) + " of " + std::to_string(slice.world_size) + ", micro-batch " +
        std::to_string(slice.micro_batch_index) + " of " + std::to_string(slice.accumulation_steps) +
        ", size " + std::to_string(slice.micro_batch_size) + ")");
  }
  Fill(slice.FirstSampleIndex(), slice.micro_batch_size, batch);
  return OkStatus();
}

Result<Batch> SyntheticData::Make(const BatchSlice& slice) const {
  Batch batch;
  STRATA_RETURN_IF_ERROR(Fill(slice, &batch));
  return batch;
}

}  // namespace strata::model
