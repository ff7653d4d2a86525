// CPU kernels of the MLP: Linear (on Gemm), GELU, losses, 16-bit conversion.
#include <tbb/blocked_range.h>
#include <tbb/blocked_range2d.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/vector_tanh.h"
#include "strata/half.h"
#include "strata/mlp_kernels.h"

namespace strata::model {

namespace {

constexpr int64_t kGrain = 1 << 14;

// Per-thread scratch, grown on demand and reused: first touch of fresh memory is slow. The
// Linear kernels run their parallel loops isolated (this_task_arena::isolate), so a thread
// waiting inside them never picks up another kernel call that would reuse its scratch.
struct Scratch {
  std::vector<float> a, b, c;
};
Scratch& LocalScratch() {
  thread_local Scratch scratch;
  return scratch;
}
float* Grow(std::vector<float>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

inline float Load(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(p)[i];
    case DType::kBf16: return Bf16ToFloat(static_cast<const Bf16*>(p)[i]);
    case DType::kFp16: return Fp16ToFloat(static_cast<const Fp16*>(p)[i]);
  }
  return 0.0f;
}

inline float Widen(float v) { return v; }
inline float Widen(Bf16 v) { return Bf16ToFloat(v); }
inline float Widen(Fp16 v) { return Fp16ToFloat(v); }

// One 32 x 32 block (or the edge's part of one) of TransposeToFloat, its element type
// fixed so that the loop is a plain strided copy.
template <typename T>
void TransposeBlock(const T* src, int64_t rows, int64_t cols, int64_t i0, int64_t i1, int64_t j0, int64_t j1,
                    float* dst) {
  for (int64_t j = j0; j < j1; ++j) {
    float* out = dst + j * rows;
    for (int64_t i = i0; i < i1; ++i) out[i] = Widen(src[i * cols + j]);
  }
}

// dst [cols, rows] = transpose of src [rows, cols], converted to fp32; 32 x 32 blocks.
void TransposeToFloat(const void* src, DType dtype, int64_t rows, int64_t cols, float* dst) {
  tbb::parallel_for(tbb::blocked_range2d<int64_t>(0, rows, 32, 0, cols, 32),
                    [&](const tbb::blocked_range2d<int64_t>& r) {
                      for (int64_t i0 = r.rows().begin(); i0 < r.rows().end(); i0 += 32) {
                        const int64_t i1 = std::min(i0 + 32, r.rows().end());
                        for (int64_t j0 = r.cols().begin(); j0 < r.cols().end(); j0 += 32) {
                          const int64_t j1 = std::min(j0 + 32, r.cols().end());
                          switch (dtype) {
                            case DType::kF32:
                              TransposeBlock(static_cast<const float*>(src), rows, cols, i0, i1, j0, j1, dst);
                              break;
                            case DType::kBf16:
                              TransposeBlock(static_cast<const Bf16*>(src), rows, cols, i0, i1, j0, j1, dst);
                              break;
                            case DType::kFp16:
                              TransposeBlock(static_cast<const Fp16*>(src), rows, cols, i0, i1, j0, j1, dst);
                              break;
                          }
                        }
                      }
                    });
}

// The weight as fp32 [out, in]: the caller's pointer when it already is, else a converted copy.
const float* WeightAsFloat(const void* weight, DType dtype, int64_t n, std::vector<float>& scratch) {
  if (dtype == DType::kF32) return static_cast<const float*>(weight);
  float* w = Grow(scratch, n);
  ToFloat(weight, dtype, n, w);
  return w;
}

}  // namespace

void ToFloat(const void* src, DType dtype, int64_t n, float* dst) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t i = r.begin(); i < r.end(); ++i) dst[i] = Load(src, dtype, i);
  });
}

