// The GPT kernels: a tiny GPT built from them against PyTorch's golden data
// (scripts/gpt_golden.py), each backward against finite differences of its forward,
// bit-identical results for any thread count, and the accumulate flags.
#include "strata/gpt_kernels.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "model/tiny_gpt.h"
#include "strata/mlp_kernels.h"
#include "strata/model.h"

namespace strata::model {
namespace {

using testing::Golden;
using testing::GoldenData;
using testing::MaxAbs;
using testing::ParamLayout;
using testing::ParamTensor;
using testing::RelErr;
using testing::TinyGpt;

std::vector<float> Random(int64_t n, uint64_t stream, float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = offset + scale * HashUniform(4321, stream, i);
  return v;
}

std::vector<int32_t> RandomIds(int64_t n, uint64_t stream, int32_t limit) {
  std::vector<int32_t> v(n);
  for (int64_t i = 0; i < n; ++i) {
    v[i] = std::min<int32_t>(limit - 1,
                             static_cast<int32_t>((HashUniform(4321, stream, i) + 1.0f) * 0.5f * limit));
  }
  return v;
}

double Dot(const std::vector<float>& r, const std::vector<float>& y) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += static_cast<double>(r[i]) * y[i];
  return s;
}

// Compares grad (d loss / d x) with central differences of loss() at about `checks`
// evenly spaced elements of x. The step is the difference of the two fp32 inputs actually
// evaluated, so rounding of x +- h costs nothing.
void ExpectFiniteDifferences(const char* what, std::vector<float>& x, const std::vector<float>& grad,
                             const std::function<double()>& loss, double tol, int64_t checks = 1 << 30) {
  const int64_t n = static_cast<int64_t>(x.size()), stride = std::max<int64_t>(1, n / checks);
  const float h = 1e-2f;
  double err = 0;
  for (int64_t i = 0; i < n; i += stride) {
    const float saved = x[i];
    x[i] = saved + h;
    const double up = loss();
    const float x_up = x[i];
    x[i] = saved - h;
    const double down = loss();
    const float x_down = x[i];
    x[i] = saved;
    err = std::max(err, std::abs((up - down) / (x_up - x_down) - grad[i]));
  }
  EXPECT_LT(err / MaxAbs(grad.data(), n), tol) << what;
}

// Runs fn with `threads` oneTBB threads: 1 through global_control as a process would, 0
// for the default (this machine's cores), more through an arena of that size.
template <class F>
void RunWithThreads(int threads, F&& fn) {
  if (threads == 0) {
    fn();
  } else if (threads == 1) {
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    fn();
  } else {
    tbb::global_control allow(tbb::global_control::max_allowed_parallelism, threads);
    tbb::task_arena arena(threads);
    arena.execute(fn);
  }
}

struct GptRun {
  double loss = 0;
  std::vector<float> logits, grads;
};

GptRun RunGolden() {
  const Golden& g = GoldenData();
  TinyGpt model(g.config, g.params.data());
  GptRun run;
  // NaN everywhere: a gradient the backward forgot to write fails every comparison.
  run.grads.assign(g.grads.size(), std::nanf(""));
  run.loss = model.ForwardBackward(g.tokens.data(), g.targets.data(), run.grads.data());
  run.logits = model.logits();
  return run;
}

// Tolerances: the golden data is PyTorch in fp32, so both sides carry fp32 rounding
// (2^-24 ~ 6e-8 per operation) in different summation orders (torch's GEMM blocking and
// LayerNorm reductions are not ours). Through ~20 dependent ops with sums of <= 128 terms
// the differences seen here are 3e-7 of the largest logit and <= 6e-7 of the largest
// gradient of each tensor; the bounds leave ~15x and ~35x headroom (other machines round
// differently: no FMA without AVX2) and still fail the smallest plausible bug, erf
// instead of tanh GELU (1.3e-4 of the logits, 2e-4 of a gradient); a missing term or
// scale gives O(1).
constexpr double kLogitTol = 5e-6, kLossTol = 1e-6, kGradTol = 2e-5;

TEST(GptGolden, ReproducesPyTorchLogitsLossAndEveryGradient) {
  const Golden& g = GoldenData();
  ASSERT_FALSE(g.params.empty());
  const GptRun run = RunGolden();
  const double logit_err = RelErr(run.logits.data(), g.logits.data(), static_cast<int64_t>(g.logits.size()));
  EXPECT_LT(logit_err, kLogitTol);
  EXPECT_LT(std::abs(run.loss - g.loss) / g.loss, kLossTol) << run.loss << " vs " << g.loss;
  double worst = 0;
  for (const ParamTensor& t : ParamLayout(g.config)) {
    const double err = RelErr(run.grads.data() + t.offset, g.grads.data() + t.offset, t.size);
    EXPECT_LT(err, kGradTol) << t.name;  // NaN (unwritten) fails too
    worst = std::max(worst, err);
  }
  std::printf("logits rel err %.2e, loss %.7f vs %.7f, worst gradient rel err %.2e\n", logit_err, run.loss,
              static_cast<double>(g.loss), worst);
}

TEST(GptGolden, ThreadCountChangesNoBit) {
  GptRun one;
  RunWithThreads(1, [&] { one = RunGolden(); });
  for (int threads : {0, 3, 8}) {
    GptRun many;
    RunWithThreads(threads, [&] { many = RunGolden(); });
    EXPECT_EQ(one.loss, many.loss) << threads;
    EXPECT_EQ(0, std::memcmp(one.logits.data(), many.logits.data(), one.logits.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(one.grads.data(), many.grads.data(), one.grads.size() * sizeof(float)));
  }
}

// Finite differences of fp32 forwards, h = 1e-2 on O(1) inputs: the truncation error
// ~h^2 |f'''| / 6 and the loss's fp32 rounding divided by 2h give 3e-7 (linear embedding)
// to 3e-5 (LayerNorm dx, attention) of the largest gradient here. 1e-3 leaves >= 30x
// headroom; the bugs tried (a dropped term or scale, a wrong block edge) give 6e-2 to 2.
constexpr double kFdTol = 1e-3;

TEST(GptKernels, EmbeddingBackwardMatchesFiniteDifferences) {
  const int64_t b = 2, t = 5, c = 4, v = 6, block = 7;
  const std::vector<int32_t> tokens = {0, 3, 3, 5, 1, 3, 0, 2, 5, 3};  // repeats, token 4 unused
  std::vector<float> wte = Random(v * c, 1), wpe = Random(block * c, 2);
  const std::vector<float> r = Random(b * t * c, 3);
  std::vector<float> dwte(v * c, 9.0f), dwpe(block * c, 42.0f);
  EmbeddingBackward(tokens.data(), r.data(), b, t, c, v, dwte.data(), dwpe.data(), false, false);
  for (int64_t i = t * c; i < block * c; ++i) ASSERT_EQ(dwpe[i], 42.0f) << "rows past T must stay";
  for (int64_t i = 4 * c; i < 5 * c; ++i) ASSERT_EQ(dwte[i], 0.0f) << "an unused token's row is zeroed";
  auto loss = [&] {
    std::vector<float> out(b * t * c);
    EmbeddingForward(tokens.data(), wte.data(), wpe.data(), b, t, c, v, out.data());
    return Dot(r, out);
  };
  ExpectFiniteDifferences("dwte", wte, dwte, loss, kFdTol);
  dwpe.resize(t * c);  // rows past T do not reach the output
  wpe.resize(t * c);
  ExpectFiniteDifferences("dwpe", wpe, dwpe, loss, kFdTol);
}

TEST(GptKernels, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 37, c = 10;  // 37 rows: two weight-gradient pieces, the last partial
  std::vector<float> x = Random(rows * c, 4, 2.0f, 0.5f), w = Random(c, 5, 0.3f, 1.0f), bias = Random(c, 6);
  const std::vector<float> r = Random(rows * c, 7);
  std::vector<float> y(rows * c), mean(rows), rstd(rows), dx(rows * c), dw(c), db(c);
  LayerNormForward(x.data(), w.data(), bias.data(), rows, c, y.data(), mean.data(), rstd.data());
  LayerNormBackward(x.data(), r.data(), w.data(), mean.data(), rstd.data(), rows, c, dx.data(), dw.data(),
                    db.data(), false);
  auto loss = [&] {
    LayerNormForward(x.data(), w.data(), bias.data(), rows, c, y.data(), mean.data(), rstd.data());
    return Dot(r, y);
  };
  ExpectFiniteDifferences("dx", x, dx, loss, kFdTol);
  ExpectFiniteDifferences("dweight", w, dw, loss, kFdTol);
  ExpectFiniteDifferences("dbias", bias, db, loss, kFdTol);
  // dx may alias dy.
  std::vector<float> in_place = r, dw2(c), db2(c);
  LayerNormForward(x.data(), w.data(), bias.data(), rows, c, y.data(), mean.data(), rstd.data());
  LayerNormBackward(x.data(), in_place.data(), w.data(), mean.data(), rstd.data(), rows, c, in_place.data(),
                    dw2.data(), db2.data(), false);
  EXPECT_EQ(in_place, dx);
  EXPECT_EQ(dw2, dw);
}

// Double-precision causal attention, the formula of gpt_kernels.h written out.
std::vector<double> RefAttention(const std::vector<float>& qkv, int64_t b, int64_t t, int64_t c, int64_t nh) {
  const int64_t hs = c / nh;
  std::vector<double> out(b * t * c, 0.0);
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t i = 0; i < t; ++i) {
        std::vector<double> p(i + 1);
        double max = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < hs; ++e)
            d += static_cast<double>(qkv[(s * t + i) * 3 * c + h * hs + e]) *
                 qkv[(s * t + j) * 3 * c + c + h * hs + e];
          p[j] = d / std::sqrt(static_cast<double>(hs));
          max = std::max(max, p[j]);
        }
        for (double& e : p) sum += (e = std::exp(e - max));
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t e = 0; e < hs; ++e)
            out[(s * t + i) * c + h * hs + e] += p[j] / sum * qkv[(s * t + j) * 3 * c + 2 * c + h * hs + e];
        }
      }
    }
  }
  return out;
}

