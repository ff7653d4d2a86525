// The small MLP the plan's tests lay out: four Linears, a few 16 KiB chunks.
#pragma once

#include "strata/mlp.h"

namespace strata::testing {

inline model::MlpSpec PlanTestModel() {
  model::MlpSpec m;
  m.input_dim = 64;
  m.hidden = {96, 80, 64};
  m.output_dim = 10;
  m.seed = 7;
  return m;
}

}  // namespace strata::testing