void FromFloat(const float* src, int64_t n, DType dtype, void* dst) {
  STRATA_CHECK(dtype != DType::kF32);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain), [&](const tbb::blocked_range<int64_t>& r) {
    if (dtype == DType::kBf16) {
      auto* out = static_cast<Bf16*>(dst);
      for (int64_t i = r.begin(); i < r.end(); ++i) out[i] = FloatToBf16(src[i]);
    } else {
      auto* out = static_cast<Fp16*>(dst);
      for (int64_t i = r.begin(); i < r.end(); ++i) out[i] = FloatToFp16(src[i]);
    }
  });
}

// Two equivalent forms, picked by shape only: both accumulate y[b, o] as an FMA chain over
// ascending i starting from 0 (FMA is symmetric in its factors), then add the bias, so the
// choice does not change a single bit; it only avoids transposing the larger operand.
void LinearForward(const float* x, int64_t batch, int64_t in, int64_t out, const void* weight,
                   const void* bias, DType dtype, float* y) {
  STRATA_CHECK(x != nullptr && weight != nullptr && bias != nullptr && y != nullptr);
  tbb::this_task_arena::isolate([&] {
    Scratch& s = LocalScratch();
    if (batch < out) {
      // y^T [out, batch] = W [out, in] x^T [in, batch].
      const float* w = WeightAsFloat(weight, dtype, out * in, s.a);
      float* xt = Grow(s.b, in * batch + out * batch);
      float* yt = xt + in * batch;
      TransposeToFloat(x, DType::kF32, batch, in, xt);
      Gemm(out, batch, in, w, in, xt, batch, yt, batch, false);
      const float* bf = WeightAsFloat(bias, dtype, out, s.c);
      // y = yt^T + bias in blocks of outputs, so that the lines of yt a block reads stay
      // in cache from one sample to the next.
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, batch, 16), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t o0 = 0; o0 < out; o0 += 64) {
          const int64_t o1 = std::min(out, o0 + 64);
          for (int64_t b = r.begin(); b < r.end(); ++b) {
            for (int64_t o = o0; o < o1; ++o) y[b * out + o] = yt[o * batch + b] + bf[o];
          }
        }
      });
    } else {
      float* wt = Grow(s.a, in * out);
      TransposeToFloat(weight, dtype, out, in, wt);
      Gemm(batch, out, in, x, in, wt, out, y, out, false);
      tbb::parallel_for(tbb::blocked_range<int64_t>(0, batch, 16), [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t b = r.begin(); b < r.end(); ++b) {
          for (int64_t o = 0; o < out; ++o) y[b * out + o] += Load(bias, dtype, o);
        }
      });
    }
  });
}

void LinearBackward(const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                    const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                    bool accumulate) {
  STRATA_CHECK(x != nullptr && dy != nullptr && dweight != nullptr && dbias != nullptr);
  tbb::this_task_arena::isolate([&] {
    Scratch& s = LocalScratch();
    if (dx != nullptr) {
      STRATA_CHECK(weight != nullptr);
      const float* w = WeightAsFloat(weight, dtype, out * in, s.a);
      Gemm(batch, in, out, dy, out, w, in, dx, in, false);
    }
    // dW [out, in] = dy^T [out, batch] x [batch, in]: a sum over the batch in sample order.
    float* dyt = Grow(s.b, out * batch);
    TransposeToFloat(dy, DType::kF32, batch, out, dyt);
    Gemm(out, in, batch, dyt, batch, x, in, dweight, in, accumulate);
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, out, 256), [&](const tbb::blocked_range<int64_t>& r) {
      for (int64_t o = r.begin(); o < r.end(); ++o) {
        float acc = 0.0f;
        for (int64_t b = 0; b < batch; ++b) acc += dyt[o * batch + b];
        dbias[o] = accumulate ? dbias[o] + acc : acc;
      }
    });
  });
}

namespace {
constexpr float kGeluK0 = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluK1 = 0.044715f;
}  // namespace

