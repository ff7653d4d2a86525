// For the model's GPU tests: a fixture that skips without a GPU and keeps the device
// buffers it uploads; comparisons of GPU results with CPU ones (random inputs, bitwise
// equality, closeness relative to the largest reference entry).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "strata/mlp_cuda.h"
#include "strata/model.h"
#if STRATA_HAVE_CUDA
#include "model/cuda/matmul.h"
#endif

namespace strata::model::testing {

// Skips (with the reason) where no GPU can be used; frees what it uploaded.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Status available = cuda::DeviceAvailable();
    if (!available.ok()) GTEST_SKIP() << "no GPU: " << available.ToString();
  }
  ~GpuTest() override {
    for (void* p : allocations_) EXPECT_TRUE(cuda::Free(p).ok());
  }
  template <typename T>
  T* Upload(const std::vector<T>& host) {
    void* p = cuda::Malloc(std::max<size_t>(host.size(), 1) * sizeof(T)).value();
    allocations_.push_back(p);
    EXPECT_TRUE(cuda::CopyToDevice(p, host.data(), host.size() * sizeof(T)).ok());
    return static_cast<T*>(p);
  }
  // After the default stream's work.
  template <typename T>
  std::vector<T> Download(const T* device, size_t n) {
    std::vector<T> host(n);
    EXPECT_TRUE(cuda::StreamSynchronize(nullptr).ok());
    EXPECT_TRUE(cuda::CopyToHost(host.data(), device, n * sizeof(T)).ok());
    return host;
  }

 private:
  std::vector<void*> allocations_;
};

// A GpuTest whose matrix products run in fp32 (no TF32, no 16-bit rounding of the
// inputs): the precision the CPU comparisons' tolerances are stated for.
class Fp32ProductsGpuTest : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
#if STRATA_HAVE_CUDA
    cuda::SetMatmulPrecision(cuda::MatmulPrecision::kFp32);
#endif
  }
};

inline std::vector<float> Random(int64_t n, uint64_t stream, float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = offset + scale * HashUniform(77, stream, i);
  return v;
}

inline std::vector<int32_t> RandomIds(int64_t n, uint64_t stream, int32_t limit) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = std::min<int32_t>(limit - 1,
                             static_cast<int32_t>((HashUniform(77, stream, i) + 1.0f) * 0.5f * limit));
  }
  return v;
}

template <typename T>
void ExpectBitwise(const std::vector<T>& gpu, const std::vector<T>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::memcmp(&gpu[i], &cpu[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " gpu " << gpu[i] << " cpu " << cpu[i];
      return;
    }
  }
}

// max |gpu - cpu| <= tol * max |cpu|.
inline void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu, double tol,
                        const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double scale = 1e-30, err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(cpu[i])));
    double e = std::abs(static_cast<double>(gpu[i]) - cpu[i]);
    if (std::isnan(e)) e = INFINITY;
    if (e > err) {
      err = e;
      worst = i;
    }
  }
  EXPECT_LE(err, tol * scale) << what << ": worst element " << worst << " gpu " << gpu[worst] << " cpu "
                              << cpu[worst] << " (tolerance " << tol << " of " << scale << ")";
}

// Columns [from, from + width) of each row of a [rows, ld] matrix.
inline std::vector<float> Columns(const std::vector<float>& m, int64_t ld, int64_t from, int64_t width) {
  std::vector<float> out;
  for (size_t r = 0; r < m.size() / ld; ++r) {
    out.insert(out.end(), &m[r * ld + from], &m[r * ld + from + width]);
  }
  return out;
}

}  // namespace strata::model::testing
