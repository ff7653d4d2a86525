// Runtime ISA detection and the STRATA_ADAM_ISA override.
#include "strata/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "optim/kernels.h"

namespace strata {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::kScalar, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16};

std::string SupportedList() {
  std::string s;
  for (CpuIsa isa : SupportedCpuIsas()) {
    if (!s.empty()) s += "|";
    s += CpuIsaName(isa);
  }
  return s;
}

// The env choice is resolved once; its failure is kept and returned by every call.
const Result<CpuIsa>& EnvIsa() {
  static const Result<CpuIsa> env = []() -> Result<CpuIsa> {
    const char* e = std::getenv("STRATA_ADAM_ISA");
    if (e == nullptr || *e == '\0') return BestCpuIsa();
    Result<CpuIsa> isa = ParseCpuIsa(e);
    if (!isa.ok())
      return InvalidArgumentError("STRATA_ADAM_ISA=" + std::string(e) +
                                  " is not an instruction set; use one of " + SupportedList());
    if (!CpuSupports(*isa)) {
      return UnavailableError("STRATA_ADAM_ISA=" + std::string(e) +
                              " but this CPU lacks it; unset the variable or use one of " + SupportedList());
    }
    return isa;
  }();
  return env;
}

// -1: no SelectCpuIsa choice.
std::atomic<int> g_selected{-1};

}  // namespace

std::string_view CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return "scalar";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
    case CpuIsa::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

Result<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : kAll) {
    if (CpuIsaName(isa) == name) return isa;
  }
  return InvalidArgumentError("unknown CPU instruction set \"" + std::string(name) +
                              "\"; expected scalar|avx2|avx512|avx512bf16");
}

bool CpuSupports(CpuIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's cpu model also checks (xgetbv) that the OS saves the AVX / AVX-512 state.
  __builtin_cpu_init();
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  switch (isa) {
    case CpuIsa::kScalar: return true;
    case CpuIsa::kAvx2: return avx2;
    case CpuIsa::kAvx512: return avx512;
    case CpuIsa::kAvx512Bf16: return avx512 && __builtin_cpu_supports("avx512bf16");
  }
  return false;
#else
  return isa == CpuIsa::kScalar;
#endif
}

CpuIsa BestCpuIsa() {
  static const CpuIsa best = [] {
    CpuIsa b = CpuIsa::kScalar;
    for (CpuIsa isa : kAll) {
      if (CpuSupports(isa)) b = isa;
    }
    return b;
  }();
  return best;
}

std::vector<CpuIsa> SupportedCpuIsas() {
  std::vector<CpuIsa> v;
  for (CpuIsa isa : kAll) {
    if (CpuSupports(isa)) v.push_back(isa);
  }
  return v;
}

Result<CpuIsa> ActiveCpuIsa() {
  const int sel = g_selected.load(std::memory_order_relaxed);
  if (sel >= 0) return static_cast<CpuIsa>(sel);
  return EnvIsa();
}

Status SelectCpuIsa(CpuIsa isa) {
  if (!CpuSupports(isa)) {
    return UnavailableError("CPU instruction set " + std::string(CpuIsaName(isa)) +
                            " is not available on this CPU; available: " + SupportedList());
  }
  g_selected.store(static_cast<int>(isa), std::memory_order_relaxed);
  return OkStatus();
}

void ResetCpuIsa() { g_selected.store(-1, std::memory_order_relaxed); }

namespace optim {
const Kernels& KernelsFor(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kScalar: return ScalarKernels();
    case CpuIsa::kAvx2: return Avx2Kernels();
    case CpuIsa::kAvx512: return Avx512Kernels();
    case CpuIsa::kAvx512Bf16: return Avx512Bf16Kernels();
  }
  return ScalarKernels();
}
}  // namespace optim

}  // namespace strata
