// The CUDA kernels against the CPU kernels (skipped where there is no GPU).
//
// The matrix products run on cuBLAS in one of two precisions (model/cuda/matmul.h):
//  - fp32 (no tensor cores): both sides accumulate fp32 in different orders, so they
//    differ by fp32 rounding: within 1e-5 of the largest |cpu| entry.
//  - tensor cores: the inputs are rounded (TF32 for fp32 weights, the activations to the
//    weights' 16-bit type), so each element is held to the classic GEMM error bound
//        |gpu - cpu| <= (2u + u^2 + (k + 2) 2^-23) * (sum_p |a_ip| |b_pj| + |c_old| + |bias|)
//    with u the input rounding's relative error (TF32 2^-10 allowing truncation, bf16
//    2^-8, fp16 2^-11), k the reduced length, plus k 2^-24 absolute for fp16's
//    subnormals (inputs here are within [-1, 1]). It holds for every input, so the test
//    cannot flake; a wrong operand, transpose or stride breaks it by orders of magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "model/gpu_compare.h"
#include "strata/half.h"
#include "strata/mlp.h"
#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"
#if STRATA_HAVE_CUDA
#include "model/cuda/matmul.h"
#endif

namespace strata::model {
namespace {

// Sets the precision of the products enqueued from now on (a no-op without CUDA, where
// every test skips).
void UseTensorCores(bool tensor) {
#if STRATA_HAVE_CUDA
  cuda::SetMatmulPrecision(tensor ? cuda::MatmulPrecision::kTensorCores : cuda::MatmulPrecision::kFp32);
#else
  (void)tensor;
#endif
}

class MlpGpuTest : public testing::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    UseTensorCores(false);  // the tests that compare at fp32 tolerances; others switch
  }
  float* Zeros(size_t n) { return Upload(std::vector<float>(n, 0.0f)); }
};

std::vector<float> Random(int64_t n, uint64_t stream, float scale = 1.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * HashUniform(99, stream, i);
  return v;
}

// |gpu - cpu| within `tol` of the largest |cpu| entry: both accumulate in fp32 in
// ascending order, the GPU without the CPU's blocking, so they differ by rounding only.
void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol, const char* what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  double scale = 1e-30, err = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(cpu[i])));
    err = std::max(err, static_cast<double>(std::abs(gpu[i] - cpu[i])));
  }
  EXPECT_LE(err, tol * scale) << what;
}

// Each element within `factor` * bound[i] (+ `slack`) of the CPU's.
void ExpectWithinBound(const std::vector<float>& gpu, const std::vector<float>& cpu,
                       const std::vector<float>& bound, double factor, double slack,
                       const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size());
  ASSERT_EQ(bound.size(), cpu.size());
  size_t bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double err = std::abs(static_cast<double>(gpu[i]) - cpu[i]);
    const double allowed = factor * bound[i] + slack;
    if (!(err <= allowed)) ++bad;
    const double ratio = err / (allowed + 1e-300);
    if (ratio > worst_ratio || std::isnan(err)) worst_ratio = ratio, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": worst element " << worst << " gpu " << gpu[worst] << " cpu " << cpu[worst]
                     << " bound " << factor * bound[worst] + slack;
}

std::vector<float> Abs(std::vector<float> v) {
  for (float& x : v) x = std::abs(x);
  return v;
}

// The input rounding's relative error u for the tensor-core products with `dtype` weights.
double TensorCoreUnit(DType dtype) {
  switch (dtype) {
    case DType::kF32: return std::ldexp(1.0, -10);  // TF32, truncation allowed
    case DType::kBf16: return std::ldexp(1.0, -8);
    case DType::kFp16: return std::ldexp(1.0, -11);
  }
  return 1;
}

