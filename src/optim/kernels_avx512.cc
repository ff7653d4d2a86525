// AVX-512 F/BW/VL kernels (bf16 copy by integer rounding); flags in src/CMakeLists.txt.
#include "optim/kernels_avx512_impl.h"

namespace strata::optim {

const Kernels& Avx512Kernels() {
  static const Kernels k{&avx512::Adam, &avx512::Stats, &avx512::Traffic};
  return k;
}

}  // namespace strata::optim
