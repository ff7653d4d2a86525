// The GPT driver on the CUDA backend against the same driver on the CPU: a whole
// forward, loss and backward through hooks whose parameters and gradients live in device
// memory (a mirror of a dense host store). Skipped where there is no GPU. The products
// run in fp32 (no TF32), so both sides compute the same sums in other orders.
//
// Tolerances: loss 1e-5 relative; each gradient and the logits within 1e-4 of the largest
// |cpu| entry of their tensor. A pass chains about 20 dependent operations per block,
// each a sum of at most 4C = 128 terms here, whose fp32 rounding (2^-24 relative per
// addition, (n - 1) u for an n-term sum) comes to about 1e-5 of the scale; 1e-4 leaves
// tenfold slack, while a wrong operand, stride, flag or order of hooks is off by O(1).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/gpt_hooks.h"
#include "model/gpu_compare.h"
#include "strata/gpt.h"
#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"
#include "zero/chain_model.h"
#if STRATA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace strata::model {
namespace {

using DenseHooks = ::strata::testing::DenseHooks;
using testing::CheckingHooks;
using testing::HashTokens;

// Hands out device copies of what `inner` (host memory) hands out: parameters at Fetch
// and BeginBackward, the gradients' current values too (a flag may say add); at
// EndBackward the device gradients are copied back into the inner store's. The driver's
// work runs on `stream` (non-blocking, as the engine's compute stream): Release and
// EndBackward wait for it, as the engine does, before the copies go or are read.
class DeviceMirrorHooks : public ModuleHooks {
 public:
  DeviceMirrorHooks(ModuleHooks& inner, const ModelDecl& model, void* stream)
      : inner_(inner), model_(model), stream_(stream) {}
  ~DeviceMirrorHooks() override { FreeAll(); }

  Result<ModuleParams> Fetch(int m) override {
    STRATA_ASSIGN_OR_RETURN(ModuleParams p, inner_.Fetch(m));
    return Mirror(m, p);
  }
  Status Release(int m) override {
    STRATA_RETURN_IF_ERROR(cuda::StreamSynchronize(stream_));
    FreeAll();
    return inner_.Release(m);
  }
  Result<ModuleBackward> BeginBackward(int m) override {
    STRATA_ASSIGN_OR_RETURN(ModuleBackward bw, inner_.BeginBackward(m));
    STRATA_ASSIGN_OR_RETURN(ModuleParams params, Mirror(m, bw.params));
    host_grads_ = bw.grads.tensors;
    ModuleBackward out{params, bw.grads};
    for (size_t i = 0; i < host_grads_.size(); ++i) {
      const size_t bytes = Numel(m, i) * sizeof(float);
      STRATA_ASSIGN_OR_RETURN(void* d, Allocate(bytes));
      STRATA_RETURN_IF_ERROR(cuda::CopyToDevice(d, host_grads_[i], bytes));
      out.grads.tensors[i] = static_cast<float*>(d);
    }
    device_grads_ = out.grads.tensors;
    return out;
  }
  Status EndBackward(int m) override {
    STRATA_RETURN_IF_ERROR(cuda::StreamSynchronize(stream_));
    for (size_t i = 0; i < host_grads_.size(); ++i) {
      STRATA_RETURN_IF_ERROR(cuda::CopyToHost(host_grads_[i], device_grads_[i], Numel(m, i) * sizeof(float)));
    }
    FreeAll();
    return inner_.EndBackward(m);
  }

 private:
  size_t Numel(int m, size_t i) const {
    return static_cast<size_t>(model_.tensors[model_.modules[m].tensors[i]].numel());
  }
  Result<void*> Allocate(size_t bytes) {
    STRATA_ASSIGN_OR_RETURN(void* d, cuda::Malloc(bytes));
    live_.push_back(d);
    return d;
  }
  Result<ModuleParams> Mirror(int m, const ModuleParams& host) {
    ModuleParams p = host;
    for (size_t i = 0; i < host.tensors.size(); ++i) {
      const size_t bytes = Numel(m, i) * DTypeSize(host.dtype);
      STRATA_ASSIGN_OR_RETURN(void* d, Allocate(bytes));
      STRATA_RETURN_IF_ERROR(cuda::CopyToDevice(d, host.tensors[i], bytes));
      p.tensors[i] = d;
    }
    return p;
  }
  void FreeAll() {
    for (void* d : live_) EXPECT_TRUE(cuda::Free(d).ok());
    live_.clear();
  }

