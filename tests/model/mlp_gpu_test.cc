// The CUDA kernels against the CPU kernels (skipped where there is no GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "strata/half.h"
#include "strata/mlp.h"
#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"

namespace strata::model {
namespace {

class MlpGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status available = cuda::DeviceAvailable();
    if (!available.ok()) GTEST_SKIP() << "no GPU: " << available.ToString();
  }
  ~MlpGpuTest() override {
    for (void* p : allocations_) EXPECT_TRUE(cuda::Free(p).ok());
  }

  template <typename T>
  T* Upload(const std::vector<T>& host) {
    void* p = cuda::Malloc(std::max<size_t>(host.size(), 1) * sizeof(T)).value();
    allocations_.push_back(p);
    EXPECT_TRUE(cuda::CopyToDevice(p, host.data(), host.size() * sizeof(T)).ok());
    return static_cast<T*>(p);
  }
  float* Zeros(size_t n) { return Upload(std::vector<float>(n, 0.0f)); }
  std::vector<float> Download(const float* device, size_t n) {
    std::vector<float> host(n);
    EXPECT_TRUE(cuda::StreamSynchronize(nullptr).ok());
    EXPECT_TRUE(cuda::CopyToHost(host.data(), device, n * sizeof(float)).ok());
    return host;
  }

 private:
  std::vector<void*> allocations_;
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
class DeviceHooks : public MlpHooks {
 public:
  DeviceHooks(DenseMlp& dense, std::function<float*(const std::vector<float>&)> upload) {
    for (int m = 0; m < dense.num_modules(); ++m) {
      params_.emplace_back();
      grads_.emplace_back();
      for (auto& t : dense.params(m)) params_.back().push_back(upload(t));
      for (auto& g : dense.grads(m)) grads_.back().push_back(upload(std::vector<float>(g.size(), 0.0f)));
    }
  }
  Result<ModuleParams> BeforeForward(int m) override {
    return ModuleParams{DType::kF32, {params_[m][0], params_[m][1]}};
  }
  Result<ModuleBackward> BeforeBackward(int m) override {
    return ModuleBackward{ModuleParams{DType::kF32, {params_[m][0], params_[m][1]}},
                          ModuleGrads{{grads_[m][0], grads_[m][1]}, false}};
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
