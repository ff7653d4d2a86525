// The GPT model driver (gpt.h): its declaration against the golden file's tensor order,
// its initialisation, and its passes through dense hooks against PyTorch's golden data
// (scripts/gpt_golden.py), with and without recompute, tied and untied.
#include "strata/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "model/gpt_hooks.h"
#include "model/tiny_gpt.h"
#include "zero/chain_model.h"

namespace strata::model {
namespace {

using DenseHooks = ::strata::testing::DenseHooks;
using testing::CheckingHooks;
using testing::Golden;
using testing::GoldenData;
using testing::HashTokens;
using testing::MaxAbs;
using testing::ParamLayout;
using testing::ParamTensor;
using testing::RelErr;

GptSpec GoldenSpec() {
  const testing::GptConfig& c = GoldenData().config;
  return GptSpec{c.vocab, c.block, c.layers, c.heads, c.channels, /*tied_head=*/true, /*seed=*/0};
}

// The golden file's flat parameters, by GptModel id (the same order).
::strata::testing::TensorInit GoldenInit() {
  const Golden& g = GoldenData();
  return [&g](TensorId t, int64_t begin, int64_t count, float* out) {
    const ParamTensor p = ParamLayout(g.config)[t];  // a copy: ParamLayout returns a temporary
    std::copy_n(g.params.data() + p.offset + begin, count, out);
  };
}

::strata::testing::TensorInit SpecInit(const GptSpec& spec) {
  return [spec](TensorId t, int64_t b, int64_t n, float* out) { InitGptTensor(spec, t, b, n, out); };
}

TEST(GptModel, DeclaresTheGoldenTensorOrderAndModulesInExecutionOrder) {
  const GptSpec spec = GoldenSpec();
  const ModelDecl model = GptModel(spec);
  ASSERT_TRUE(ValidateModel(model).ok()) << ValidateModel(model).ToString();
  const std::vector<ParamTensor> layout = ParamLayout(GoldenData().config);
  ASSERT_EQ(model.tensors.size(), layout.size()) << "tied: no lm_head.weight";
  for (size_t t = 0; t < layout.size(); ++t) {
    EXPECT_EQ(model.tensors[t].name, layout[t].name);
    EXPECT_EQ(model.tensors[t].numel(), layout[t].size) << layout[t].name;
  }
  EXPECT_EQ(GptParameterCount(spec), layout.back().offset + layout.back().size);
  std::vector<std::string> names;
  for (const ModuleDecl& m : model.modules) names.push_back(m.name);
  EXPECT_EQ(names, (std::vector<std::string>{"embed", "h0.attn", "h0.mlp", "h1.attn", "h1.mlp", "head"}));
  EXPECT_EQ(model.modules[0].tensors, (std::vector<TensorId>{kGptWte, kGptWpe}));
  EXPECT_EQ(model.modules[3].tensors, (std::vector<TensorId>{14, 15, 16, 17, 18, 19}));  // h1: ln1, qkv, proj
  EXPECT_EQ(model.modules[4].tensors, (std::vector<TensorId>{20, 21, 22, 23, 24, 25}));  // h1: ln2, fc, proj
  EXPECT_EQ(model.modules[5].tensors, (std::vector<TensorId>{26, 27, kGptWte})) << "the tied head reads wte";
  EXPECT_EQ(GptBlockTensorId(1, GptBlockTensor::kMlpProjWeight), 24);
  EXPECT_EQ(GptHeadModule(spec), 5);
}

TEST(GptModel, UntiedSpecDeclaresItsOwnHeadWeight) {
  GptSpec spec = GoldenSpec();
  spec.tied_head = false;
  const ModelDecl model = GptModel(spec);
  ASSERT_TRUE(ValidateModel(model).ok()) << ValidateModel(model).ToString();
  const TensorId head = GptHeadWeightId(spec);
  ASSERT_EQ(head, static_cast<TensorId>(model.tensors.size()) - 1);
  EXPECT_EQ(model.tensors[head].name, "lm_head.weight");
  EXPECT_EQ(model.tensors[head].shape, (std::vector<int64_t>{spec.vocab_size, spec.n_embd}));
  EXPECT_EQ(model.modules.back().tensors, (std::vector<TensorId>{26, 27, head}));
  EXPECT_EQ(GptParameterCount(spec), GptParameterCount(GoldenSpec()) + spec.vocab_size * spec.n_embd);
}

TEST(GptModel, ValidationNamesTheBadField) {
  const GptSpec good = GoldenSpec();
  EXPECT_TRUE(ValidateSpec(good).ok());
  auto expect_bad = [](GptSpec s, const std::string& field) {
    const Status st = ValidateSpec(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(st.message().find(field), std::string::npos) << st.ToString();
  };
  GptSpec s = good;
  s.vocab_size = 1;
  expect_bad(s, "vocab_size");
  s = good;
  s.vocab_size = int64_t{1} << 31;
  expect_bad(s, "vocab_size");
  s = good;
  s.block_size = 0;
  expect_bad(s, "block_size");
  s = good;
  s.n_layer = 0;
  expect_bad(s, "n_layer");
  s = good;
  s.n_head = 0;
  expect_bad(s, "n_head");
  s = good;
  s.n_embd = 0;
  expect_bad(s, "n_embd");
  s = good;
  s.n_head = 5;  // 32 channels
  expect_bad(s, "multiple of n_head");
}

// GPT-2's scheme; any slice equals the same range of the whole tensor.
TEST(GptInit, FollowsGpt2AndIsAPureFunctionOfTheElement) {
  const GptSpec spec{256, 64, 4, 4, 64, false, 5};
  const ModelDecl model = GptModel(spec);
  auto init = [&](const GptSpec& s, TensorId t) {
    std::vector<float> v(model.tensors[t].numel());
    InitGptTensor(s, t, 0, static_cast<int64_t>(v.size()), v.data());
    return v;
  };
  auto stddev = [](const std::vector<float>& v) {
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double(x) * x;
    const double mean = sum / v.size();
    EXPECT_LT(std::abs(mean), 0.05 * std::sqrt(sq / v.size())) << "zero mean";
    return std::sqrt(sq / v.size() - mean * mean);
  };
  // >= 16k samples each: the sample std is within 2% of the true one (5 sigma ~ 3%).
  const double residual = 0.02 / std::sqrt(2.0 * spec.n_layer);
  for (TensorId t : {kGptWte, kGptWpe, GptBlockTensorId(2, GptBlockTensor::kQkvWeight),
                     GptBlockTensorId(3, GptBlockTensor::kFcWeight), GptHeadWeightId(spec)}) {
    EXPECT_NEAR(stddev(init(spec, t)), 0.02, 0.02 * 0.04) << model.tensors[t].name;
  }
  for (auto kind : {GptBlockTensor::kAttnProjWeight, GptBlockTensor::kMlpProjWeight}) {
    const TensorId t = GptBlockTensorId(1, kind);
    EXPECT_NEAR(stddev(init(spec, t)), residual, residual * 0.04) << model.tensors[t].name;
  }
  for (auto [t, value] : {std::pair{GptBlockTensorId(0, GptBlockTensor::kLn1Weight), 1.0f},
                          {GptBlockTensorId(3, GptBlockTensor::kLn2Bias), 0.0f},
                          {GptBlockTensorId(1, GptBlockTensor::kQkvBias), 0.0f},
                          {GptBlockTensorId(2, GptBlockTensor::kMlpProjBias), 0.0f},
                          {GptLnfWeightId(spec), 1.0f},
                          {GptLnfBiasId(spec), 0.0f}}) {
    for (float x : init(spec, t)) ASSERT_EQ(x, value) << model.tensors[t].name;
  }
  const std::vector<float> whole = init(spec, kGptWte);
  std::vector<float> piece(1000);
  InitGptTensor(spec, kGptWte, 777, 1000, piece.data());
  EXPECT_TRUE(std::equal(piece.begin(), piece.end(), whole.begin() + 777));
  GptSpec other = spec;
  other.seed = 6;
  EXPECT_NE(init(other, kGptWte), whole) << "the seed matters";
  EXPECT_NE(init(spec, kGptWpe)[0], whole[0]) << "tensors draw streams of their own";
}

// Tolerances: gpt_kernels_test's, for the same reasons (fp32 against fp32 PyTorch in
// other summation orders; ~15-35x headroom over the differences seen; a tanh/erf GELU
// mix-up or a dropped term fails them). The LM head here goes through LinearForward /
// LinearBackward rather than the test model's explicit transposes: the same products.
constexpr double kLogitTol = 5e-6, kLossTol = 1e-6, kGradTol = 2e-5;

// The driver over `g`'s parameters handed out as `dtype` against `g`'s PyTorch results.
void ExpectGolden(const Golden& g, DType dtype) {
  ASSERT_FALSE(g.params.empty());
  const testing::GptConfig& c = g.config;
  Gpt gpt(GptSpec{c.vocab, c.block, c.layers, c.heads, c.channels, /*tied_head=*/true, /*seed=*/0});
  DenseHooks dense(gpt.modules(), dtype, [&g](TensorId t, int64_t begin, int64_t count, float* out) {
    const ParamTensor p = ParamLayout(g.config)[t];  // a copy: ParamLayout returns a temporary
    std::copy_n(g.params.data() + p.offset + begin, count, out);
  });
  CheckingHooks hooks(dense, gpt.modules());
  const int64_t b = g.config.batch, t = g.config.seq;
  const double n = static_cast<double>(b * t);
  auto forward = gpt.Forward(g.tokens.data(), g.targets.data(), b, t, n, hooks);
  ASSERT_TRUE(forward.ok()) << forward.status().ToString();
  std::vector<float> logits(g.logits.size());
  ASSERT_TRUE(gpt.CopyLogits(0, b * t, logits.data()).ok());
  const double logit_err = RelErr(logits.data(), g.logits.data(), static_cast<int64_t>(g.logits.size()));
  EXPECT_LT(logit_err, kLogitTol);
  EXPECT_LT(std::abs(*forward - g.loss) / g.loss, kLossTol) << *forward << " vs " << g.loss;
  EXPECT_EQ(hooks.log(), (std::vector<std::string>{"F0", "R0", "F1", "R1", "F2", "R2", "F3", "R3", "F4", "R4",
                                                   "F5", "R5"}));
  dense.BeginMicroBatch();
  auto loss = gpt.ForwardBackward(g.tokens.data(), g.targets.data(), b, t, n, hooks);
  ASSERT_TRUE(loss.ok()) << loss.status().ToString();
  EXPECT_EQ(*loss, *forward) << "the backward pass changes no forward bit";
  double worst = 0;
  const std::vector<ParamTensor> layout = ParamLayout(g.config);
  for (size_t i = 0; i < layout.size(); ++i) {
    const double err = RelErr(dense.grad(static_cast<TensorId>(i)).data(), g.grads.data() + layout[i].offset,
                              layout[i].size);
    EXPECT_LT(err, kGradTol) << layout[i].name;  // NaN (left unwritten) fails too
    worst = std::max(worst, err);
  }
  std::printf("%s: logits rel err %.2e, loss %.7f vs %.7f, worst gradient rel err %.2e\n",
              std::string(DTypeName(dtype)).c_str(), logit_err, *loss, static_cast<double>(g.loss), worst);
}

TEST(GptDriver, ReproducesPyTorchGoldenLossLogitsAndEveryGradient) {
  ExpectGolden(GoldenData(), DType::kF32);
}

// bf16 parameters: PyTorch ran the same model with its parameters rounded to bf16 and
// everything else fp32 (scripts/gpt_golden.py --bf16), which is what the driver computes
// from 16-bit weights (gpt.h). Its weights are exact in bf16, so DenseHooks' rounding of
// the masters keeps them; the tolerances are the fp32 ones.
TEST(GptDriver, ReproducesPyTorchGoldenWithBf16Parameters) {
  testing::Golden g;
  const std::string error = testing::ReadGolden(STRATA_TEST_DATA_DIR "/gpt_golden_bf16.bin", &g);
  ASSERT_TRUE(error.empty()) << error;
  ASSERT_NE(g.loss, GoldenData().loss) << "the rounded weights give another loss";
  ExpectGolden(g, DType::kBf16);
}

struct Pass {
  double loss = 0;
  std::vector<std::vector<float>> grads;  // by tensor id
  std::vector<std::string> log;
  int64_t activation_floats = 0;
};

Pass RunPass(const GptSpec& spec, bool recompute, const std::vector<int32_t>& tokens,
             const std::vector<int32_t>& targets, int64_t batch, int64_t seq) {
  Gpt gpt(spec);
  gpt.set_recompute(recompute);
  DenseHooks dense(gpt.modules(), DType::kF32, SpecInit(spec));
  CheckingHooks hooks(dense, gpt.modules());
  Pass pass;
  auto loss = gpt.ForwardBackward(tokens.data(), targets.data(), batch, seq, double(batch * seq), hooks);
  EXPECT_TRUE(loss.ok()) << loss.status().ToString();
  pass.loss = loss.ok() ? *loss : NAN;
  for (size_t t = 0; t < gpt.modules().tensors.size(); ++t) {
    pass.grads.push_back(dense.grad(static_cast<TensorId>(t)));
  }
  pass.log = hooks.log();
  pass.activation_floats = gpt.activation_floats();
  return pass;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The calls of one ForwardBackward by the contract of gpt.h.
std::vector<std::string> ExpectedCalls(int64_t layers, bool recompute) {
  std::vector<std::string> log;
  auto add = [&](char a, char b, int m) {
    log.push_back(a + std::to_string(m));
    log.push_back(b + std::to_string(m));
  };
  const int head = static_cast<int>(1 + 2 * layers);
  for (int m = 0; m <= head; ++m) add('F', 'R', m);
  add('B', 'E', head);
  for (int64_t l = layers - 1; l >= 0; --l) {
    if (recompute) add('F', 'R', GptAttnModule(l)), add('F', 'R', GptMlpModule(l));
    add('B', 'E', GptMlpModule(l));
    add('B', 'E', GptAttnModule(l));
  }
  add('B', 'E', 0);
  return log;
}

// Recompute runs each block's forward again through the hooks before its backward and
// changes no bit of the loss or of any gradient, tied and untied, with a sequence shorter
// than the block size (wpe's unused rows then get zero gradient, not stale values).
TEST(GptDriver, RecomputeChangesNoBitAndRefetchesEachBlock) {
  for (bool tied : {true, false}) {
    const GptSpec spec{64, 24, 3, 4, 32, tied, 9};
    const int64_t batch = 3, seq = 20;
    const std::vector<int32_t> tokens = HashTokens(batch * seq, 1, 1, 64),
                               targets = HashTokens(batch * seq, 1, 2, 64);
    const Pass plain = RunPass(spec, false, tokens, targets, batch, seq);
    const Pass recomputed = RunPass(spec, true, tokens, targets, batch, seq);
    EXPECT_EQ(plain.log, ExpectedCalls(spec.n_layer, false));
    EXPECT_EQ(recomputed.log, ExpectedCalls(spec.n_layer, true));
    EXPECT_EQ(plain.loss, recomputed.loss) << "tied " << tied;
    for (size_t t = 0; t < plain.grads.size(); ++t) {
      EXPECT_TRUE(SameBits(plain.grads[t], recomputed.grads[t])) << "tensor " << t << ", tied " << tied;
    }
    const std::vector<float>& dwpe = plain.grads[kGptWpe];
    for (int64_t i = seq * spec.n_embd; i < spec.block_size * spec.n_embd; ++i) {
      ASSERT_EQ(dwpe[i], 0.0f) << "wpe row " << i / spec.n_embd << " is past the sequence";
    }
    EXPECT_LT(recomputed.activation_floats, plain.activation_floats * 3 / 4)
        << "recompute keeps one block's inner activations, not three";
  }
}

// Tied, wte's gradient is the head's use plus the embedding's: exactly the untied model's
// two gradients added once (the embedding adds its sum to the head's, one rounding), when
// lm_head.weight holds wte's values. Every other gradient is the same bit for bit.
TEST(GptDriver, TiedWeightGradientIsTheSumOfBothUses) {
  const GptSpec tied = GoldenSpec();
  GptSpec untied = tied;
  untied.tied_head = false;
  const Golden& g = GoldenData();
  Gpt a(tied), b(untied);
  DenseHooks ha(a.modules(), DType::kF32, GoldenInit());
  DenseHooks hb(b.modules(), DType::kF32, [&](TensorId t, int64_t begin, int64_t n, float* out) {
    GoldenInit()(t == GptHeadWeightId(untied) ? kGptWte : t, begin, n, out);
  });
  const int64_t bs = g.config.batch, seq = g.config.seq;
  auto la = a.ForwardBackward(g.tokens.data(), g.targets.data(), bs, seq, double(bs * seq), ha);
  auto lb = b.ForwardBackward(g.tokens.data(), g.targets.data(), bs, seq, double(bs * seq), hb);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_EQ(*la, *lb);
  const std::vector<float>& head = hb.grad(GptHeadWeightId(untied));
  const std::vector<float>& embed = hb.grad(kGptWte);
  int unused_rows = 0;
  for (size_t i = 0; i < head.size(); ++i) {
    ASSERT_EQ(ha.grad(kGptWte)[i], head[i] + embed[i]) << "element " << i;
    if (i % tied.n_embd == 0 && embed[i] == 0 && head[i] != 0) ++unused_rows;
  }
  EXPECT_GT(unused_rows, 0) << "the batch leaves some tokens out: only the head reaches their rows";
  for (TensorId t = 1; t < static_cast<TensorId>(a.modules().tensors.size()); ++t) {
    EXPECT_TRUE(SameBits(ha.grad(t), hb.grad(t))) << a.modules().tensors[t].name;
  }
}

}  // namespace
}  // namespace strata::model
