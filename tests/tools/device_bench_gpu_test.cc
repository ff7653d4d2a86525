// The GPU benchmarks of scripts/device-check.sh, written as gpu tests that are DISABLED_
// so that ctest lists but never runs them (they take seconds and need the whole GPU).
// The device check runs them after the gpu tests:
//     device_bench_gpu_test --gtest_also_run_disabled_tests --gtest_filter='DeviceBench.*'
// Each benchmark prints one line "BENCH <json>" and, when STRATA_BENCH_OUT names a
// folder, writes it to STRATA_BENCH_OUT/bench-<name>.json. They measure and report the
// ratios issue 24 asks about beside each figure; they fail only when something errs, not
// on a slow figure (a first run on new hardware must report, not guess thresholds):
//  - hbm-adam: GPU Adam's bytes per second against a device-to-device copy's (>= 0.85);
//  - gemm: cuBLAS GEMM rates, bf16 (the tensor-core peak), TF32 and fp32;
//  - mlp-step: the MLP training step (bf16, tensor cores) without offload, as model
//    FLOP/s against the bf16 GEMM peak measured in the same test (>= 0.5), and with the
//    optimizer state and parameters on NVMe beside it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "cuda_device_test.h"
#include "strata/adam.h"
#include "strata/device.h"
#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"
#include "strata/model.h"
#include "tools/plan_model.h"
#include "tools/step_bench.h"
#include "zero/single_world.h"
#if STRATA_HAVE_CUDA
#include "model/cuda/matmul.h"
#endif

