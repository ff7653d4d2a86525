// The vector tanh (glibc's libmvec) and the GELU on it, against the C library's tanhf one
// value at a time: the plain reference.
#include "model/vector_tanh.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "strata/mlp_kernels.h"

namespace strata::model {
namespace {

// Distance in representable floats (both finite, same sign or zero).
int64_t UlpDistance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = std::numeric_limits<int32_t>::min() - ia;
  if (ib < 0) ib = std::numeric_limits<int32_t>::min() - ib;
  return std::llabs(static_cast<int64_t>(ia) - ib);
}

// A sweep over where tanh bends and saturates, an odd length (a tail for every width),
// and the special values.
std::vector<float> Arguments() {
  std::vector<float> x;
  for (int i = -200001; i <= 200001; ++i) x.push_back(i * 1e-4f);
  for (float v : {1e-30f, -1e-30f, 1e-45f, 9.0f, -9.0f, 40.0f, -40.0f, 1e30f, -1e30f, 0.0f, -0.0f})
    x.push_back(v);
  return x;
}

// Against tanh in double, rounded: libmvec's stated bound is a few ulp; the C library's
// tanhf is itself up to 2 ulp from the rounded value, so the two differ by up to 3-4.
TEST(VectorTanh, IsWithinFourUlpOfTheRoundedTanh) {
  const std::vector<float> x = Arguments();
  std::vector<float> t = x;
  TanhInPlace(t.data(), static_cast<int64_t>(t.size()));
  int64_t worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(std::tanh(static_cast<double>(x[i])));
    const int64_t d = UlpDistance(t[i], want);
    EXPECT_LE(d, 4) << "tanh(" << x[i] << "): " << t[i] << " against " << want;
    worst = std::max(worst, d);
  }
  RecordProperty("worst_ulp", static_cast<int>(worst));
}

TEST(VectorTanh, KeepsInfinitiesAndNan) {
  std::vector<float> t = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN()};
  t.resize(17, 0.5f);  // a full vector of AVX-512 and a tail
  t[16] = std::numeric_limits<float>::quiet_NaN();
  TanhInPlace(t.data(), static_cast<int64_t>(t.size()));
  EXPECT_EQ(t[0], 1.0f);
  EXPECT_EQ(t[1], -1.0f);
  EXPECT_TRUE(std::isnan(t[2]));
  EXPECT_TRUE(std::isnan(t[16]));
}

// GELU with the vector tanh against the scalar one. The two tanh differ by at most 8 ulp
// of t (each within 4 of the rounded value); that moves y = 0.5 v (1 + t) by 0.5 |v| du,
// and the backward's factor d(t) by |d'(t)| du with d'(t) = 0.5 - v t k0 (1 + 3 k1 v^2),
// du = 8 ulp(t); beside that, a few roundings of the result (of the backward's terms,
// which may cancel). Where v^3 overflows both are NaN.
TEST(VectorTanh, GeluMatchesTheScalarGeluWithinTanhsError) {
  constexpr float k0 = 0.7978845608028654f, k1 = 0.044715f;
  const std::vector<float> x = Arguments();
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y_scalar(n), y_vector(n), dy(n, 1.0f), dx_scalar(n), dx_vector(n);
  GeluForward(x.data(), n, y_scalar.data(), GeluTanh::kScalar);
  GeluForward(x.data(), n, y_vector.data(), GeluTanh::kVector);
  GeluBackward(x.data(), dy.data(), n, dx_scalar.data(), GeluTanh::kScalar);
  GeluBackward(x.data(), dy.data(), n, dx_vector.data(), GeluTanh::kVector);
  auto ulp = [](float v) { return std::nextafter(std::fabs(v), INFINITY) - std::fabs(v); };
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    EXPECT_EQ(std::isnan(y_vector[i]), std::isnan(y_scalar[i])) << "gelu(" << v << ")";
    EXPECT_EQ(std::isnan(dx_vector[i]), std::isnan(dx_scalar[i])) << "gelu'(" << v << ")";
    if (std::isnan(y_scalar[i]) || std::isnan(dx_scalar[i])) continue;
    const float t = std::tanh(k0 * (v + k1 * v * v * v));
    const double du = 8.0 * ulp(t);
    const double slope = std::fabs(0.5 - double(v) * t * k0 * (1 + 3 * k1 * double(v) * v));
    // The backward's two terms may cancel: its roundings are of the terms, not the sum.
    const float terms =
        std::max(std::fabs(0.5f * (1 + t)), std::fabs(0.5f * v * (1 - t * t) * k0 * (1 + 3 * k1 * v * v)));
    EXPECT_NEAR(y_vector[i], y_scalar[i], 0.5 * std::fabs(v) * du + 4 * ulp(y_scalar[i]))
        << "gelu(" << v << ")";
    EXPECT_NEAR(dx_vector[i], dx_scalar[i], slope * du + 8 * ulp(terms)) << "gelu'(" << v << ")";
  }
}

}  // namespace
}  // namespace strata::model