  ModuleHooks& inner_;
  const ModelDecl& model_;
  void* stream_;
  std::vector<void*> live_;
  std::vector<float*> host_grads_, device_grads_;
};

class GptDriverGpuTest : public testing::Fp32ProductsGpuTest {
 protected:
  void SetUp() override {
    Fp32ProductsGpuTest::SetUp();
    if (IsSkipped()) return;
#if STRATA_HAVE_CUDA
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    stream_ = s;
#endif
  }
  void TearDown() override {
#if STRATA_HAVE_CUDA
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamDestroy(static_cast<cudaStream_t>(stream_)), cudaSuccess);
    }
#endif
  }
  void* stream_ = nullptr;  // the driver's: non-blocking, as the engine's compute stream
};

::strata::testing::TensorInit SpecInit(const GptSpec& spec) {
  return [spec](TensorId t, int64_t b, int64_t n, float* out) { InitGptTensor(spec, t, b, n, out); };
}

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

void ExpectNear(const std::vector<float>& gpu, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double err = 0;
  for (size_t i = 0; i < cpu.size(); ++i) err = std::max(err, std::abs(static_cast<double>(gpu[i]) - cpu[i]));
  EXPECT_LE(err, 1e-4 * std::max(MaxAbs(cpu), 1e-30)) << what << ": largest difference " << err;
}

struct Case {
  const char* name;
  GptSpec spec;
  DType dtype;
  bool recompute;
  int64_t batch, seq;
};

// One pass on each backend from the same store; the loss, every gradient, the call order
// and (after a Forward) the logits agree. The CUDA driver first runs a smaller pass (on a
// store of its own), so that its workspace grows between passes.
void CompareBackends(const Case& c, void* stream) {
  SCOPED_TRACE(c.name);
  const int64_t n = c.batch * c.seq;
  const std::vector<int32_t> tokens = HashTokens(n, 4, 1, c.spec.vocab_size);
  const std::vector<int32_t> targets = HashTokens(n, 4, 2, c.spec.vocab_size);
  Gpt cpu(c.spec), gpu(c.spec, Backend::kCuda, stream);
  cpu.set_recompute(c.recompute);
  gpu.set_recompute(c.recompute);
  DenseHooks cpu_store(cpu.modules(), c.dtype, SpecInit(c.spec)), gpu_store = cpu_store, scratch = cpu_store;
  {
    DeviceMirrorHooks small(scratch, gpu.modules(), stream);
    ASSERT_TRUE(gpu.ForwardBackward(tokens.data(), targets.data(), 1, c.seq - 1, 1.0, small).ok());
  }
  CheckingHooks cpu_hooks(cpu_store, cpu.modules()), gpu_checked(gpu_store, gpu.modules());
  DeviceMirrorHooks gpu_hooks(gpu_checked, gpu.modules(), stream);
  const double norm = static_cast<double>(n);
  Result<double> a = cpu.ForwardBackward(tokens.data(), targets.data(), c.batch, c.seq, norm, cpu_hooks);
  Result<double> b = gpu.ForwardBackward(tokens.data(), targets.data(), c.batch, c.seq, norm, gpu_hooks);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NEAR(*b, *a, 1e-5 * std::abs(*a));
  EXPECT_EQ(gpu_checked.log(), cpu_hooks.log());
  for (size_t t = 0; t < cpu.modules().tensors.size(); ++t) {
    ExpectNear(gpu_store.grad(static_cast<TensorId>(t)), cpu_store.grad(static_cast<TensorId>(t)),
               "gradient of " + cpu.modules().tensors[t].name);
  }
  ASSERT_TRUE(cpu.Forward(tokens.data(), targets.data(), c.batch, c.seq, norm, cpu_hooks).ok());
  ASSERT_TRUE(gpu.Forward(tokens.data(), targets.data(), c.batch, c.seq, norm, gpu_hooks).ok());
  std::vector<float> la(static_cast<size_t>(n * c.spec.vocab_size)), lb(la.size());
  ASSERT_TRUE(cpu.CopyLogits(0, n, la.data()).ok());
  ASSERT_TRUE(gpu.CopyLogits(0, n, lb.data()).ok());
  ExpectNear(lb, la, "logits");
}

