// AVX-512 kernels with AVX512_BF16 (VCVTNEPS2BF16 for the bf16 copy); flags in
// src/CMakeLists.txt. The kernel bodies are in kernels_avx512_impl.h, in their own
// namespace here so nothing is shared with kernels_avx512.cc's differently compiled copy.
// Grad stats and the traffic pass do not convert to bf16: they are the AVX-512 ones.
#define STRATA_AVX512_BF16_INSN 1
#include "optim/kernels_avx512_impl.h"

namespace strata::optim {

const Kernels& Avx512Bf16Kernels() {
  static const Kernels k{&avx512bf16::Adam, &avx512bf16::Stats, &avx512bf16::Traffic};
  return k;
}

}  // namespace strata::optim
