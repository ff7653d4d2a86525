// MLP description, module layout, deterministic initialisation and synthetic data.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstring>
#include <set>

#include "strata/model.h"

namespace strata::model {
namespace {

MlpSpec Spec(LossKind loss = LossKind::kMse) {
  MlpSpec spec;
  spec.input_dim = 12;
  spec.hidden = {20, 8};
  spec.output_dim = 5;
  spec.loss = loss;
  spec.seed = 42;
  return spec;
}

TEST(ModelSpecTest, ModulesInExecutionOrderWithShapes) {
  const ModelDecl model = MlpModules(Spec());
  ASSERT_TRUE(ValidateModel(model).ok());
  ASSERT_EQ(model.modules.size(), 3u);
  ASSERT_EQ(model.tensors.size(), 6u);
  EXPECT_EQ(model.modules[0].name, "layer0");
  ASSERT_EQ(model.modules[0].tensors, (std::vector<TensorId>{0, 1}));
  EXPECT_EQ(model.modules[2].tensors, (std::vector<TensorId>{MlpTensorId(2, 0), MlpTensorId(2, 1)}));
  EXPECT_EQ(model.tensors[0].name, "layer0.weight");
  EXPECT_EQ(model.tensors[0].shape, (std::vector<int64_t>{20, 12}));
  EXPECT_EQ(model.tensors[1].name, "layer0.bias");
  EXPECT_EQ(model.tensors[1].shape, (std::vector<int64_t>{20}));
  EXPECT_EQ(model.tensors[2].shape, (std::vector<int64_t>{8, 20}));
  EXPECT_EQ(model.tensors[4].shape, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(MlpParameterCount(Spec()), 20 * 12 + 20 + 8 * 20 + 8 + 5 * 8 + 5);
  MlpSpec linear = Spec();
  linear.hidden.clear();
  EXPECT_EQ(MlpModules(linear).modules.size(), 1u);
}

TEST(ModelSpecTest, ValidateRejectsBadDimensions) {
  EXPECT_TRUE(ValidateSpec(Spec()).ok());
  MlpSpec bad = Spec();
  bad.hidden[1] = 0;
  EXPECT_EQ(ValidateSpec(bad).code(), StatusCode::kInvalidArgument);
  bad = Spec(LossKind::kCrossEntropy);
  bad.output_dim = 1;
  EXPECT_EQ(ValidateSpec(bad).code(), StatusCode::kInvalidArgument);
  bad = Spec();
  bad.input_dim = 0;
  EXPECT_EQ(ValidateSpec(bad).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseLossKind("ce").value(), LossKind::kCrossEntropy);
  EXPECT_EQ(ParseLossKind("mse").value(), LossKind::kMse);
  EXPECT_FALSE(ParseLossKind("hinge").ok());
}

TEST(ModelSpecTest, SpecForParamsIsCloseToTarget) {
  const MlpSpec spec = MlpSpecForParams(5e6, 4, 256, 16, LossKind::kMse, 1);
  EXPECT_TRUE(ValidateSpec(spec).ok());
  EXPECT_EQ(spec.hidden.size(), 4u);
  const double n = static_cast<double>(MlpParameterCount(spec));
  EXPECT_GT(n, 0.9 * 5e6);
  EXPECT_LT(n, 1.1 * 5e6);
}

TEST(ModelInitTest, SlicesEqualWholeAndFollowPyTorchBounds) {
  const MlpSpec spec = Spec();
  const ModelDecl model = MlpModules(spec);
  for (int m = 0; m < 3; ++m) {
    for (int t = 0; t < 2; ++t) {
      const int64_t n = model.tensors[MlpTensorId(m, t)].numel();
      std::vector<float> whole(n), pieces(n);
      InitTensorSlice(spec, m, t, 0, n, whole.data());
      // Cut into uneven slices, as ZeRO shards would.
      for (int64_t begin = 0; begin < n; begin += 7) {
        InitTensorSlice(spec, m, t, begin, std::min<int64_t>(7, n - begin), pieces.data() + begin);
      }
      EXPECT_EQ(0, std::memcmp(whole.data(), pieces.data(), n * sizeof(float)));
      const float bound = 1.0f / std::sqrt(static_cast<float>(MlpDims(spec)[m]));
      float lo = 1, hi = -1;
      std::set<float> distinct;
      for (float v : whole) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        distinct.insert(v);
      }
      EXPECT_GE(lo, -bound);
      EXPECT_LT(hi, bound);
      EXPECT_GT(distinct.size(), static_cast<size_t>(n * 9 / 10)) << "values should look random";
      if (n > 100) {
        EXPECT_LT(lo, -0.8f * bound);  // spread over the interval
        EXPECT_GT(hi, 0.8f * bound);
      }
    }
  }
  // Another seed gives other values; the same seed the same ones.
  MlpSpec other = spec;
  other.seed = 43;
  std::vector<float> a(10), b(10), c(10);
  InitTensorSlice(spec, 1, 0, 0, 10, a.data());
  InitTensorSlice(other, 1, 0, 0, 10, b.data());
  InitTensorSlice(spec, 1, 0, 0, 10, c.data());
  EXPECT_NE(0, std::memcmp(a.data(), b.data(), sizeof(float) * 10));
  EXPECT_EQ(0, std::memcmp(a.data(), c.data(), sizeof(float) * 10));
}

TEST(ModelInitTest, LargeTensorIndependentOfThreadCount) {
  const MlpSpec spec = MlpSpecForParams(2e6, 1, 1000, 10, LossKind::kMse, 7);
  const int64_t n = MlpModules(spec).tensors[0].numel();
  std::vector<float> a(n), b(n);
  {
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    InitTensorSlice(spec, 0, 0, 0, n, a.data());
  }
  InitTensorSlice(spec, 0, 0, 0, n, b.data());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), n * sizeof(float)));
}

