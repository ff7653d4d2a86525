// The engine's CUDA device ops (zero/cuda/device_ops_cuda.cc) against the host ops on the
// same data. Element-wise ops are bit-identical to the host's (the same single rounding);
// gradient statistics sum in double in another order than the reference, so they agree
// to 1e-12 relative, and repeat bit for bit (no atomics). Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cuda_device_test.h"
#include "strata/device.h"
#include "strata/half.h"
#include "strata/model.h"
#include "zero/device_ops.h"

namespace strata::zero {
namespace {

class DeviceOpsGpuTest : public testing::CudaDeviceTest {
 protected:
  DeviceOpsGpuTest() : CudaDeviceTest("compute") {}
  void SetUp() override {
    CudaDeviceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    auto ops = CreateDeviceOps(*device_, stream_);
    ASSERT_TRUE(ops.ok()) << ops.status().ToString();
    ops_ = std::move(*ops);
  }
  void TearDown() override {
    ops_.reset();
    CudaDeviceTest::TearDown();
  }
  template <typename T>
  T* Upload(const std::vector<T>& v) {
    void* p = Allocate(std::max<size_t>(v.size() * sizeof(T), 1));
    if (p == nullptr) return nullptr;
    EXPECT_TRUE(device_->CopySync(p, v.data(), v.size() * sizeof(T), CopyDir::kHostToDevice).ok());
    return static_cast<T*>(p);
  }
  template <typename T>
  std::vector<T> Download(const T* d, size_t n) {
    std::vector<T> v(n);
    EXPECT_TRUE(device_->CopySync(v.data(), d, n * sizeof(T), CopyDir::kDeviceToHost).ok());
    return v;
  }

  std::unique_ptr<DeviceOps> ops_;
};

std::vector<float> Values(size_t n, uint64_t stream, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * model::HashUniform(5, stream, i);
  return v;
}

TEST_F(DeviceOpsGpuTest, ElementwiseOpsAreBitIdenticalToTheHost) {
  const size_t n = (size_t{1} << 20) + 7;
  std::vector<float> dst = Values(n, 1, 3.0f), src = Values(n, 2, 3.0f), x = Values(n, 3, 7e4f);
  float* dst_d = Upload(dst);
  float* x_d = Upload(x);
  ASSERT_TRUE(ops_->Accumulate(OpsLane::kReduce, dst_d, Upload(src), static_cast<int64_t>(n)).ok());
  ASSERT_TRUE(ops_->RoundThroughFp16(OpsLane::kReduce, x_d, static_cast<int64_t>(n)).ok());
  ASSERT_TRUE(
      HostMemoryOps().Accumulate(OpsLane::kReduce, dst.data(), src.data(), static_cast<int64_t>(n)).ok());
  ASSERT_TRUE(HostMemoryOps().RoundThroughFp16(OpsLane::kReduce, x.data(), static_cast<int64_t>(n)).ok());
  const std::vector<float> dst_gpu = Download(dst_d, n), x_gpu = Download(x_d, n);
  EXPECT_EQ(std::memcmp(dst_gpu.data(), dst.data(), n * sizeof(float)), 0) << "accumulate";
  EXPECT_EQ(std::memcmp(x_gpu.data(), x.data(), n * sizeof(float)), 0) << "fp16 rounding (past 65504: inf)";
}

TEST_F(DeviceOpsGpuTest, GradStatsMatchTheReferenceAndRepeat) {
  // Mixed types and sizes, and more shards than one launch takes (128).
  std::vector<GradShard> shards;
  GradStats ref;
  std::vector<std::vector<uint16_t>> halves;
  for (int i = 0; i < 300; ++i) {
    const size_t n = i == 0 ? (size_t{3} << 20) + 1 : static_cast<size_t>(1 + i * 53 % 4000);
    const std::vector<float> v = Values(n, 100 + i, 2.0f);
    const DType type = i % 3 == 0 ? DType::kF32 : (i % 3 == 1 ? DType::kBf16 : DType::kFp16);
    GradShard s;
    s.n = n;
    if (type == DType::kF32) {
      s.grad = GradView{Upload(v), type};
      ref.Merge(ComputeGradStatsReference(GradView{v.data(), type}, n));
    } else {
      halves.emplace_back(n);
      for (size_t j = 0; j < n; ++j) {
        halves.back()[j] = type == DType::kBf16 ? FloatToBf16(v[j]).bits : FloatToFp16(v[j]).bits;
      }
      s.grad = GradView{Upload(halves.back()), type};
      ref.Merge(ComputeGradStatsReference(GradView{halves.back().data(), type}, n));
    }
    shards.push_back(s);
  }
  for (OpsLane lane : {OpsLane::kTraining, OpsLane::kOptimizer}) {
    Result<GradStats> a = ops_->ComputeStats(lane, shards);
    Result<GradStats> b = ops_->ComputeStats(lane, shards);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << " " << b.status().ToString();
    EXPECT_FALSE(a->has_inf_nan);
    EXPECT_NEAR(a->sum_sq, ref.sum_sq, 1e-12 * ref.sum_sq);
    EXPECT_EQ(std::memcmp(&a->sum_sq, &b->sum_sq, sizeof(double)), 0) << "the same shards, the same bits";
  }
  // One inf anywhere is seen; a single small shard works after the large call.
  std::vector<float> bad(1000, 0.5f);
  bad[777] = std::numeric_limits<float>::infinity();
  const GradShard one{GradView{Upload(bad), DType::kF32}, bad.size()};
  Result<GradStats> c = ops_->ComputeStats(OpsLane::kTraining, {&one, 1});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->has_inf_nan);
  // Nothing to do is no launch.
  Result<GradStats> none = ops_->ComputeStats(OpsLane::kTraining, {});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->sum_sq, 0.0);
}

}  // namespace
}  // namespace strata::zero
