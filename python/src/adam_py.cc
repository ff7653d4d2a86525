// strata._strata.adam_step: strata's CPU Adam stepping torch tensors in place.
//
// The tensors arrive as DLPack views (nanobind ndarrays) of the torch tensors' own
// memory: nothing is copied in or out. fp32 parameters are the AdamStep master
// directly. 16-bit parameters (bf16, fp16) have no fp32 master, as in DeepSpeed's
// CPU Adam: each cache-sized chunk is widened into a per-task scratch buffer, stepped,
// and rounded back into the parameter (round to nearest even, AdamStep's Copy16).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "module.h"
#include "ndarray_util.h"
#include "status_py.h"
#include "strata/adam.h"
#include "strata/half.h"

namespace nb = nanobind;

namespace strata::py {
namespace {

using CpuArray = nb::ndarray<nb::device::cpu>;
// lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, step (counted from 1).
using Hyper = std::tuple<double, double, double, double, double, bool, bool, int64_t>;

// Elements per chunk of a 16-bit parameter: its fp32 scratch (32 KiB) stays in L1/L2,
// and it is below AdamStep's tile size, so each chunk runs inline in its task.
constexpr size_t kChunk = 8192;

// One parameter tensor of a step.
struct Slot {
  AdamParams params;
  void* param = nullptr;
  DType param_type = DType::kF32;
  float* m = nullptr;
  float* v = nullptr;
  GradView grad;
  size_t n = 0;
};

std::optional<DType> FloatType(const CpuArray& a) {
  if (a.dtype() == nb::dtype<float>()) return DType::kF32;
  const nb::dlpack::dtype bf16{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1};
  const nb::dlpack::dtype fp16{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1};
  if (a.dtype() == bf16) return DType::kBf16;
  if (a.dtype() == fp16) return DType::kFp16;
  return std::nullopt;
}

std::string Where(size_t i, const char* what) {
  return "strata.optim: tensor " + std::to_string(i) + " (" + what + ")";
}

DType CheckArray(const CpuArray& a, size_t i, const char* what) {
  const std::optional<DType> t = FloatType(a);
  if (!t) RaiseValueError(Where(i, what) + ": dtype must be float32, bfloat16 or float16");
  if (!IsContiguous(a)) RaiseValueError(Where(i, what) + ": must be contiguous");
  return *t;
}

Slot MakeSlot(size_t i, const CpuArray& p, const CpuArray& g, const CpuArray& m, const CpuArray& v,
              const Hyper& h) {
  Slot s;
  s.param_type = CheckArray(p, i, "parameter");
  s.grad.type = CheckArray(g, i, "gradient");
  if (CheckArray(m, i, "exp_avg") != DType::kF32 || CheckArray(v, i, "exp_avg_sq") != DType::kF32) {
    RaiseValueError(Where(i, "state") + ": exp_avg and exp_avg_sq must be float32");
  }
  s.n = p.size();
  if (g.size() != s.n || m.size() != s.n || v.size() != s.n) {
    RaiseValueError(Where(i, "sizes") + ": parameter, gradient, exp_avg and exp_avg_sq differ in size (" +
                    std::to_string(s.n) + ", " + std::to_string(g.size()) + ", " + std::to_string(m.size()) +
                    ", " + std::to_string(v.size()) + ")");
  }
  s.param = p.data();
  s.grad.data = g.data();
  s.m = static_cast<float*>(m.data());
  s.v = static_cast<float*>(v.data());
  const auto& [lr, beta1, beta2, eps, weight_decay, adamw, bias_correction, step] = h;
  s.params.lr = static_cast<float>(lr);
  s.params.beta1 = static_cast<float>(beta1);
  s.params.beta2 = static_cast<float>(beta2);
  s.params.eps = static_cast<float>(eps);
  s.params.weight_decay = static_cast<float>(weight_decay);
  s.params.adamw = adamw;
  s.params.bias_correction = bias_correction;
  s.params.step = step;
  return s;
}

template <typename T>
const T* At(const void* base, size_t i) {
  return static_cast<const T*>(base) + i;
}

void Widen(DType type, const void* src, size_t begin, size_t n, float* dst) {
  if (type == DType::kBf16) {
    const Bf16* s = At<Bf16>(src, begin);
    for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(s[i]);
  } else {
    const Fp16* s = At<Fp16>(src, begin);
    for (size_t i = 0; i < n; ++i) dst[i] = Fp16ToFloat(s[i]);
  }
}

Status StepFp32(std::span<const Slot> slots) {
  std::vector<AdamTensor> tensors;
  for (const Slot& s : slots) {
    tensors.push_back(AdamTensor{&s.params, static_cast<float*>(s.param), s.m, s.v, s.grad, Copy16{}, s.n});
  }
  return AdamStep(tensors);
}

Status StepHalf(std::span<const Slot> slots) {
  struct Piece {
    const Slot* slot;
    size_t begin;
    size_t n;
  };
  std::vector<Piece> pieces;
  for (const Slot& s : slots) {
    for (size_t b = 0; b < s.n; b += kChunk) pieces.push_back(Piece{&s, b, std::min(kChunk, s.n - b)});
  }
  std::mutex mu;
  Status first;
  tbb::parallel_for(size_t{0}, pieces.size(), [&](size_t i) {
    const Piece& pc = pieces[i];
    const Slot& s = *pc.slot;
    alignas(64) float master[kChunk];
    Widen(s.param_type, s.param, pc.begin, pc.n, master);
    const size_t grad_bytes = DTypeSize(s.grad.type) * pc.begin;
    const GradView grad{static_cast<const char*>(s.grad.data) + grad_bytes, s.grad.type};
    const Copy16 out{static_cast<char*>(s.param) + 2 * pc.begin, s.param_type};
    Status st = AdamStep(s.params, master, s.m + pc.begin, s.v + pc.begin, grad, pc.n, out);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first.ok()) first = std::move(st);
    }
  });
  return first;
}

