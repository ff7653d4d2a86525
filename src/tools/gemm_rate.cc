#include "tools/gemm_rate.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"

namespace strata::tools {

std::string GemmRate::Shape() const {
  return "[" + std::to_string(m) + " x " + std::to_string(k) + "] x [" + std::to_string(k) + " x " +
         std::to_string(n) + "]";
}

namespace {

// Rounds of calls, `run(n)` making n calls and waiting for them, doubled until a round
// takes ~10 ms (so that the clock's resolution does not set the figure), for about
// `seconds`; r's rate is the best round's.
Status TimeRounds(double seconds, const std::function<Status(int)>& run, GemmRate* r) {
  using Clock = std::chrono::steady_clock;
  const double flops =
      2.0 * static_cast<double>(r->m) * static_cast<double>(r->n) * static_cast<double>(r->k);
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  int per_round = 1;
  do {
    const auto t0 = Clock::now();
    STRATA_RETURN_IF_ERROR(run(per_round));
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    r->calls += per_round;
    r->flops_per_s = std::max(r->flops_per_s, flops * per_round / std::max(s, 1e-9));
    if (s < 0.01) per_round *= 2;
  } while (Clock::now() < end);
  return OkStatus();
}

}  // namespace

GemmRate MeasureGemmRate(int64_t m, int64_t n, int64_t k, double seconds) {
  GemmRate r{m, n, k, 0, 0};
  std::vector<float> a(m * k, 0.5f), b(k * n, 0.25f), c(m * n, 0.0f);
  auto gemm = [&] { model::Gemm(m, n, k, a.data(), k, b.data(), n, c.data(), n, false); };
  gemm();  // warm caches and threads
  TimeRounds(
      seconds,
      [&](int calls) {
        for (int i = 0; i < calls; ++i) gemm();
        return OkStatus();
      },
      &r)
      .IgnoreError();  // the CPU's products cannot fail
  return r;
}

namespace {

// Device buffers freed at scope exit (their errors are the probe's least concern).
struct DeviceBuffers {
  std::vector<void*> ptrs;
  ~DeviceBuffers() {
    for (void* p : ptrs) model::cuda::Free(p).IgnoreError();
  }
  // Every byte 0x3e: 0.186 as fp32 and as bf16, a nonzero operand (tensor cores can
  // clock higher on zeros).
  Result<void*> Filled(size_t bytes) {
    STRATA_ASSIGN_OR_RETURN(void* p, model::cuda::Malloc(bytes));
    ptrs.push_back(p);
    const std::vector<char> fill(bytes, 0x3e);
    STRATA_RETURN_IF_ERROR(model::cuda::CopyToDevice(p, fill.data(), bytes));
    return p;
  }
};

}  // namespace

Result<GemmRate> MeasureDeviceGemmRate(int64_t m, int64_t n, int64_t k, DType weights, double seconds) {
  STRATA_RETURN_IF_ERROR(model::cuda::DeviceAvailable());
  GemmRate r{m, n, k, 0, 0, "the CUDA linear layer"};
  DeviceBuffers buf;
  STRATA_ASSIGN_OR_RETURN(void* x, buf.Filled(static_cast<size_t>(m * k) * sizeof(float)));
  STRATA_ASSIGN_OR_RETURN(void* w, buf.Filled(static_cast<size_t>(n * k) * DTypeSize(weights)));
  STRATA_ASSIGN_OR_RETURN(void* b, buf.Filled(static_cast<size_t>(n) * DTypeSize(weights)));
  STRATA_ASSIGN_OR_RETURN(void* y, buf.Filled(static_cast<size_t>(m * n) * sizeof(float)));
  auto call = [&] {
    return model::cuda::LinearForward(nullptr, static_cast<const float*>(x), m, k, n, w, b, weights,
                                      static_cast<float*>(y));
  };
  STRATA_RETURN_IF_ERROR(call());  // cuBLAS's handle and workspace come with the first call
  STRATA_RETURN_IF_ERROR(model::cuda::StreamSynchronize(nullptr));
  STRATA_RETURN_IF_ERROR(TimeRounds(
      seconds,
      [&](int calls) -> Status {
        for (int i = 0; i < calls; ++i) STRATA_RETURN_IF_ERROR(call());
        return model::cuda::StreamSynchronize(nullptr);
      },
      &r));
  return r;
}

}  // namespace strata::tools
