// The GPT's CUDA kernels (gpt_cuda.h) against the CPU kernels (gpt_kernels.h) on random
// inputs of shapes that fill no tile (T = 37, 65, 130; C = 48, 100, 771; V = 50257);
// skipped where there is no GPU. The attention's products run in fp32 (no TF32).
//
// Tolerances, relative to the largest |cpu| entry unless said otherwise; u = 2^-24:
//  - exact: the embeddings (the GPU does the CPU's fp32 additions in the CPU's order) and
//    the two-runs checks.
//  - LayerNorm forward 4 C u, dx 8 C u: both sides sum C terms in different orders, and a
//    recursive sum of n terms is within (n - 1) u sum|x_i| of the exact one (rstd ~0.6
//    here). dweight, dbias: 2^-20, though equal bits are expected (the CPU's operations
//    and order, no FMA): the slack is for a CPU build that contracts into FMAs.
//  - attention 16 (hs sqrt(hs) + T) u forward, 32 (..) backward: scores are hs-term dot
//    products of inputs in [-1, 1) (up to hs sqrt(hs) after scaling) whose error the
//    softmax passes on, then T-term products; the backward chains two more. dq, dk and dv
//    are compared separately.
//  - loss 1e-9 relative: both sides sum V exponentials in double (they differ by less
//    than V 2^-53 ~ 6e-12); dlogits 2^-22 of each element (doubles that close round to
//    fp32 values at most one ulp apart).
//  - GELU 1e-6, as in mlp_gpu_test.cc (tanhf against std::tanh: a few ulps).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "model/gpu_compare.h"
#include "strata/gpt_cuda.h"
#include "strata/gpt_kernels.h"
#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"
#include "strata/model.h"