namespace {

// GELU's tanh argument sqrt(2 / pi) (v + 0.044715 v^3).
inline float GeluArg(float v) { return kGeluK0 * (v + kGeluK1 * v * v * v); }

// Runs body(x_i, tanh(arg_i), i) over [begin, end): tanh one value at a time, or a block's
// arguments at once through the vector tanh (in a stack buffer that stays in cache).
template <class Body>
void ForGeluTanh(const float* x, int64_t begin, int64_t end, GeluTanh tanh, Body body) {
  if (tanh == GeluTanh::kScalar) {
    for (int64_t i = begin; i < end; ++i) body(x[i], std::tanh(GeluArg(x[i])), i);
    return;
  }
  constexpr int64_t kBlock = 1024;
  float t[kBlock];
  for (int64_t b = begin; b < end; b += kBlock) {
    const int64_t m = std::min(kBlock, end - b);
    for (int64_t i = 0; i < m; ++i) t[i] = GeluArg(x[b + i]);
    TanhInPlace(t, m);
    for (int64_t i = 0; i < m; ++i) body(x[b + i], t[i], b + i);
  }
}

}  // namespace

void GeluForward(const float* x, int64_t n, float* y, GeluTanh tanh) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain), [&](const tbb::blocked_range<int64_t>& r) {
    ForGeluTanh(x, r.begin(), r.end(), tanh,
                [&](float v, float t, int64_t i) { y[i] = 0.5f * v * (1.0f + t); });
  });
}

void GeluBackward(const float* x, const float* dy, int64_t n, float* dx, GeluTanh tanh) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain), [&](const tbb::blocked_range<int64_t>& r) {
    ForGeluTanh(x, r.begin(), r.end(), tanh, [&](float v, float t, int64_t i) {
      const float d =
          0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluK0 * (1.0f + 3.0f * kGeluK1 * v * v);
      dx[i] = dy[i] * d;
    });
  });
}

double LossForwardBackward(LossKind kind, const float* y, const float* targets, const int32_t* labels,
                           int64_t batch, int64_t out, double normaliser, float* dy) {
  STRATA_CHECK(y != nullptr && normaliser > 0);
  STRATA_CHECK(kind == LossKind::kMse ? targets != nullptr : labels != nullptr);
  thread_local std::vector<double> per_sample_buffer;
  std::vector<double>& per_sample = per_sample_buffer;  // the caller's, not a worker's
  per_sample.resize(static_cast<size_t>(batch));
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, batch, 16), [&](const tbb::blocked_range<int64_t>& r) {
    for (int64_t b = r.begin(); b < r.end(); ++b) {
      const float* yb = y + b * out;
      double loss = 0.0;
      if (kind == LossKind::kMse) {
        const float* tb = targets + b * out;
        const float scale = static_cast<float>(2.0 / (normaliser * static_cast<double>(out)));
        for (int64_t j = 0; j < out; ++j) {
          const float d = yb[j] - tb[j];
          loss += static_cast<double>(d) * d;
          if (dy != nullptr) dy[b * out + j] = scale * d;
        }
        loss /= normaliser * static_cast<double>(out);
      } else {
        const int32_t label = labels[b];
        STRATA_CHECK_MSG(label >= 0 && label < out, "class label out of range");
        float m = yb[0];
        for (int64_t j = 1; j < out; ++j) m = std::max(m, yb[j]);
        double sum = 0.0;
        for (int64_t j = 0; j < out; ++j) sum += std::exp(static_cast<double>(yb[j] - m));
        const double lse = std::log(sum) + m;
        loss = (lse - yb[label]) / normaliser;
        if (dy != nullptr) {
          for (int64_t j = 0; j < out; ++j) {
            const double p = std::exp(static_cast<double>(yb[j]) - lse);
            dy[b * out + j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / normaliser);
          }
        }
      }
      per_sample[b] = loss;
    }
  });
  double total = 0.0;
  for (int64_t b = 0; b < batch; ++b) total += per_sample[b];
  return total;
}

}  // namespace strata::model