void CheckAttention(int64_t b, int64_t t, int64_t c, int64_t nh, int64_t checks) {
  std::vector<float> qkv = Random(b * t * 3 * c, 8, 1.5f);
  const std::vector<float> r = Random(b * t * c, 9);
  std::vector<float> out(b * t * c), att(b * nh * t * t), dqkv(b * t * 3 * c);
  AttentionForward(qkv.data(), b, t, c, nh, out.data(), att.data());
  // Forward against double precision: fp32 sums of <= t terms of O(1), so ~1e-6.
  const std::vector<double> ref = RefAttention(qkv, b, t, c, nh);
  std::vector<float> ref_f(ref.begin(), ref.end());
  EXPECT_LT(RelErr(out.data(), ref_f.data(), b * t * c), 1e-5) << "forward, T = " << t;
  for (int64_t row = 0; row < b * nh * t; ++row) {
    const int64_t i = row % t;
    for (int64_t j = i + 1; j < t; ++j) ASSERT_EQ(att[row * t + j], 0.0f) << "masked probabilities are 0";
  }
  AttentionBackward(qkv.data(), att.data(), r.data(), b, t, c, nh, dqkv.data());
  auto loss = [&] {
    AttentionForward(qkv.data(), b, t, c, nh, out.data(), att.data());
    return Dot(r, out);
  };
  ExpectFiniteDifferences(("dqkv, T = " + std::to_string(t)).c_str(), qkv, dqkv, loss, kFdTol, checks);
}

