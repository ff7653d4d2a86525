// The MLP driver: hook order, whole-model gradient check, determinism, 16-bit parameters,
// batch splitting, gradient accumulation, and training that lowers the loss.
#include "strata/mlp.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <cmath>
#include <cstring>
#include <string>

#include "model/reference.h"
#include "strata/mlp_cuda.h"

namespace strata::model {
namespace {

MlpSpec Spec(LossKind loss, int64_t in = 5, std::vector<int64_t> hidden = {7, 6}, int64_t out = 3) {
  MlpSpec spec;
  spec.input_dim = in;
  spec.hidden = std::move(hidden);
  spec.output_dim = out;
  spec.loss = loss;
  spec.seed = 9;
  return spec;
}

// All gradients of a DenseMlp, flattened in module / tensor order.
std::vector<float> Flat(DenseMlp& dense) {
  std::vector<float> all;
  for (int m = 0; m < dense.num_modules(); ++m) {
    for (auto& g : dense.grads(m)) all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
  return m;
}

// Records the hook calls and forwards to a DenseMlp.
class RecordingHooks : public ModuleHooks {
 public:
  explicit RecordingHooks(DenseMlp& dense) : dense_(dense) {}
  Result<ModuleParams> Fetch(int m) override {
    log += "F" + std::to_string(m);
    if (fail_at == log.size()) return UnavailableError("injected");
    return dense_.Fetch(m);
  }
  Status Release(int m) override {
    log += "f" + std::to_string(m);
    return OkStatus();
  }
  Result<ModuleBackward> BeginBackward(int m) override {
    log += "B" + std::to_string(m);
    if (fail_at == log.size()) return UnavailableError("injected");
    return dense_.BeginBackward(m);
  }
  Status EndBackward(int m) override {
    log += "b" + std::to_string(m);
    return OkStatus();
  }
  std::string log;
  size_t fail_at = 0;

 private:
  DenseMlp& dense_;
};

TEST(MlpTest, HooksRunInOrderAndFailuresStopThePass) {
  const MlpSpec spec = Spec(LossKind::kMse);
  DenseMlp dense(spec);
  Mlp mlp(spec);
  const SyntheticData data(spec);
  const Batch batch = data.Make(BatchSlice{0, 0, 1, 0, 1, 4}).value();
  RecordingHooks hooks(dense);
  ASSERT_TRUE(mlp.ForwardBackward(batch, 4, hooks).ok());
  EXPECT_EQ(hooks.log, "F0f0F1f1F2f2B2b2B1b1B0b0");
  hooks.log.clear();
  ASSERT_TRUE(mlp.Forward(batch, 4, hooks).ok());
  EXPECT_EQ(hooks.log, "F0f0F1f1F2f2");
  hooks.log.clear();
  hooks.fail_at = std::string("F0f0F1f1F2f2B2b2B1").size();
  Result<double> failed = mlp.ForwardBackward(batch, 4, hooks);
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(failed.status().message().find("layer1"), std::string::npos) << failed.status().message();
  EXPECT_EQ(hooks.log, "F0f0F1f1F2f2B2b2B1");

  Batch wrong = batch;
  wrong.x.pop_back();
  EXPECT_EQ(mlp.ForwardBackward(wrong, 4, hooks).status().code(), StatusCode::kInvalidArgument);
}

// The whole model's gradient against central differences of the double reference.
TEST(MlpTest, GradientsMatchFiniteDifferences) {
  for (LossKind loss : {LossKind::kMse, LossKind::kCrossEntropy}) {
    const MlpSpec spec = Spec(loss);
    DenseMlp dense(spec);
    Mlp mlp(spec);
    const SyntheticData data(spec);
    const Batch batch = data.Make(BatchSlice{2, 0, 1, 0, 1, 6}).value();
    const double normaliser = 6;
    const double loss_value = mlp.ForwardBackward(batch, normaliser, dense).value();
    testing::RefParams ref = testing::ToDouble(dense);
    EXPECT_NEAR(loss_value, testing::RefMlpLoss(spec, ref, batch, normaliser), 1e-5);
    double worst = 0, scale = 0;
    for (int m = 0; m < dense.num_modules(); ++m) {
      for (size_t t = 0; t < ref[m].size(); ++t) {
        for (size_t i = 0; i < ref[m][t].size(); ++i) {
          const double h = 1e-6, keep = ref[m][t][i];
          ref[m][t][i] = keep + h;
          const double lp = testing::RefMlpLoss(spec, ref, batch, normaliser);
          ref[m][t][i] = keep - h;
          const double lm = testing::RefMlpLoss(spec, ref, batch, normaliser);
          ref[m][t][i] = keep;
          const double fd = (lp - lm) / (2 * h);
          worst = std::max(worst, std::abs(fd - dense.grads(m)[t][i]));
          scale = std::max(scale, std::abs(fd));
        }
      }
    }
    // fp32 forward/backward vs the exact gradient: a few fp32 ulps of the largest entry.
    EXPECT_GT(scale, 1e-3);
    EXPECT_LT(worst, 1e-5 * scale + 1e-7) << LossKindName(loss) << " largest grad " << scale;
  }
}

TEST(MlpTest, BitIdenticalForAnyThreadCount) {
  const MlpSpec spec = Spec(LossKind::kCrossEntropy, 96, {130, 70}, 10);
  const SyntheticData data(spec);
  const Batch batch = data.Make(BatchSlice{0, 0, 1, 0, 1, 50}).value();
  tbb::global_control allow(tbb::global_control::max_allowed_parallelism, 8);
  auto run = [&](int threads, double* loss) {
    DenseMlp dense(spec);
    Mlp mlp(spec);
    tbb::task_arena arena(threads);
    arena.execute([&] { *loss = mlp.ForwardBackward(batch, 50, dense).value(); });
    return Flat(dense);
  };
  double loss1 = 0;
  const std::vector<float> one = run(1, &loss1);
  for (int threads : {2, 5}) {
    double loss = 0;
    const std::vector<float> many = run(threads, &loss);
    EXPECT_EQ(loss, loss1);
    EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float))) << threads << " threads";
  }
}