namespace strata::testing {
namespace {

using nlohmann::json;

void Report(const std::string& name, const json& j) {
  std::printf("BENCH %s\n", j.dump().c_str());
  std::fflush(stdout);
  if (const char* dir = std::getenv("STRATA_BENCH_OUT"); dir != nullptr && *dir != '\0') {
    std::ofstream(std::filesystem::path(dir) / ("bench-" + name + ".json")) << j.dump(2) << "\n";
  }
}

// The median of `reps` timed runs of `run` (which enqueues and waits), after one warm-up.
double MedianSeconds(int reps, const std::function<void()>& run) {
  run();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

class DeviceBench : public CudaDeviceTest {
 protected:
  DeviceBench() : CudaDeviceTest("bench") {}
  // Zeroed device memory (the device API has no memset: copied from a zeroed host buffer).
  void* Zeroed(uint64_t bytes) {
    void* p = Allocate(bytes);
    if (p == nullptr) return nullptr;
    const std::vector<char> zeros(std::min<uint64_t>(bytes, uint64_t{256} << 20), 0);
    for (uint64_t off = 0; off < bytes; off += zeros.size()) {
      const uint64_t n = std::min<uint64_t>(zeros.size(), bytes - off);
      EXPECT_TRUE(
          device_->CopySync(static_cast<char*>(p) + off, zeros.data(), n, CopyDir::kHostToDevice).ok());
    }
    return p;
  }
  // `count` values uniform in [-1, 1) of `dtype` on the device: the products' rates
  // depend on the data (zeros draw less power and clock higher), so no zeros for them.
  void* Random(uint64_t count, DType dtype) {
    const uint64_t size = DTypeSize(dtype);
    void* p = Allocate(count * size);
    if (p == nullptr) return nullptr;
    const uint64_t piece = uint64_t{16} << 20;
    std::vector<float> f(piece);
    std::vector<uint16_t> h(piece);
    for (uint64_t off = 0; off < count; off += piece) {
      const uint64_t n = std::min(piece, count - off);
      for (uint64_t i = 0; i < n; ++i) f[i] = model::HashUniform(7, static_cast<uint64_t>(dtype), off + i);
      const void* src = f.data();
      if (dtype != DType::kF32) {
        model::FromFloat(f.data(), static_cast<int64_t>(n), dtype, h.data());
        src = h.data();
      }
      EXPECT_TRUE(
          device_->CopySync(static_cast<char*>(p) + off * size, src, n * size, CopyDir::kHostToDevice).ok());
    }
    return p;
  }
  // Device-to-device copy rate (bytes read + written per second) over `bytes` buffers.
  double CopyBytesPerSecond(uint64_t bytes) {
    void* a = Zeroed(bytes);
    void* b = Zeroed(bytes);
    const double s = MedianSeconds(10, [&] {
      EXPECT_TRUE(device_->CopyAsync(stream_, b, a, bytes, CopyDir::kDeviceToDevice).ok());
      EXPECT_TRUE(device_->Synchronize(stream_).ok());
    });
    return 2.0 * static_cast<double>(bytes) / s;
  }
};

TEST_F(DeviceBench, DISABLED_AdamBesideHbmCopy) {
  const double copy = CopyBytesPerSecond(uint64_t{1} << 30);
  // One tensor of 256M parameters, bf16 compute copy: reads p, m, v, g (16 B), writes
  // p, m, v (12 B) and the copy (2 B) per parameter.
  const size_t n = size_t{256} << 20;
  AdamParams params;
  AdamTensor t;
  t.params = &params;
  t.master = static_cast<float*>(Zeroed(n * 4));
  t.m = static_cast<float*>(Zeroed(n * 4));
  t.v = static_cast<float*>(Zeroed(n * 4));
  t.grad = GradView{Zeroed(n * 4), DType::kF32};
  t.out = Copy16{Zeroed(n * 2), DType::kBf16};
  t.n = n;
  ASSERT_TRUE(t.master != nullptr && t.out.data != nullptr);
  void* native = device_->NativeStream(stream_);
  const double s = MedianSeconds(10, [&] {
    EXPECT_TRUE(AdamStepCuda({&t, 1}, native).ok());
    EXPECT_TRUE(device_->Synchronize(stream_).ok());
    ++params.step;
  });
  const double adam = 30.0 * static_cast<double>(n) / s;
  Report("hbm-adam", {{"benchmark", "hbm-adam"},
                      {"device", device_->name()},
                      {"d2d_copy_GBps", copy / 1e9},
                      {"adam_params", n},
                      {"adam_bytes_per_param", 30},
                      {"adam_s", s},
                      {"adam_GBps", adam / 1e9},
                      {"adam_params_per_s", static_cast<double>(n) / s},
                      {"adam_fraction_of_copy", adam / copy},
                      {"target_fraction", 0.85}});
}

// Rates of one n x n x n product: bf16 (raw cuBLAS, tensor cores), and the model's
// forward product with fp32 weights as TF32 and as plain fp32. Returns the bf16 FLOP/s.
double MeasureGemm(Device& device, void* a16, void* b16, float* a32, float* b32, float* c, int64_t n,
                   json* out) {
  double bf16 = 0;
#if STRATA_HAVE_CUDA
  const double flops = 2.0 * static_cast<double>(n) * n * n;
  auto sync = [] { EXPECT_TRUE(model::cuda::StreamSynchronize(nullptr).ok()); };
  model::cuda::SetMatmulPrecision(model::cuda::MatmulPrecision::kTensorCores);
  const double s16 = MedianSeconds(10, [&] {
    EXPECT_TRUE(model::cuda::SquareGemm16(nullptr, n, DType::kBf16, a16, b16, c).ok());
    sync();
  });
  // The Linear forward on fp32 weights (y = x W^T, no rounding pass): TF32, then fp32.
  const std::vector<float> zero_bias(n, 0.0f);
  void* bias = nullptr;
  auto bias_or = model::cuda::Malloc(n * sizeof(float));
  EXPECT_TRUE(bias_or.ok());
  bias = *bias_or;
  EXPECT_TRUE(model::cuda::CopyToDevice(bias, zero_bias.data(), n * sizeof(float)).ok());
  auto linear = [&] {
    EXPECT_TRUE(model::cuda::LinearForward(nullptr, a32, n, n, n, b32, bias, DType::kF32, c).ok());
    sync();
  };
  const double s_tf32 = MedianSeconds(5, linear);
  model::cuda::SetMatmulPrecision(model::cuda::MatmulPrecision::kFp32);
  const double s32 = MedianSeconds(3, linear);
  model::cuda::SetMatmulPrecision(model::cuda::MatmulPrecision::kTensorCores);
  EXPECT_TRUE(model::cuda::Free(bias).ok());
  bf16 = flops / s16;
  *out = {{"benchmark", "gemm"},
          {"device", device.name()},
          {"n", n},
          {"bf16_TFLOPs", bf16 / 1e12},
          {"tf32_linear_TFLOPs", flops / s_tf32 / 1e12},
          {"fp32_linear_TFLOPs", flops / s32 / 1e12}};
#else
  (void)device, (void)a16, (void)b16, (void)a32, (void)b32, (void)c, (void)n, (void)out;
#endif
  return bf16;
}

// One MLP step run (bf16, tensor cores) under `zero` (the zero_optimization block).
Result<json> StepRun(const json& zero_block, const model::MlpSpec& spec, int64_t micro_batch) {
  json j;
  j["zero_optimization"] = zero_block;
  j["bf16"]["enabled"] = true;
  j["strata"]["device"] = "cuda";
  j["strata"]["chunk_size"] = "64MiB";
  STRATA_ASSIGN_OR_RETURN(Config config, ParseConfig(j));
  tools::StepBenchOptions o;
  o.config = config;
  STRATA_ASSIGN_OR_RETURN(o.model, tools::MlpPlanModel(spec));
  o.model_keys = {{"kind", "mlp"}, {"hidden", spec.hidden}};
  o.data_seed = config.seed + 1;
  o.steps = 3;
  o.micro_batch = micro_batch;
  o.compare_serial = false;
  o.measure_rates = false;
  return tools::RunStepBench(World(), o, nullptr);
}

TEST_F(DeviceBench, DISABLED_MlpStepBesideGemmPeak) {
#if !STRATA_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#endif
  const int64_t n = 8192;
  json gemm;
  const double peak = MeasureGemm(*device_, Random(n * n, DType::kBf16), Random(n * n, DType::kBf16),
                                  static_cast<float*>(Random(n * n, DType::kF32)),
                                  static_cast<float*>(Random(n * n, DType::kF32)),
                                  static_cast<float*>(Zeroed(n * n * 4)), n, &gemm);
  Report("gemm", gemm);
  FreeBuffers();

  // Wide enough layers and batch for the products to be compute-bound: 256M parameters
  // in 4 hidden layers (about 8k wide), 2048 samples per step.
  const int64_t micro_batch = 2048;
  const model::MlpSpec spec = model::MlpSpecForParams(256e6, 4, 256, 16, model::LossKind::kMse, 1);
  const char* swap_env = std::getenv("STRATA_BENCH_SWAP");
  const std::string swap = swap_env != nullptr && *swap_env != '\0'
                               ? swap_env
                               : (std::filesystem::current_path() / "bench-swap").string();
  json nvme_zero = {{"stage", 3},
                    {"offload_optimizer", {{"device", "nvme"}, {"nvme_path", swap}}},
                    {"offload_param", {{"device", "nvme"}, {"nvme_path", swap}}}};
  json report = {{"benchmark", "mlp-step"}, {"gemm_bf16_TFLOPs", peak / 1e12}, {"target_fraction", 0.5}};
  for (const auto& [name, zero_block] : {std::pair<std::string, json>{"no_offload", json{{"stage", 0}}},
                                         std::pair<std::string, json>{"nvme_offload", nvme_zero}}) {
    Result<json> r = StepRun(zero_block, spec, micro_batch);
    ASSERT_TRUE(r.ok()) << name << ": " << r.status().ToString();
    const double params = (*r)["model"]["params"].get<double>();
    const double step_s = (*r)["run"]["step_s"].get<double>();
    const double flops = 6.0 * params * static_cast<double>(micro_batch) / step_s;  // model FLOPs
    report[name] = {{"step_s", step_s},
                    {"params", params},
                    {"samples", micro_batch},
                    {"model_TFLOPs", flops / 1e12},
                    {"fraction_of_gemm_peak", flops / peak},
                    {"run", (*r)["run"]}};
  }
  std::filesystem::remove_all(swap);
  Report("mlp-step", report);
}

}  // namespace
}  // namespace strata::testing