TEST_F(MlpGpuTest, LinearMatchesCpu) {
  const int64_t batch = 37, in = 130, out = 75;
  const std::vector<float> x = Random(batch * in, 1), w = Random(out * in, 2, 0.1f), b = Random(out, 3),
                           dy = Random(batch * out, 4);
  for (DType dtype : {DType::kF32, DType::kBf16, DType::kFp16}) {
    std::vector<uint16_t> wh(w.size()), bh(b.size());
    const void* w_host = w.data();
    const void* b_host = b.data();
    const void* w_dev = nullptr;
    const void* b_dev = nullptr;
    if (dtype == DType::kF32) {
      w_dev = Upload(w);
      b_dev = Upload(b);
    } else {
      FromFloat(w.data(), w.size(), dtype, wh.data());
      FromFloat(b.data(), b.size(), dtype, bh.data());
      w_host = wh.data();
      b_host = bh.data();
      w_dev = Upload(wh);
      b_dev = Upload(bh);
    }
    std::vector<float> y(batch * out), dx(batch * in), dw(out * in, 0.5f), db(out, 0.5f);
    LinearForward(x.data(), batch, in, out, w_host, b_host, dtype, y.data());
    LinearBackward(x.data(), dy.data(), batch, in, out, w_host, dtype, dx.data(), dw.data(), db.data(), true);

    const float* xd = Upload(x);
    const float* dyd = Upload(dy);
    float* yd = Zeros(y.size());
    float* dxd = Zeros(dx.size());
    float* dwd = Upload(std::vector<float>(dw.size(), 0.5f));
    float* dbd = Upload(std::vector<float>(db.size(), 0.5f));
    ASSERT_TRUE(cuda::LinearForward(nullptr, xd, batch, in, out, w_dev, b_dev, dtype, yd).ok());
    ASSERT_TRUE(
        cuda::LinearBackward(nullptr, xd, dyd, batch, in, out, w_dev, dtype, dxd, dwd, dbd, true).ok());
    ExpectClose(Download(yd, y.size()), y, 1e-5, "y");
    ExpectClose(Download(dxd, dx.size()), dx, 1e-5, "dx");
    ExpectClose(Download(dwd, dw.size()), dw, 1e-5, "dw");
    ExpectClose(Download(dbd, db.size()), db, 1e-5, "db");
  }
}