TEST(MlpTest, SixteenBitParametersCloseToFp32) {
  // The 16-bit copies are the fp32 params rounded (bf16: relative 2^-9, fp16: 2^-12); the
  // resulting gradients differ from the fp32 ones by about that relative amount, amplified
  // a little through the layers. Tolerances: bf16 3%, fp16 0.5% of the largest gradient.
  const MlpSpec spec = Spec(LossKind::kMse, 32, {48, 48}, 4);
  const SyntheticData data(spec);
  const Batch batch = data.Make(BatchSlice{0, 0, 1, 0, 1, 16}).value();
  DenseMlp ref(spec);
  Mlp mlp(spec);
  const double loss32 = mlp.ForwardBackward(batch, 16, ref).value();
  const std::vector<float> g32 = Flat(ref);
  for (DType dtype : {DType::kBf16, DType::kFp16}) {
    DenseMlp half(spec, dtype);
    const double loss16 = mlp.ForwardBackward(batch, 16, half).value();
    const double tol = dtype == DType::kBf16 ? 0.03 : 0.005;
    EXPECT_NEAR(loss16, loss32, tol * loss32) << DTypeName(dtype);
    const std::vector<float> g16 = Flat(half);
    EXPECT_LT(MaxDiff(g16, g32), tol * MaxAbs(g32)) << DTypeName(dtype);
    EXPECT_GT(MaxDiff(g16, g32), 0.0) << "the 16-bit copy should be in use";
  }
}

TEST(MlpTest, HalfBatchesWithGlobalNormaliserSumToFullBatch) {
  // Two ranks' half-batches (BatchSlice numbering) with the global normaliser: their
  // gradients add up to the full batch's. Only the order of the fp32 sums over samples
  // differs (two partial sums added vs one running sum): bound 1e-5 of the largest entry.
  for (LossKind loss : {LossKind::kMse, LossKind::kCrossEntropy}) {
    const MlpSpec spec = Spec(loss, 24, {40, 40}, 6);
    const SyntheticData data(spec);
    Mlp mlp(spec);
    DenseMlp full(spec), part(spec);
    const Batch whole = data.Make(BatchSlice{1, 0, 1, 0, 1, 32}).value();
    const double loss_full = mlp.ForwardBackward(whole, 32, full).value();
    const std::vector<float> g_full = Flat(full);
    std::vector<float> g_sum(g_full.size(), 0.0f);
    double loss_sum = 0;
    for (int rank = 0; rank < 2; ++rank) {
      const Batch half = data.Make(BatchSlice{1, rank, 2, 0, 1, 16}).value();
      loss_sum += mlp.ForwardBackward(half, 32, part).value();
      const std::vector<float> g = Flat(part);
      for (size_t i = 0; i < g.size(); ++i) g_sum[i] += g[i];
    }
    EXPECT_NEAR(loss_sum, loss_full, 1e-6 * loss_full);
    EXPECT_LT(MaxDiff(g_sum, g_full), 1e-5 * MaxAbs(g_full)) << LossKindName(loss);

    // The same through the accumulate flag (gradient accumulation over two micro-batches).
    DenseMlp acc(spec);
    for (int m = 0; m < 2; ++m) {
      acc.set_accumulate(m > 0);
      const Batch micro = data.Make(BatchSlice{1, 0, 1, m, 2, 16}).value();
      ASSERT_TRUE(mlp.ForwardBackward(micro, 32, acc).ok());
    }
    EXPECT_LT(MaxDiff(Flat(acc), g_full), 1e-5 * MaxAbs(g_full)) << LossKindName(loss);
  }
}

