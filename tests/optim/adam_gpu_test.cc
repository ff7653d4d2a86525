// The fused multi-tensor CUDA AdamW and grad-stats kernels against the CPU reference,
// with the tolerances of adam_test_util.h (the GPU contracts a*b+c into FMAs like the
// SIMD paths) and the 16-bit copy bit-exact to the rounding of the GPU's own fp32 result.
// Skips without a GPU.
#include <gtest/gtest.h>

#include "adam_test_util.h"
#include "optim/cuda_util.h"
#include "strata/grad_stats.h"

namespace strata {
namespace {

using testing::AdamState;

class AdamGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!AdamCudaBuilt()) GTEST_SKIP() << "this build has no CUDA";
    if (optim::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  }
  // Copies a host vector to a new device buffer (freed in TearDown).
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    Result<void*> d = optim::CudaAlloc(v.size() * sizeof(T) + 16);
    EXPECT_TRUE(d.ok());
    bufs_.push_back(*d);
    EXPECT_TRUE(optim::CudaCopyToDevice(*d, v.data(), v.size() * sizeof(T)).ok());
    return static_cast<T*>(*d);
  }
  template <typename T>
  void Download(std::vector<T>& v, const T* d) {
    ASSERT_TRUE(optim::CudaCopyToHost(v.data(), d, v.size() * sizeof(T)).ok());
  }
  void TearDown() override {
    for (void* p : bufs_) optim::CudaFree(p);
  }
  std::vector<void*> bufs_;
};

TEST_F(AdamGpuTest, MultiTensorMatchesReference) {
  // 40 tensors (more than one launch batch of 32), mixed sizes, grad types, copies, groups.
  AdamParams adamw;
  adamw.weight_decay = 0.01f;
  adamw.step = 7;
  AdamParams adam = adamw;
  adam.adamw = false;
  adam.step = 1;
  adam.grad_scale = 1.0f / 256;
  struct Dev {
    float *p, *m, *v;
    void *g, *out;
  };
  std::vector<AdamState> host, ref;
  std::vector<AdamTensor> tensors;
  std::vector<DType> gtypes, otypes;
  std::vector<Dev> dev;
  for (int i = 0; i < 40; ++i) {
    const size_t n = i == 0 ? (size_t{1} << 20) + 3 : static_cast<size_t>(i * 37 % 300);
    host.push_back(testing::MakeState(n, 0, testing::Magnitude::kNormal, 1000 + i));
    const DType gt = static_cast<DType>(i % 3);
    const DType ot = i % 2 ? DType::kBf16 : DType::kFp16;
    const AdamParams* a = i % 4 == 3 ? &adam : &adamw;
    if (gt != DType::kF32) testing::Make16BitGrads(host.back(), gt, 1.0f / a->grad_scale);
    gtypes.push_back(gt);
    otypes.push_back(ot);
  }
  ref = host;
  for (int i = 0; i < 40; ++i) {
    AdamState& h = host[i];
    Dev d{Upload(h.p), Upload(h.m), Upload(h.v), nullptr, Upload(h.out16)};
    d.g = gtypes[i] == DType::kF32 ? static_cast<void*>(Upload(h.g32)) : static_cast<void*>(Upload(h.g16));
    dev.push_back(d);
    tensors.push_back({i % 4 == 3 ? &adam : &adamw,
                       d.p,
                       d.m,
                       d.v,
                       {d.g, gtypes[i]},
                       {i % 5 == 4 ? nullptr : d.out, otypes[i]},
                       h.n});
  }
  ASSERT_TRUE(AdamStepCuda(tensors, nullptr).ok());
  ASSERT_TRUE(optim::CudaSync().ok());
  for (int i = 0; i < 40; ++i) {
    SCOPED_TRACE(i);
    AdamState& h = host[i];
    const testing::Tolerance tol = testing::StepTolerance(*tensors[i].params, ref[i], gtypes[i]);
    Download(h.p, dev[i].p);
    Download(h.m, dev[i].m);
    Download(h.v, dev[i].v);
    Download(h.out16, static_cast<uint16_t*>(dev[i].out));
    ASSERT_TRUE(AdamStepReference(*tensors[i].params, ref[i].P(), ref[i].M(), ref[i].V(),
                                  ref[i].Grad(gtypes[i]), h.n, {})
                    .ok());
    EXPECT_TRUE(testing::Near("m", h.M(), ref[i].M(), tol.m, h.n));
    EXPECT_TRUE(testing::Near("v", h.V(), ref[i].V(), tol.v, h.n));
    EXPECT_TRUE(testing::Near("p", h.P(), ref[i].P(), tol.p, h.n));
    if (i % 5 != 4) {
      EXPECT_TRUE(testing::CopyExact(h, otypes[i]));
    }
  }
}

TEST_F(AdamGpuTest, GradStatsMatchesReference) {
  AdamState a = testing::MakeState((size_t{1} << 20) + 5, 0, testing::Magnitude::kNormal, 1);
  AdamState b = testing::MakeState(1000, 0, testing::Magnitude::kNormal, 2);
  testing::Make16BitGrads(b, DType::kFp16, 1.0f);
  const GradShard shards[] = {{{Upload(a.g32), DType::kF32}, a.n}, {{Upload(b.g16), DType::kFp16}, b.n}};
  Result<GradStats> got = ComputeGradStatsCuda(shards, nullptr);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  GradStats want = ComputeGradStatsReference(a.Grad(DType::kF32), a.n);
  want.Merge(ComputeGradStatsReference(b.Grad(DType::kFp16), b.n));
  EXPECT_FALSE(got->has_inf_nan);
  EXPECT_NEAR(got->sum_sq, want.sum_sq, 1e-12 * want.sum_sq);
  b.g16[500] = 0x7c00;  // +inf
  const GradShard bad[] = {{{Upload(b.g16), DType::kFp16}, b.n}};
  got = ComputeGradStatsCuda(bad, nullptr);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->has_inf_nan);
}

}  // namespace
}  // namespace strata