// Everything that can fail is checked here, before any tensor is touched.
Status Validate(std::span<const Slot> slots) {
  STRATA_ASSIGN_OR_RETURN(const CpuIsa isa, ActiveCpuIsa());
  static_cast<void>(isa);
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    Status st = ValidateAdam(s.params, s.m, s.m, s.v, s.grad, s.n, Copy16{});
    if (!st.ok()) return st.WithContext("tensor " + std::to_string(i));
  }
  return OkStatus();
}

void AdamStepPy(const std::vector<CpuArray>& params, const std::vector<CpuArray>& grads,
                const std::vector<CpuArray>& exp_avgs, const std::vector<CpuArray>& exp_avg_sqs,
                const std::vector<Hyper>& hyper) {
  const size_t n = params.size();
  if (grads.size() != n || exp_avgs.size() != n || exp_avg_sqs.size() != n || hyper.size() != n) {
    RaiseValueError(
        "strata.optim: adam_step needs as many grads, exp_avgs, exp_avg_sqs and hyper-parameter "
        "tuples as params");
  }
  std::vector<Slot> wide, half;
  for (size_t i = 0; i < n; ++i) {
    Slot s = MakeSlot(i, params[i], grads[i], exp_avgs[i], exp_avg_sqs[i], hyper[i]);
    (s.param_type == DType::kF32 ? wide : half).push_back(s);
  }
  Status st = Validate(wide);
  if (st.ok()) st = Validate(half);
  if (st.ok()) {
    nb::gil_scoped_release release;
    st = StepFp32(wide);
    if (st.ok()) st = StepHalf(half);
  }
  if (!st.ok()) RaiseStatus(st, "strata.optim: AdamStep");
}

}  // namespace

void BindAdam(nb::module_& m) {
  m.def("adam_step", &AdamStepPy, nb::arg("params").noconvert(), nb::arg("grads").noconvert(),
        nb::arg("exp_avgs").noconvert(), nb::arg("exp_avg_sqs").noconvert(), nb::arg("hyper"),
        "One Adam/AdamW step of strata's SIMD CPU kernel over CPU tensors, in place.\n\n"
        "params: float32, bfloat16 or float16; grads: any of those; exp_avgs, exp_avg_sqs: float32; "
        "all contiguous, matched by position. hyper[i] = (lr, beta1, beta2, eps, weight_decay, adamw, "
        "bias_correction, step) with step counted from 1. Releases the GIL; runs on oneTBB threads.");
  m.def(
      "cpu_isa",
      [] {
        Result<CpuIsa> isa = ActiveCpuIsa();
        if (!isa.ok()) RaiseStatus(isa.status(), "strata.optim");
        return std::string(CpuIsaName(*isa));
      },
      "The instruction set strata's CPU Adam uses here (\"scalar\", \"avx2\", \"avx512\", \"avx512bf16\").");
}

}  // namespace strata::py
