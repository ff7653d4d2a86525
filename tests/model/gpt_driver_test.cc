// The GPT driver's handling of the hooks (gpt.h): per-tensor accumulate flags, errors of
// its own and of the hooks, 16-bit parameters, the CUDA refusal, and the reuse of its
// workspace.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/gpt_hooks.h"
#include "strata/gpt.h"
#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"
#include "zero/chain_model.h"

namespace strata::model {
namespace {

using DenseHooks = ::strata::testing::DenseHooks;
using testing::CheckingHooks;
using testing::HashTokens;

const GptSpec kSpec{64, 16, 2, 2, 32, /*tied_head=*/true, /*seed=*/3};
constexpr int64_t kBatch = 2, kSeq = 16;

::strata::testing::TensorInit SpecInit(const GptSpec& spec) {
  return [spec](TensorId t, int64_t b, int64_t n, float* out) { InitGptTensor(spec, t, b, n, out); };
}

struct Data {
  std::vector<int32_t> tokens = HashTokens(kBatch * kSeq, 4, 1, kSpec.vocab_size);
  std::vector<int32_t> targets = HashTokens(kBatch * kSeq, 4, 2, kSpec.vocab_size);
};

Result<double> Pass(Gpt& gpt, ModuleHooks& hooks, const Data& d, int64_t batch = kBatch, int64_t seq = kSeq) {
  return gpt.ForwardBackward(d.tokens.data(), d.targets.data(), batch, seq, double(batch * seq), hooks);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Flags are per tensor: a bias (and lnf.bias, wpe) told to add while its weight is told to
// overwrite gets old + sum while the weight gets the sum alone, bit for bit (bias sums are
// formed first and added once). A whole second pass with every flag set doubles every
// gradient: to a rounding of the tensor's scale, as the weight products add their terms
// onto the old value one by one.
TEST(GptDriver, HonoursEachTensorsAccumulateFlag) {
  const Data d;
  Gpt gpt(kSpec);
  DenseHooks plain(gpt.modules(), DType::kF32, SpecInit(kSpec)), mixed = plain;
  ASSERT_TRUE(Pass(gpt, plain, d).ok());
  CheckingHooks forcing(mixed, gpt.modules());
  forcing.ForceAccumulateOnOddTensors(0.75f);
  ASSERT_TRUE(Pass(gpt, forcing, d).ok());
  for (const ModuleDecl& m : gpt.modules().modules) {
    for (size_t i = 0; i < m.tensors.size(); ++i) {
      const TensorId t = m.tensors[i];
      if (t == kGptWte) continue;  // listed twice; checked below
      const std::vector<float>& want = plain.grad(t);
      for (size_t e = 0; e < want.size(); ++e) {
        const float expected = i % 2 == 1 ? 0.75f + want[e] : want[e];
        ASSERT_EQ(mixed.grad(t)[e], expected) << gpt.modules().tensors[t].name << " element " << e;
      }
    }
  }
  EXPECT_TRUE(SameBits(mixed.grad(kGptWte), plain.grad(kGptWte)));

  const std::vector<std::vector<float>> once = [&] {
    std::vector<std::vector<float>> g;
    for (size_t t = 0; t < gpt.modules().tensors.size(); ++t)
      g.push_back(plain.grad(static_cast<TensorId>(t)));
    return g;
  }();
  ASSERT_TRUE(Pass(gpt, plain, d).ok());  // no BeginMicroBatch: every flag says add
  for (TensorId t = 0; t < static_cast<TensorId>(once.size()); ++t) {
    float scale = 0;
    for (float g : once[t]) scale = std::max(scale, std::abs(g));
    for (size_t e = 0; e < once[t].size(); ++e) {
      ASSERT_NEAR(plain.grad(t)[e], 2 * once[t][e], 1e-6 * scale)
          << gpt.modules().tensors[t].name << " " << e;
    }
  }
}

TEST(GptDriver, RefusesABadBatchBeforeCallingAnyHook) {
  Data d;
  Gpt gpt(kSpec);
  DenseHooks dense(gpt.modules(), DType::kF32, SpecInit(kSpec));
  CheckingHooks hooks(dense, gpt.modules());
  auto expect_bad = [&](Result<double> r, const std::string& words) {
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << words;
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().ToString();
  };
  expect_bad(Pass(gpt, hooks, d, kBatch, kSpec.block_size + 1), "block_size 16");
  expect_bad(Pass(gpt, hooks, d, 0, kSeq), "batch 0");
  expect_bad(gpt.ForwardBackward(d.tokens.data(), d.targets.data(), kBatch, kSeq, 0.0, hooks), "normaliser");
  expect_bad(gpt.Forward(nullptr, d.targets.data(), kBatch, kSeq, 1.0, hooks), "null");
  d.tokens[5] = 64;
  expect_bad(Pass(gpt, hooks, d), "token 64 at position 5");
  d.tokens[5] = 0;
  d.targets[31] = -1;
  expect_bad(gpt.Forward(d.tokens.data(), d.targets.data(), kBatch, kSeq, 1.0, hooks),
             "target -1 at position 31");
  EXPECT_TRUE(hooks.log().empty());
}

// A hook that fails stops the pass; the error names the hook and the module.
class FailingHooks : public DenseHooks {
 public:
  FailingHooks(const ModelDecl& model, int module)
      : DenseHooks(model, DType::kF32, SpecInit(kSpec)), m_(module) {}
  Result<ModuleBackward> BeginBackward(int module) override {
    if (module == m_) return IoError("disk on fire");
    return DenseHooks::BeginBackward(module);
  }

 private:
  int m_;
};

TEST(GptDriver, StopsAtAFailingHookAndNamesTheModule) {
  const Data d;
  Gpt gpt(kSpec);
  FailingHooks failing(gpt.modules(), GptMlpModule(0));
  CheckingHooks hooks(failing, gpt.modules());
  const Status s = Pass(gpt, hooks, d).status();
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s.ToString();
  EXPECT_NE(s.message().find("BeginBackward of GPT module h0.mlp"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("disk on fire"), std::string::npos) << s.ToString();
  EXPECT_EQ(hooks.log().back(), "B2") << "nothing after the failed hook";
}

// 16-bit parameters compute what fp32 ones rounded to 16 bits compute, bit for bit:
// the loss and every gradient, tied and untied, with and without recompute, with a
// sequence shorter than the block (bf16 and fp16). A pass that widened a weight through
// another rounding, or read a 16-bit tensor as fp32, fails it.
TEST(GptDriver, SixteenBitParametersComputeTheirFp32ValuesBitForBit) {
  const Data d;
  for (DType dtype : {DType::kBf16, DType::kFp16}) {
    for (bool tied : {true, false}) {
      for (bool recompute : {false, true}) {
        GptSpec spec = kSpec;
        spec.tied_head = tied;
        const std::string what =
            std::string(DTypeName(dtype)) + (tied ? " tied" : " untied") + (recompute ? " recompute" : "");
        Gpt half(spec), wide(spec);
        half.set_recompute(recompute);
        wide.set_recompute(recompute);
        DenseHooks h16(half.modules(), dtype, SpecInit(spec));
        DenseHooks h32(wide.modules(), DType::kF32, [&](TensorId t, int64_t b, int64_t n, float* out) {
          InitGptTensor(spec, t, b, n, out);
          std::vector<uint16_t> bits(n);
          FromFloat(out, n, dtype, bits.data());
          ToFloat(bits.data(), dtype, n, out);
        });
        Result<double> a = Pass(half, h16, d, kBatch, kSeq - 3), b = Pass(wide, h32, d, kBatch, kSeq - 3);
        ASSERT_TRUE(a.ok() && b.ok()) << what << ": " << a.status().ToString() << b.status().ToString();
        EXPECT_EQ(*a, *b) << what;
        for (size_t t = 0; t < half.modules().tensors.size(); ++t) {
          EXPECT_TRUE(SameBits(h16.grad(static_cast<TensorId>(t)), h32.grad(static_cast<TensorId>(t))))
              << what << ": " << half.modules().tensors[t].name;
        }
      }
    }
  }
}

// Where there is no usable GPU the CUDA backend's passes say so, and call no hook
// (gpt_gpu_test runs the driver where there is one).
TEST(GptDriver, CudaBackendWithoutAGpuIsUnavailable) {
  if (cuda::DeviceAvailable().ok()) GTEST_SKIP() << "a GPU is present: gpt_gpu_test runs the CUDA driver";
  const Data d;
  Gpt gpu(kSpec, Backend::kCuda);
  DenseHooks dense(gpu.modules(), DType::kF32, SpecInit(kSpec));
  CheckingHooks hooks(dense, gpu.modules());
  const Status s = Pass(gpu, hooks, d).status();
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("GPT on the CUDA backend"), std::string::npos) << s.ToString();
  EXPECT_TRUE(hooks.log().empty());
  float logit = 0;
  EXPECT_EQ(gpu.CopyLogits(0, 0, &logit).code(), StatusCode::kUnavailable);
}

// CopyLogits hands out rows of the latest pass only, and says which it has.
TEST(GptDriver, CopyLogitsRefusesRowsOutsideTheLatestPass) {
  const Data d;
  Gpt gpt(kSpec);
  DenseHooks dense(gpt.modules(), DType::kF32, SpecInit(kSpec));
  std::vector<float> row(static_cast<size_t>(kSpec.vocab_size));
  EXPECT_EQ(gpt.CopyLogits(0, 1, row.data()).code(), StatusCode::kInvalidArgument) << "no pass yet";
  ASSERT_TRUE(gpt.Forward(d.tokens.data(), d.targets.data(), kBatch, kSeq, 1.0, dense).ok());
  EXPECT_TRUE(gpt.CopyLogits(kBatch * kSeq - 1, 1, row.data()).ok());
  const Status s = gpt.CopyLogits(kBatch * kSeq - 1, 2, row.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("latest pass's 32 rows"), std::string::npos) << s.ToString();
}

// The workspace is grown once and reused: a driver that ran a larger batch computes a
// smaller one as a fresh driver does, bit for bit, without growing; and so after
// switching recompute on (which drops all blocks' inner activations but one).
TEST(GptDriver, ReusesItsWorkspaceAcrossShapes) {
  const Data d;
  Gpt used(kSpec), fresh(kSpec);
  DenseHooks a(used.modules(), DType::kF32, SpecInit(kSpec)), b = a;
  ASSERT_TRUE(Pass(used, a, d).ok());
  const int64_t floats = used.activation_floats();
  auto lb = Pass(fresh, b, d, 1, 9);
  ASSERT_TRUE(lb.ok());
  EXPECT_LT(fresh.activation_floats(), floats);
  for (bool recompute : {false, true}) {
    used.set_recompute(recompute);
    a.BeginMicroBatch();
    auto la = Pass(used, a, d, 1, 9);
    ASSERT_TRUE(la.ok());
    EXPECT_EQ(*la, *lb) << "recompute " << recompute;
    for (TensorId t = 0; t < static_cast<TensorId>(used.modules().tensors.size()); ++t) {
      EXPECT_TRUE(SameBits(a.grad(t), b.grad(t)))
          << used.modules().tensors[t].name << ", recompute " << recompute;
    }
    if (!recompute) {
      EXPECT_EQ(used.activation_floats(), floats);
    }
  }
  EXPECT_LT(used.activation_floats(), floats);
}

}  // namespace
}  // namespace strata::model