TEST(GptKernels, AttentionMatchesReferenceAndFiniteDifferences) {
  CheckAttention(2, 5, 8, 2, 1 << 30);  // every element
  CheckAttention(1, 70, 8, 2, 300);     // T past one 64-row block: the block edges
}

TEST(GptKernels, CrossEntropyMatchesReferenceAndFiniteDifferences) {
  const int64_t rows = 5, v = 7;
  const double normaliser = 8;  // not the row count: a split batch's share of a larger one
  std::vector<float> logits = Random(rows * v, 10, 3.0f);
  const std::vector<int32_t> targets = RandomIds(rows, 11, v);
  std::vector<float> dlogits(rows * v);
  const double loss =
      CrossEntropyForwardBackward(logits.data(), targets.data(), rows, v, normaliser, dlogits.data());
  double ref = 0;
  for (int64_t i = 0; i < rows; ++i) {
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(logits[i * v + j]));
    ref += (std::log(sum) - logits[i * v + targets[i]]) / normaliser;
  }
  EXPECT_NEAR(loss, ref, 1e-12 * std::abs(ref) + 1e-15);  // both in double but exp/log order
  auto f = [&] {
    return CrossEntropyForwardBackward(logits.data(), targets.data(), rows, v, normaliser, nullptr);
  };
  ExpectFiniteDifferences("dlogits", logits, dlogits, f, kFdTol);
  // In place: the same bits as a separate buffer.
  std::vector<float> in_place = logits;
  EXPECT_EQ(loss, CrossEntropyForwardBackward(in_place.data(), targets.data(), rows, v, normaliser,
                                              in_place.data()));
  EXPECT_EQ(in_place, dlogits);
}