TEST_F(MlpGpuTest, LinearOnTensorCoresWithinTheRoundingBound) {
  UseTensorCores(true);
  struct Shape {
    int64_t batch, in, out;
  };
  // An odd shape (edge tiles, unaligned rows) and one the tensor-core kernels tile evenly.
  for (const Shape sh : {Shape{37, 130, 75}, Shape{256, 512, 384}}) {
    const int64_t batch = sh.batch, in = sh.in, out = sh.out;
    const std::vector<float> x = Random(batch * in, 11), w = Random(out * in, 12, 0.1f), b = Random(out, 13),
                             dy = Random(batch * out, 14);
    for (DType dtype : {DType::kF32, DType::kBf16, DType::kFp16}) {
      const std::string name = std::string(DTypeName(dtype)) + " " + std::to_string(batch) + "x" +
                               std::to_string(in) + "x" + std::to_string(out);
      // The weights as the device holds them, and their exact fp32 values for the CPU.
      std::vector<float> wf = w, bf = b;
      std::vector<uint16_t> wh(w.size()), bh(b.size());
      const void* w_dev = nullptr;
      const void* b_dev = nullptr;
      if (dtype == DType::kF32) {
        w_dev = Upload(w);
        b_dev = Upload(b);
      } else {
        FromFloat(w.data(), w.size(), dtype, wh.data());
        FromFloat(b.data(), b.size(), dtype, bh.data());
        ToFloat(wh.data(), dtype, wh.size(), wf.data());
        ToFloat(bh.data(), dtype, bh.size(), bf.data());
        w_dev = Upload(wh);
        b_dev = Upload(bh);
      }
      std::vector<float> y(batch * out), dx(batch * in), dw(out * in, 0.5f), db(out, 0.5f);
      LinearForward(x.data(), batch, in, out, wf.data(), bf.data(), DType::kF32, y.data());
      LinearBackward(x.data(), dy.data(), batch, in, out, wf.data(), DType::kF32, dx.data(), dw.data(),
                     db.data(), true);
      // The bounds' sums: the same products over absolute values.
      const std::vector<float> xa = Abs(x), wa = Abs(wf), ba = Abs(bf), dya = Abs(dy);
      std::vector<float> ys(y.size()), dxs(dx.size()), dws(dw.size(), 0.5f), dbs(db.size(), 0.5f);
      LinearForward(xa.data(), batch, in, out, wa.data(), ba.data(), DType::kF32, ys.data());
      LinearBackward(xa.data(), dya.data(), batch, in, out, wa.data(), DType::kF32, dxs.data(), dws.data(),
                     dbs.data(), true);

      const float* xd = Upload(x);
      const float* dyd = Upload(dy);
      float* yd = Zeros(y.size());
      float* y2d = Zeros(y.size());
      float* dxd = Zeros(dx.size());
      float* dwd = Upload(std::vector<float>(dw.size(), 0.5f));
      float* dbd = Upload(std::vector<float>(db.size(), 0.5f));
      ASSERT_TRUE(cuda::LinearForward(nullptr, xd, batch, in, out, w_dev, b_dev, dtype, yd).ok()) << name;
      ASSERT_TRUE(cuda::LinearForward(nullptr, xd, batch, in, out, w_dev, b_dev, dtype, y2d).ok()) << name;
      ASSERT_TRUE(
          cuda::LinearBackward(nullptr, xd, dyd, batch, in, out, w_dev, dtype, dxd, dwd, dbd, true).ok())
          << name;
      const double u = TensorCoreUnit(dtype);
      auto factor = [u](int64_t k) {
        return 2 * u + u * u + static_cast<double>(k + 2) * std::ldexp(1.0, -23);
      };
      auto slack = [dtype](int64_t k) {
        return dtype == DType::kFp16 ? static_cast<double>(k) * std::ldexp(1.0, -24) : 0.0;
      };
      const std::vector<float> y_gpu = Download(yd, y.size());
      ExpectWithinBound(y_gpu, y, ys, factor(in), slack(in), name + " y");
      ExpectWithinBound(Download(dxd, dx.size()), dx, dxs, factor(out), slack(out), name + " dx");
      ExpectWithinBound(Download(dwd, dw.size()), dw, dws, factor(batch), slack(batch), name + " dw");
      ExpectClose(Download(dbd, db.size()), db, 1e-5, "db");  // no product: fp32 sums on both
      // cuBLAS picks the same kernel for the same call: the same bits again.
      const std::vector<float> y_again = Download(y2d, y.size());
      EXPECT_EQ(std::memcmp(y_gpu.data(), y_again.data(), y.size() * sizeof(float)), 0) << name << " repeat";
    }
  }
  UseTensorCores(false);
}