namespace strata::model {
namespace {

constexpr double kU = 1.0 / (1 << 24);

class GptGpuTest : public testing::Fp32ProductsGpuTest {
 protected:
  // A parameter as the device holds it (`dtype`); `exact` becomes its fp32 value.
  const void* UploadParam(const std::vector<float>& v, DType dtype, std::vector<float>& exact) {
    exact = v;
    if (dtype == DType::kF32) return Upload(v);
    std::vector<uint16_t> bits(v.size());
    FromFloat(v.data(), static_cast<int64_t>(v.size()), dtype, bits.data());
    ToFloat(bits.data(), dtype, static_cast<int64_t>(bits.size()), exact.data());
    return Upload(bits);
  }
};

using testing::Columns;
using testing::ExpectBitwise;
using testing::ExpectClose;
using testing::Random;
using testing::RandomIds;

struct EmbeddingShape {
  int64_t batch, seq, channels, vocab;
};

TEST_F(GptGpuTest, EmbeddingMatchesCpuExactly) {
  // A GPT-2 vocabulary with few repeats, and a tiny one where every token repeats.
  for (const EmbeddingShape sh : {EmbeddingShape{3, 37, 100, 50257}, EmbeddingShape{2, 45, 48, 11}}) {
    const int64_t n = sh.batch * sh.seq, c = sh.channels, block = sh.seq + 5;
    const std::string name = "V=" + std::to_string(sh.vocab);
    const std::vector<int32_t> tokens = RandomIds(n, 1, static_cast<int32_t>(sh.vocab));
    const std::vector<float> dout = Random(n * c, 4);
    const int32_t* tokens_d = Upload(tokens);
    for (DType dtype : {DType::kF32, DType::kBf16, DType::kFp16}) {
      std::vector<float> wte, wpe, out(n * c);
      const void* wte_d = UploadParam(Random(sh.vocab * c, 2), dtype, wte);
      const void* wpe_d = UploadParam(Random(block * c, 3), dtype, wpe);
      EmbeddingForward(tokens.data(), wte.data(), wpe.data(), sh.batch, sh.seq, c, sh.vocab, out.data());
      float* out_d = Upload(std::vector<float>(n * c, 7.0f));
      ASSERT_TRUE(
          cuda::EmbeddingForward(nullptr, tokens_d, wte_d, wpe_d, dtype, sh.batch, sh.seq, c, sh.vocab, out_d)
              .ok());
      ExpectBitwise(Download(out_d, out.size()), out, name + " forward " + std::string(DTypeName(dtype)));
    }
    for (bool accumulate : {false, true}) {
      std::vector<float> dwte(sh.vocab * c, 0.5f), dwpe(block * c, 0.5f);
      float* dwte_d = Upload(dwte);
      float* dwpe_d = Upload(dwpe);
      EmbeddingBackward(tokens.data(), dout.data(), sh.batch, sh.seq, c, sh.vocab, dwte.data(), dwpe.data(),
                        accumulate, accumulate);
      ASSERT_TRUE(cuda::EmbeddingBackward(nullptr, tokens_d, Upload(dout), sh.batch, sh.seq, c, sh.vocab,
                                          dwte_d, dwpe_d, accumulate, accumulate)
                      .ok());
      ExpectBitwise(Download(dwte_d, dwte.size()), dwte, name + " dwte");
      ExpectBitwise(Download(dwpe_d, dwpe.size()), dwpe, name + " dwpe (rows >= T untouched)");
    }
  }
}

TEST_F(GptGpuTest, EmbeddingMarksIdsOutOfRange) {
  const int64_t seq = 6, c = 10, vocab = 9;
  const std::vector<int32_t> tokens = {3, -1, 5, 9, 3, 0};
  // On the CPU: token 0 and a zero gradient row where the GPU sees a bad id.
  std::vector<int32_t> fixed = tokens;
  std::vector<float> dout = Random(seq * c, 5), dout_fixed = dout;
  for (int64_t t : {1, 3}) {
    fixed[t] = 0;
    std::fill(dout_fixed.begin() + t * c, dout_fixed.begin() + (t + 1) * c, 0.0f);
  }
  const std::vector<float> wte = Random(vocab * c, 6), wpe = Random(seq * c, 7);
  std::vector<float> out(seq * c), dwte(vocab * c);
  EmbeddingForward(fixed.data(), wte.data(), wpe.data(), 1, seq, c, vocab, out.data());
  EmbeddingBackward(fixed.data(), dout_fixed.data(), 1, seq, c, vocab, dwte.data(), nullptr, false, false);
  const int32_t* tokens_d = Upload(tokens);
  float* out_d = Upload(out);
  float* dwte_d = Upload(std::vector<float>(dwte.size(), 1.0f));
  ASSERT_TRUE(cuda::EmbeddingForward(nullptr, tokens_d, Upload(wte), Upload(wpe), DType::kF32, 1, seq, c,
                                     vocab, out_d)
                  .ok());
  ASSERT_TRUE(cuda::EmbeddingBackward(nullptr, tokens_d, Upload(dout), 1, seq, c, vocab, dwte_d, nullptr,
                                      false, false)
                  .ok());
  const std::vector<float> got = Download(out_d, out.size());
  for (int64_t i = 0; i < seq * c; ++i) {
    const int64_t t = i / c;
    if (t == 1 || t == 3) {
      EXPECT_TRUE(std::isnan(got[i])) << "row " << t;
    } else {
      EXPECT_EQ(got[i], out[i]) << "row " << t;
    }
  }
  ExpectBitwise(Download(dwte_d, dwte.size()), dwte, "dwte without the bad ids");
}

TEST_F(GptGpuTest, EmbeddingBackwardIsDeterministic) {
  // 16 distinct tokens over 512 positions: long runs per vocabulary row.
  const int64_t batch = 8, seq = 64, c = 256, vocab = 50257, n = batch * seq;
  const int32_t* tokens = Upload(RandomIds(n, 8, 16));
  const float* dout = Upload(Random(n * c, 9));
  std::vector<std::vector<float>> dwte, dwpe;
  for (int run = 0; run < 2; ++run) {
    float* dwte_d = Upload(std::vector<float>(vocab * c, run + 1.0f));
    float* dwpe_d = Upload(std::vector<float>(seq * c, run + 1.0f));
    ASSERT_TRUE(
        cuda::EmbeddingBackward(nullptr, tokens, dout, batch, seq, c, vocab, dwte_d, dwpe_d, false, false)
            .ok());
    dwte.push_back(Download(dwte_d, vocab * c));
    dwpe.push_back(Download(dwpe_d, seq * c));
  }
  ExpectBitwise(dwte[1], dwte[0], "dwte, run 2 against run 1");
  ExpectBitwise(dwpe[1], dwpe[0], "dwpe, run 2 against run 1");
}

TEST_F(GptGpuTest, LayerNormMatchesCpu) {
  struct Shape {
    int64_t rows, channels;
  };
  for (const Shape sh : {Shape{37, 100}, Shape{231, 771}}) {
    const int64_t rows = sh.rows, c = sh.channels;
    const double tol = 4 * static_cast<double>(c) * kU;
    // Mean about 2 and spread 3: the centred variance matters.
    const std::vector<float> x = Random(rows * c, 11, 3.0f, 2.0f), dy = Random(rows * c, 14);
    for (DType dtype : {DType::kF32, DType::kBf16, DType::kFp16}) {
      const std::string name =
          std::to_string(rows) + "x" + std::to_string(c) + " " + std::string(DTypeName(dtype));
      std::vector<float> w, b;
      const void* w_d = UploadParam(Random(c, 12), dtype, w);
      const void* b_d = UploadParam(Random(c, 13), dtype, b);
      std::vector<float> y(rows * c), mean(rows), rstd(rows), dx(rows * c), dw(c, 0.5f), db(c, 0.5f);
      LayerNormForward(x.data(), w.data(), b.data(), rows, c, y.data(), mean.data(), rstd.data());
      LayerNormBackward(x.data(), dy.data(), w.data(), mean.data(), rstd.data(), rows, c, dx.data(),
                        dw.data(), db.data(), true);
      const float* x_d = Upload(x);
      float* y_d = Upload(std::vector<float>(y.size()));
      float* mean_d = Upload(std::vector<float>(rows));
      float* rstd_d = Upload(std::vector<float>(rows));
      ASSERT_TRUE(cuda::LayerNormForward(nullptr, x_d, w_d, b_d, dtype, rows, c, y_d, mean_d, rstd_d).ok());
      ExpectClose(Download(y_d, y.size()), y, tol, name + " y");
      ExpectClose(Download(mean_d, rows), mean, tol, name + " mean");
      ExpectClose(Download(rstd_d, rows), rstd, tol, name + " rstd");
      // The backward from the CPU's statistics, so that only the backward differs.
      const float* cpu_mean = Upload(mean);
      const float* cpu_rstd = Upload(rstd);
      float* dy_d = Upload(dy);
      float* dx_d = Upload(std::vector<float>(dx.size()));
      float* dw_d = Upload(std::vector<float>(c, 0.5f));
      float* db_d = Upload(std::vector<float>(c, 0.5f));
      ASSERT_TRUE(cuda::LayerNormBackward(nullptr, x_d, dy_d, w_d, dtype, cpu_mean, cpu_rstd, rows, c, dx_d,
                                          dw_d, db_d, true)
                      .ok());
      const std::vector<float> dx_gpu = Download(dx_d, dx.size());
      ExpectClose(dx_gpu, dx, 2 * tol, name + " dx");
      ExpectClose(Download(dw_d, c), dw, 1.0 / (1 << 20), name + " dweight");
      ExpectClose(Download(db_d, c), db, 1.0 / (1 << 20), name + " dbias");
      // In place (dx = dy): the same bits as into a separate buffer.
      ASSERT_TRUE(cuda::LayerNormBackward(nullptr, x_d, dy_d, w_d, dtype, cpu_mean, cpu_rstd, rows, c, dy_d,
                                          dw_d, db_d, false)
                      .ok());
      ExpectBitwise(Download(dy_d, dx.size()), dx_gpu, name + " dx in place");
    }
  }
}

TEST_F(GptGpuTest, LayerNormWeightGradsAreDeterministic) {
  const int64_t rows = 4103, c = 771;  // 129 pieces of 32 rows, the last one partial
  const float* x = Upload(Random(rows * c, 15, 2.0f, 1.0f));
  const float* dy = Upload(Random(rows * c, 16));
  const float* w = Upload(Random(c, 17));
  float* y = Upload(std::vector<float>(rows * c));
  float* mean = Upload(std::vector<float>(rows));
  float* rstd = Upload(std::vector<float>(rows));
  ASSERT_TRUE(
      cuda::LayerNormForward(nullptr, x, w, Upload(Random(c, 18)), DType::kF32, rows, c, y, mean, rstd).ok());
  std::vector<std::vector<float>> dw, db;
  for (int run = 0; run < 2; ++run) {
    float* dw_d = Upload(std::vector<float>(c, 3.0f));
    float* db_d = Upload(std::vector<float>(c, 3.0f));
    ASSERT_TRUE(cuda::LayerNormBackward(nullptr, x, dy, w, DType::kF32, mean, rstd, rows, c, nullptr, dw_d,
                                        db_d, false)
                    .ok());
    dw.push_back(Download(dw_d, c));
    db.push_back(Download(db_d, c));
  }
  ExpectBitwise(dw[1], dw[0], "dweight, run 2 against run 1");
  ExpectBitwise(db[1], db[0], "dbias, run 2 against run 1");
}

TEST_F(GptGpuTest, AttentionMatchesCpu) {
  struct Shape {
    int64_t batch, seq, channels, heads;
  };
  // hs = 20, 12 and 64 (GPT-2's); T past a tile of 32, 64 or 128.
  for (const Shape sh : {Shape{1, 130, 100, 5}, Shape{2, 37, 48, 4}, Shape{3, 65, 192, 3}}) {
    const int64_t b = sh.batch, t = sh.seq, c = sh.channels, nh = sh.heads, hs = c / nh;
    const std::string name =
        "B=" + std::to_string(b) + " T=" + std::to_string(t) + " hs=" + std::to_string(hs);
    const double size = static_cast<double>(hs) * std::sqrt(static_cast<double>(hs)) + static_cast<double>(t);
    const std::vector<float> qkv = Random(b * t * 3 * c, 21), dout = Random(b * t * c, 22);
    std::vector<float> out(b * t * c), att(b * nh * t * t), dqkv(qkv.size());
    AttentionForward(qkv.data(), b, t, c, nh, out.data(), att.data());
    AttentionBackward(qkv.data(), att.data(), dout.data(), b, t, c, nh, dqkv.data());
    const float* qkv_d = Upload(qkv);
    float* out_d = Upload(std::vector<float>(out.size(), 7.0f));  // every element must be written
    float* att_d = Upload(std::vector<float>(att.size(), 7.0f));
    float* dqkv_d = Upload(std::vector<float>(dqkv.size(), 7.0f));
    ASSERT_TRUE(cuda::AttentionForward(nullptr, qkv_d, b, t, c, nh, out_d, att_d).ok());
    ExpectClose(Download(att_d, att.size()), att, 16 * size * kU, name + " att");
    ExpectClose(Download(out_d, out.size()), out, 16 * size * kU, name + " out");
    // The backward from the CPU's probabilities, so that only the backward differs.
    ASSERT_TRUE(cuda::AttentionBackward(nullptr, qkv_d, Upload(att), Upload(dout), b, t, c, nh, dqkv_d).ok());
    const std::vector<float> got = Download(dqkv_d, dqkv.size());
    const char* part[] = {" dq", " dk", " dv"};
    for (int p = 0; p < 3; ++p) {
      ExpectClose(Columns(got, 3 * c, p * c, c), Columns(dqkv, 3 * c, p * c, c), 32 * size * kU,
                  name + part[p]);
    }
  }
}

TEST_F(GptGpuTest, CrossEntropyMatchesCpu) {
  struct Shape {
    int64_t rows, vocab;
  };
  for (const Shape sh : {Shape{37, 50257}, Shape{5, 7}}) {
    const int64_t rows = sh.rows, v = sh.vocab;
    const std::string name = "V=" + std::to_string(v);
    const std::vector<float> logits = Random(rows * v, 31, 4.0f);
    const std::vector<int32_t> targets = RandomIds(rows, 32, static_cast<int32_t>(v));
    const double normaliser = 2.0 * static_cast<double>(rows);
    std::vector<float> dlogits(logits.size());
    const double loss =
        CrossEntropyForwardBackward(logits.data(), targets.data(), rows, v, normaliser, dlogits.data());
    const int32_t* targets_d = Upload(targets);
    float* logits_d = Upload(logits);
    float* dlogits_d = Upload(std::vector<float>(logits.size()));
    double* row_loss = Upload(std::vector<double>(rows));
    double* loss_d = Upload(std::vector<double>(2));
    ASSERT_TRUE(cuda::CrossEntropyForwardBackward(nullptr, logits_d, targets_d, rows, v, normaliser, row_loss,
                                                  loss_d, dlogits_d)
                    .ok());
    const std::vector<double> losses = Download(loss_d, 1);
    EXPECT_NEAR(losses[0], loss, 1e-9 * std::abs(loss)) << name;
    const std::vector<float> grad = Download(dlogits_d, dlogits.size());
    for (size_t i = 0; i < grad.size(); ++i) {
      ASSERT_LE(std::abs(static_cast<double>(grad[i]) - dlogits[i]), std::abs(dlogits[i]) / (1 << 22))
          << name << " dlogits element " << i << " gpu " << grad[i] << " cpu " << dlogits[i];
    }
    // dlogits over the logits: the same bits; without dlogits: the same loss.
    ASSERT_TRUE(cuda::CrossEntropyForwardBackward(nullptr, logits_d, targets_d, rows, v, normaliser, row_loss,
                                                  loss_d + 1, logits_d)
                    .ok());
    ExpectBitwise(Download(logits_d, logits.size()), grad, name + " dlogits in place");
    ExpectBitwise(Download(loss_d, 2), std::vector<double>{losses[0], losses[0]}, name + " loss in place");
    const std::vector<double> row_before = Download(row_loss, rows);
    ASSERT_TRUE(cuda::CrossEntropyForwardBackward(nullptr, Upload(logits), targets_d, rows, v, normaliser,
                                                  row_loss, nullptr, nullptr)
                    .ok());
    ExpectBitwise(Download(row_loss, rows), row_before, name + " row losses without dlogits");
  }
}

TEST_F(GptGpuTest, CrossEntropyMarksTargetsOutOfRange) {
  const int64_t rows = 3, v = 7;
  double* row_loss = Upload(std::vector<double>(rows));
  float* dlogits = Upload(std::vector<float>(rows * v));
  ASSERT_TRUE(cuda::CrossEntropyForwardBackward(nullptr, Upload(Random(rows * v, 33)),
                                                Upload<int32_t>({1, 7, -2}), rows, v, 3.0, row_loss, nullptr,
                                                dlogits)
                  .ok());
  const std::vector<double> loss = Download(row_loss, rows);
  const std::vector<float> grad = Download(dlogits, rows * v);
  EXPECT_TRUE(std::isfinite(loss[0]));
  for (int64_t r = 1; r < rows; ++r) {
    EXPECT_TRUE(std::isnan(loss[r])) << "row " << r;
    for (int64_t j = 0; j < v; ++j) EXPECT_TRUE(std::isnan(grad[r * v + j])) << "row " << r;
  }
}

TEST_F(GptGpuTest, GeluInPlaceMatchesCpu) {
  // The MLP's GELU kernels, used in place as the GPT's backward does (dx = dy).
  const int64_t n = 3 * 37 * 4 * 100;
  const std::vector<float> x = Random(n, 41, 6.0f);
  std::vector<float> y(n), d = Random(n, 42);
  const float* x_d = Upload(x);
  float* y_d = Upload(y);
  float* d_d = Upload(d);
  GeluForward(x.data(), n, y.data());
  GeluBackward(x.data(), d.data(), n, d.data());
  ASSERT_TRUE(cuda::GeluForward(nullptr, x_d, n, y_d).ok());
  ASSERT_TRUE(cuda::GeluBackward(nullptr, x_d, d_d, n, d_d).ok());
  ExpectClose(Download(y_d, n), y, 1e-6, "gelu");
  ExpectClose(Download(d_d, n), d, 1e-6, "gelu backward in place");
}

}  // namespace
}  // namespace strata::model