bool SameBatch(const Batch& a, const Batch& b) {
  return a.size == b.size && a.x == b.x && a.targets == b.targets && a.labels == b.labels;
}

TEST(SyntheticDataTest, ShardedGlobalBatchEqualsSingleRankBatch) {
  for (LossKind loss : {LossKind::kMse, LossKind::kCrossEntropy}) {
    const MlpSpec spec = Spec(loss);
    const SyntheticData data(spec);
    for (int world : {2, 4}) {
      const int accum = 3;
      const int64_t micro = 5;
      for (int64_t step : {0, 3}) {
        for (int m = 0; m < accum; ++m) {
          // World 1, micro-batch world * micro: the reference's micro-batch m.
          BatchSlice ref{step, 0, 1, m, accum, world * micro};
          const Batch whole = data.Make(ref).value();
          Batch joined;
          for (int r = 0; r < world; ++r) {
            BatchSlice slice{step, r, world, m, accum, micro};
            EXPECT_EQ(slice.GlobalBatchSize(), ref.GlobalBatchSize());
            const Batch part = data.Make(slice).value();
            joined.size += part.size;
            joined.x.insert(joined.x.end(), part.x.begin(), part.x.end());
            joined.targets.insert(joined.targets.end(), part.targets.begin(), part.targets.end());
            joined.labels.insert(joined.labels.end(), part.labels.begin(), part.labels.end());
          }
          EXPECT_TRUE(SameBatch(whole, joined)) << "world " << world << " step " << step << " micro " << m;
        }
      }
    }
  }
}

TEST(SyntheticDataTest, DeterministicDistinctAndRejectsBadSlices) {
  const MlpSpec spec = Spec(LossKind::kCrossEntropy);
  const SyntheticData a(spec), b(spec);
  Batch x, y;
  a.Fill(100, 64, &x);
  b.Fill(100, 64, &y);
  EXPECT_TRUE(SameBatch(x, y));
  a.Fill(164, 64, &y);
  EXPECT_NE(x.x, y.x);
  // Labels come from a teacher: every class should occur in 512 samples with 5 classes.
  a.Fill(0, 512, &x);
  std::set<int32_t> classes(x.labels.begin(), x.labels.end());
  EXPECT_EQ(classes.size(), 5u);
  for (int32_t c : x.labels) {
    EXPECT_GE(c, 0);
    EXPECT_LT(c, 5);
  }
  EXPECT_FALSE(a.Make(BatchSlice{0, 2, 2, 0, 1, 4}).ok());  // rank >= world
  EXPECT_FALSE(a.Make(BatchSlice{0, 0, 1, 1, 1, 4}).ok());  // micro-batch index >= accumulation
  EXPECT_FALSE(a.Make(BatchSlice{0, 0, 1, 0, 1, 0}).ok());  // empty
}

TEST(SyntheticDataTest, RegressionTargetsFollowTheTeacher) {
  const MlpSpec spec = Spec(LossKind::kMse);
  DataSpec noisy;
  noisy.noise_std = 0.5f;
  const SyntheticData clean(spec), with_noise(spec, noisy);
  Batch c, n;
  clean.Fill(0, 400, &c);
  with_noise.Fill(0, 400, &n);
  EXPECT_EQ(c.x, n.x);
  double var_t = 0, var_noise = 0;
  for (size_t i = 0; i < c.targets.size(); ++i) {
    var_t += c.targets[i] * c.targets[i];
    const double d = n.targets[i] - c.targets[i];
    var_noise += d * d;
  }
  var_t /= c.targets.size();
  var_noise /= c.targets.size();
  EXPECT_GT(var_t, 0.01);  // targets carry signal
  // Noise of std 0.5 (minus the clean run's 0.01): variance about 0.24.
  EXPECT_NEAR(var_noise, 0.24, 0.04);
}

}  // namespace
}  // namespace strata::model
