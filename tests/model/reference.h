// Plain double-precision reference of the MLP for the model tests: the formulas of
// mlp_kernels.h written out directly, used for finite-difference gradient checks.
#pragma once

#include <cmath>
#include <vector>

#include "strata/mlp.h"
#include "strata/model.h"

namespace strata::model::testing {

inline double RefGelu(double x) {
  const double k0 = std::sqrt(2.0 / M_PI), k1 = 0.044715;
  return 0.5 * x * (1.0 + std::tanh(k0 * (x + k1 * x * x * x)));
}

// y [batch, out] = x W^T + b.
inline std::vector<double> RefLinear(const std::vector<double>& x, int64_t batch, int64_t in, int64_t out,
                                     const std::vector<double>& w, const std::vector<double>& b) {
  std::vector<double> y(batch * out);
  for (int64_t s = 0; s < batch; ++s) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b[o];
      for (int64_t i = 0; i < in; ++i) acc += x[s * in + i] * w[o * in + i];
      y[s * out + o] = acc;
    }
  }
  return y;
}

inline double RefLoss(LossKind kind, const std::vector<double>& y, const Batch& batch, int64_t out,
                      double normaliser) {
  double total = 0.0;
  for (int64_t s = 0; s < batch.size; ++s) {
    if (kind == LossKind::kMse) {
      for (int64_t j = 0; j < out; ++j) {
        const double d = y[s * out + j] - batch.targets[s * out + j];
        total += d * d / (normaliser * static_cast<double>(out));
      }
    } else {
      double m = y[s * out];
      for (int64_t j = 1; j < out; ++j) m = std::max(m, y[s * out + j]);
      double sum = 0.0;
      for (int64_t j = 0; j < out; ++j) sum += std::exp(y[s * out + j] - m);
      total += (std::log(sum) + m - y[s * out + batch.labels[s]]) / normaliser;
    }
  }
  return total;
}

// params[module][tensor] in double.
using RefParams = std::vector<std::vector<std::vector<double>>>;

inline RefParams ToDouble(DenseMlp& dense) {
  RefParams p(dense.num_modules());
  for (int m = 0; m < dense.num_modules(); ++m) {
    for (auto& t : dense.params(m)) p[m].emplace_back(t.begin(), t.end());
  }
  return p;
}

inline double RefMlpLoss(const MlpSpec& spec, const RefParams& p, const Batch& batch, double normaliser) {
  const std::vector<int64_t> dims = MlpDims(spec);
  std::vector<double> a(batch.x.begin(), batch.x.end());
  const int num = static_cast<int>(dims.size()) - 1;
  for (int k = 0; k < num; ++k) {
    a = RefLinear(a, batch.size, dims[k], dims[k + 1], p[k][0], p[k][1]);
    if (k + 1 < num) {
      for (double& v : a) v = RefGelu(v);
    }
  }
  return RefLoss(spec.loss, a, batch, spec.output_dim, normaliser);
}

}  // namespace strata::model::testing