TEST_F(MlpGpuTest, GeluAndLossMatchCpu) {
  const int64_t n = 5000;
  std::vector<float> x = Random(n, 5, 6.0f), dy = Random(n, 6);
  std::vector<float> y(n), dx(n);
  GeluForward(x.data(), n, y.data());
  GeluBackward(x.data(), dy.data(), n, dx.data());
  const float* xd = Upload(x);
  const float* dyd = Upload(dy);
  float* yd = Zeros(n);
  float* dxd = Zeros(n);
  ASSERT_TRUE(cuda::GeluForward(nullptr, xd, n, yd).ok());
  ASSERT_TRUE(cuda::GeluBackward(nullptr, xd, dyd, n, dxd).ok());
  ExpectClose(Download(yd, n), y, 1e-6, "gelu");
  ExpectClose(Download(dxd, n), dx, 1e-6, "gelu backward");

  const int64_t batch = 33, out = 7;
  const std::vector<float> logits = Random(batch * out, 7, 3.0f), targets = Random(batch * out, 8);
  std::vector<int32_t> labels(batch);
  for (int64_t b = 0; b < batch; ++b) labels[b] = static_cast<int32_t>(b % out);
  for (LossKind kind : {LossKind::kMse, LossKind::kCrossEntropy}) {
    std::vector<float> grad(batch * out);
    const double loss = LossForwardBackward(kind, logits.data(), targets.data(), labels.data(), batch, out,
                                            66.0, grad.data());
    float* sample = Zeros(batch);
    float* gd = Zeros(batch * out);
    ASSERT_TRUE(cuda::LossForwardBackward(nullptr, kind, Upload(logits), Upload(targets), Upload(labels),
                                          batch, out, 66.0, sample, gd)
                    .ok());
    const std::vector<float> per_sample = Download(sample, batch);
    double total = 0;
    for (float v : per_sample) total += v;
    EXPECT_NEAR(total, loss, 1e-6 * std::abs(loss) + 1e-7) << LossKindName(kind);
    ExpectClose(Download(gd, grad.size()), grad, 1e-6, "loss gradient");
  }
}

// Parameters and gradients of a DenseMlp, copied to the device, as hooks for the CUDA driver.
class DeviceHooks : public ModuleHooks {
 public:
  DeviceHooks(DenseMlp& dense, std::function<float*(const std::vector<float>&)> upload) {
    for (int m = 0; m < dense.num_modules(); ++m) {
      params_.emplace_back();
      grads_.emplace_back();
      for (auto& t : dense.params(m)) params_.back().push_back(upload(t));
      for (auto& g : dense.grads(m)) grads_.back().push_back(upload(std::vector<float>(g.size(), 0.0f)));
    }
  }
  Result<ModuleParams> Fetch(int m) override {
    return ModuleParams{DType::kF32, {params_[m][0], params_[m][1]}};
  }
  Result<ModuleBackward> BeginBackward(int m) override {
    return ModuleBackward{ModuleParams{DType::kF32, {params_[m][0], params_[m][1]}},
                          ModuleGrads{{grads_[m][0], grads_[m][1]}, {0, 0}}};
  }
  std::vector<std::vector<float*>> params_, grads_;
};

TEST_F(MlpGpuTest, CudaDriverMatchesCpuDriver) {
  for (LossKind loss : {LossKind::kMse, LossKind::kCrossEntropy}) {
    MlpSpec spec;
    spec.input_dim = 40;
    spec.hidden = {64, 48};
    spec.output_dim = 6;
    spec.loss = loss;
    spec.seed = 3;
    const SyntheticData data(spec);
    const Batch batch = data.Make(BatchSlice{0, 0, 1, 0, 1, 24}).value();
    DenseMlp dense(spec);
    Mlp cpu(spec);
    const double cpu_loss = cpu.ForwardBackward(batch, 48, dense).value();
    DeviceHooks hooks(dense, [this](const std::vector<float>& v) { return Upload(v); });
    Mlp gpu(spec, Backend::kCuda, nullptr);
    const Result<double> gpu_loss = gpu.ForwardBackward(batch, 48, hooks);
    ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status().ToString();
    EXPECT_NEAR(gpu_loss.value(), cpu_loss, 1e-5 * cpu_loss) << LossKindName(loss);
    for (int m = 0; m < dense.num_modules(); ++m) {
      for (size_t t = 0; t < 2; ++t) {
        ExpectClose(Download(hooks.grads_[m][t], dense.grads(m)[t].size()), dense.grads(m)[t], 1e-4, "grad");
      }
    }
  }
}

TEST_F(MlpGpuTest, ErrorsComeBackAsStatus) {
  // An impossible allocation is a Status, not a crash.
  Result<void*> huge = cuda::Malloc(size_t{1} << 62);
  EXPECT_FALSE(huge.ok());
}

}  // namespace
}  // namespace strata::model
