// Runtime instruction-set dispatch for strata's CPU optimizer kernels (Adam, grad stats).
//
// Contract:
//  - The kernels pick the widest instruction set this CPU supports (cpuid, and the OS
//    saving the AVX/AVX-512 register state): avx512bf16 > avx512 > avx2 > scalar.
//  - The environment variable STRATA_ADAM_ISA=scalar|avx2|avx512|avx512bf16 forces one
//    (read once, on first use). An unknown name, or an instruction set this CPU lacks, is
//    not silently replaced: every kernel call then returns InvalidArgument/Unavailable
//    naming the variable and the instruction sets available.
//  - SelectCpuIsa() overrides both (tests, benchmarks); it is not meant to be called while
//    kernels run on other threads (the choice is read once per kernel call).
//  - All paths give the same 16-bit copies bit for bit and fp32 results within a few ulps
//    of the double-precision reference (see adam.h).
#pragma once

#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

enum class CpuIsa {
  kScalar,      // portable C++ (what the baseline x86-64 compiler emits)
  kAvx2,        // AVX2 + FMA + F16C
  kAvx512,      // AVX-512 F + BW (+ F16C for fp16)
  kAvx512Bf16,  // kAvx512 + AVX512_BF16 (VCVTNEPS2BF16 for the bf16 copy)
};

std::string_view CpuIsaName(CpuIsa isa);            // "scalar", "avx2", "avx512", "avx512bf16"
Result<CpuIsa> ParseCpuIsa(std::string_view name);  // InvalidArgument for an unknown name
bool CpuSupports(CpuIsa isa);                       // cpuid + OS register-state check
CpuIsa BestCpuIsa();                                // the widest supported one
std::vector<CpuIsa> SupportedCpuIsas();             // ascending, always starts with kScalar

// The ISA the kernels use now: SelectCpuIsa's choice, else STRATA_ADAM_ISA, else BestCpuIsa().
// Fails when STRATA_ADAM_ISA names an unknown or unsupported ISA.
Result<CpuIsa> ActiveCpuIsa();
// Forces `isa` for all later kernel calls; Unavailable if this CPU lacks it.
Status SelectCpuIsa(CpuIsa isa);
// Drops SelectCpuIsa's choice (back to STRATA_ADAM_ISA or the best).
void ResetCpuIsa();

}  // namespace strata