TEST_F(GptDriverGpuTest, MatchesTheCpuDriver) {
  const GptSpec tied{64, 16, 2, 2, 32, /*tied_head=*/true, /*seed=*/3};
  const GptSpec untied{97, 24, 3, 4, 48, /*tied_head=*/false, /*seed=*/5};
  for (const Case& c : {Case{"fp32, tied", tied, DType::kF32, false, 2, 16},
                        Case{"fp32, untied, recompute, a short sequence", untied, DType::kF32, true, 3, 19},
                        Case{"bf16, tied, recompute", tied, DType::kBf16, true, 2, 16},
                        Case{"fp16, untied", untied, DType::kFp16, false, 1, 24}}) {
    CompareBackends(c, stream_);
  }
}

// Flags per tensor on the device: biases told to add onto 0.75 while their weights are
// overwritten, as the CPU driver does (gpt_driver_test's HonoursEachTensorsAccumulateFlag).
TEST_F(GptDriverGpuTest, HonoursEachTensorsAccumulateFlag) {
  const GptSpec spec{64, 16, 2, 2, 32, true, 3};
  const std::vector<int32_t> tokens = HashTokens(32, 4, 1, 64), targets = HashTokens(32, 4, 2, 64);
  Gpt cpu(spec), gpu(spec, Backend::kCuda, stream_);
  DenseHooks cpu_store(cpu.modules(), DType::kF32, SpecInit(spec)), gpu_store = cpu_store;
  CheckingHooks cpu_hooks(cpu_store, cpu.modules()), gpu_checked(gpu_store, gpu.modules());
  cpu_hooks.ForceAccumulateOnOddTensors(0.75f);
  gpu_checked.ForceAccumulateOnOddTensors(0.75f);
  DeviceMirrorHooks gpu_hooks(gpu_checked, gpu.modules(), stream_);
  ASSERT_TRUE(cpu.ForwardBackward(tokens.data(), targets.data(), 2, 16, 32.0, cpu_hooks).ok());
  ASSERT_TRUE(gpu.ForwardBackward(tokens.data(), targets.data(), 2, 16, 32.0, gpu_hooks).ok());
  for (size_t t = 0; t < cpu.modules().tensors.size(); ++t) {
    ExpectNear(gpu_store.grad(static_cast<TensorId>(t)), cpu_store.grad(static_cast<TensorId>(t)),
               "gradient of " + cpu.modules().tensors[t].name);
  }
}

// Two passes of the CUDA driver give the same bits (no float atomics, fixed orders).
TEST_F(GptDriverGpuTest, IsDeterministic) {
  const GptSpec spec{97, 24, 3, 4, 48, false, 5};
  const std::vector<int32_t> tokens = HashTokens(48, 6, 1, 97), targets = HashTokens(48, 6, 2, 97);
  Gpt gpu(spec, Backend::kCuda, stream_);
  DenseHooks first(gpu.modules(), DType::kF32, SpecInit(spec)), second = first;
  for (DenseHooks* store : {&first, &second}) {
    DeviceMirrorHooks hooks(*store, gpu.modules(), stream_);
    ASSERT_TRUE(gpu.ForwardBackward(tokens.data(), targets.data(), 2, 24, 48.0, hooks).ok());
  }
  for (size_t t = 0; t < gpu.modules().tensors.size(); ++t) {
    const std::vector<float>&a = first.grad(static_cast<TensorId>(t)),
          &b = second.grad(static_cast<TensorId>(t));
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << gpu.modules().tensors[t].name;
  }
}

}  // namespace
}  // namespace strata::model