// Hooks whose weight gradients add to what they hold and whose bias gradients are
// overwritten (a tied weight's second use beside an untied bias).
class MixedAccumulate : public ModuleHooks {
 public:
  explicit MixedAccumulate(DenseMlp& dense) : dense_(dense) {}
  Result<ModuleParams> Fetch(int m) override { return dense_.Fetch(m); }
  Result<ModuleBackward> BeginBackward(int m) override {
    STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, dense_.BeginBackward(m));
    bw.grads.accumulate = {1, 0};
    return bw;
  }

 private:
  DenseMlp& dense_;
};

TEST(MlpTest, PerTensorAccumulateFlagsAreHonoured) {
  const MlpSpec spec = Spec(LossKind::kMse);
  Mlp mlp(spec);
  const Batch batch = SyntheticData(spec).Make(BatchSlice{0, 0, 1, 0, 1, 8}).value();
  DenseMlp fresh(spec);
  ASSERT_TRUE(mlp.ForwardBackward(batch, 8, fresh).ok());
  DenseMlp mixed(spec);
  for (int m = 0; m < mixed.num_modules(); ++m) {
    std::fill(mixed.grads(m)[0].begin(), mixed.grads(m)[0].end(), 1.0f);
    std::fill(mixed.grads(m)[1].begin(), mixed.grads(m)[1].end(), 5.0f);
  }
  MixedAccumulate hooks(mixed);
  ASSERT_TRUE(mlp.ForwardBackward(batch, 8, hooks).ok());
  for (int m = 0; m < mixed.num_modules(); ++m) {
    for (size_t i = 0; i < fresh.grads(m)[0].size(); ++i) {
      // The kernel adds each product into the old value, so the sum rounds in another order.
      ASSERT_NEAR(mixed.grads(m)[0][i], 1.0f + fresh.grads(m)[0][i], 1e-6f)
          << "weight " << m << " [" << i << "]";
    }
    EXPECT_EQ(mixed.grads(m)[1], fresh.grads(m)[1]) << "bias " << m << " is overwritten";
  }
}

TEST(MlpTest, CudaBackendWithoutDeviceFailsCleanly) {
  if (cuda::DeviceAvailable().ok()) GTEST_SKIP() << "a GPU is present; mlp_gpu_test covers the CUDA backend";
  const MlpSpec spec = Spec(LossKind::kMse);
  DenseMlp dense(spec);
  Mlp mlp(spec, Backend::kCuda);
  const Batch batch = SyntheticData(spec).Make(BatchSlice{0, 0, 1, 0, 1, 4}).value();
  const Result<double> loss = mlp.ForwardBackward(batch, 4, dense);
  EXPECT_FALSE(loss.ok());
}

TEST(MlpTest, BadLabelIsAnError) {
  const MlpSpec spec = Spec(LossKind::kCrossEntropy);
  DenseMlp dense(spec);
  Mlp mlp(spec);
  Batch batch = SyntheticData(spec).Make(BatchSlice{0, 0, 1, 0, 1, 4}).value();
  batch.labels[2] = 3;  // 3 classes
  EXPECT_EQ(mlp.ForwardBackward(batch, 4, dense).status().code(), StatusCode::kInvalidArgument);
}

double Train(LossKind loss, int steps, double* first, double* last) {
  const MlpSpec spec = Spec(loss, 16, {32, 32}, loss == LossKind::kMse ? 4 : 5);
  DataSpec ds;
  ds.teacher_hidden = 8;
  const SyntheticData data(spec, ds);
  DenseMlp dense(spec);
  Mlp mlp(spec);
  const float lr = loss == LossKind::kMse ? 0.1f : 0.5f;
  const int64_t batch_size = 32;
  double window_first = 0, window_last = 0;
  const int window = 20;
  for (int step = 0; step < steps; ++step) {
    const Batch batch = data.Make(BatchSlice{step, 0, 1, 0, 1, batch_size}).value();
    const double l = mlp.ForwardBackward(batch, static_cast<double>(batch_size), dense).value();
    if (step < window) window_first += l / window;
    if (step >= steps - window) window_last += l / window;
    dense.SgdStep(lr);
  }
  *first = window_first;
  *last = window_last;
  return window_first / window_last;
}

TEST(MlpTest, SgdLowersTheLoss) {
  // Average of the first and last 20 steps of 400, fixed seeds: the fall is the same on
  // every run; the factors below leave room for a different machine's rounding.
  double first = 0, last = 0;
  const double mse_factor = Train(LossKind::kMse, 400, &first, &last);
  EXPECT_GT(mse_factor, 4.0) << "mse loss " << first << " -> " << last;
  const double ce_factor = Train(LossKind::kCrossEntropy, 400, &first, &last);
  EXPECT_GT(ce_factor, 2.0) << "ce loss " << first << " -> " << last;
}

}  // namespace
}  // namespace strata::model