TEST(GptKernels, KernelsAreBitIdenticalForAnyThreadCount) {
  // Sizes that split into many oneTBB pieces: 300 LayerNorm rows (10 gradient pieces),
  // 3 x 130 attention rows (3 blocks per head), 100 x 300 logits.
  const int64_t b = 3, t = 130, c = 24, nh = 3, v = 50, n = b * t;
  const std::vector<int32_t> tokens = RandomIds(n, 12, v), targets = RandomIds(n, 13, 300);
  const std::vector<float> wte = Random(v * c, 14), wpe = Random(t * c, 15), w = Random(c, 16, 0.3f, 1.0f),
                           bias = Random(c, 17), qkv = Random(n * 3 * c, 18), dout = Random(n * c, 19),
                           logits = Random(100 * 300, 20, 4.0f);
  auto run = [&] {
    std::vector<float> emb(n * c), dwte(v * c), dwpe(t * c), y(n * c), mean(n), rstd(n), dx(n * c), dw(c),
        db(c), out(n * c), att(b * nh * t * t), dqkv(n * 3 * c), dlogits(100 * 300);
    EmbeddingForward(tokens.data(), wte.data(), wpe.data(), b, t, c, v, emb.data());
    EmbeddingBackward(tokens.data(), dout.data(), b, t, c, v, dwte.data(), dwpe.data(), false, false);
    LayerNormForward(emb.data(), w.data(), bias.data(), n, c, y.data(), mean.data(), rstd.data());
    LayerNormBackward(emb.data(), dout.data(), w.data(), mean.data(), rstd.data(), n, c, dx.data(), dw.data(),
                      db.data(), false);
    AttentionForward(qkv.data(), b, t, c, nh, out.data(), att.data());
    AttentionBackward(qkv.data(), att.data(), dout.data(), b, t, c, nh, dqkv.data());
    const double loss =
        CrossEntropyForwardBackward(logits.data(), targets.data(), 100, 300, 100, dlogits.data());
    std::vector<float> all = {static_cast<float>(loss)};
    for (const auto* part :
         {&emb, &dwte, &dwpe, &y, &mean, &rstd, &dx, &dw, &db, &out, &att, &dqkv, &dlogits})
      all.insert(all.end(), part->begin(), part->end());
    return all;
  };
  std::vector<float> one;
  RunWithThreads(1, [&] { one = run(); });
  for (int threads : {0, 3, 8}) {
    std::vector<float> many;
    RunWithThreads(threads, [&] { many = run(); });
    ASSERT_EQ(one.size(), many.size());
    EXPECT_EQ(0, std::memcmp(one.data(), many.data(), one.size() * sizeof(float))) << threads << " threads";
  }
}

TEST(GptKernels, AccumulateAddsToTheOldGradient) {
  const int64_t b = 2, t = 40, c = 12, v = 9, n = b * t;
  const std::vector<int32_t> tokens = RandomIds(n, 21, v);
  const std::vector<float> dout = Random(n * c, 22), x = Random(n * c, 23, 2.0f),
                           w = Random(c, 24, 0.3f, 1.0f), bias = Random(c, 25), old_wte = Random(v * c, 26),
                           old_wpe = Random(t * c, 27), old_w = Random(c, 28), old_b = Random(c, 29);
  std::vector<float> fresh_wte(v * c), fresh_wpe(t * c);
  EmbeddingBackward(tokens.data(), dout.data(), b, t, c, v, fresh_wte.data(), fresh_wpe.data(), false, false);
  // g = g_old + sum exactly: the sum is formed first and added once.
  auto sum = [](const std::vector<float>& a, const std::vector<float>& s) {
    std::vector<float> out(a.size());
    for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + s[i];
    return out;
  };
  for (const auto& [acc_wte, acc_wpe] : {std::pair{true, false}, std::pair{false, true}}) {
    std::vector<float> wte_g = old_wte, wpe_g = old_wpe;
    EmbeddingBackward(tokens.data(), dout.data(), b, t, c, v, wte_g.data(), wpe_g.data(), acc_wte, acc_wpe);
    EXPECT_EQ(wte_g, acc_wte ? sum(old_wte, fresh_wte) : fresh_wte);
    EXPECT_EQ(wpe_g, acc_wpe ? sum(old_wpe, fresh_wpe) : fresh_wpe);
  }
  std::vector<float> y(n * c), mean(n), rstd(n), dx(n * c), fresh_w(c), fresh_b(c);
  LayerNormForward(x.data(), w.data(), bias.data(), n, c, y.data(), mean.data(), rstd.data());
  LayerNormBackward(x.data(), dout.data(), w.data(), mean.data(), rstd.data(), n, c, dx.data(),
                    fresh_w.data(), fresh_b.data(), false);
  std::vector<float> dx2(n * c, 7.0f), dw = old_w, db = old_b;
  LayerNormBackward(x.data(), dout.data(), w.data(), mean.data(), rstd.data(), n, c, dx2.data(), dw.data(),
                    db.data(), true);
  EXPECT_EQ(dw, sum(old_w, fresh_w));
  EXPECT_EQ(db, sum(old_b, fresh_b));
  EXPECT_EQ(dx2, dx) << "dx is overwritten, not accumulated";
}

}  // namespace
}  // namespace strata::model
