// Host side of the CUDA optimizer kernels: validation, per-group constants, batching.
#include <string>
#include <vector>

#include "optim/cuda/launch.h"
#include "optim/kernels.h"
#include "strata/adam.h"
#include "strata/grad_stats.h"

namespace strata {
namespace {

Status CudaError(int err, const char* what, std::string_view where) {
  return InternalError(std::string(where) + ": " + what + " failed: " + optim::cuda::ErrorString(err) +
                       " (CUDA error " + std::to_string(err) + ")");
}

}  // namespace

bool AdamCudaBuilt() { return true; }

Status AdamStepCuda(std::span<const AdamTensor> tensors, void* cuda_stream) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamTensor& t = tensors[i];
    if (t.params == nullptr)
      return InvalidArgumentError("AdamStepCuda: tensor " + std::to_string(i) + " has no params");
    Status s = ValidateAdam(*t.params, t.master, t.m, t.v, t.grad, t.n, t.out);
    if (!s.ok()) return s.WithContext("AdamStepCuda tensor " + std::to_string(i));
  }
  optim::cuda::AdamBatch batch{};
  uint64_t max_n = 0;
  auto flush = [&]() -> Status {
    const char* what = "";
    const int err = optim::cuda::LaunchAdam(batch, max_n, cuda_stream, &what);
    batch.count = 0;
    max_n = 0;
    return err == 0 ? OkStatus() : CudaError(err, what, "AdamStepCuda");
  };
  for (const AdamTensor& t : tensors) {
    if (t.n == 0) continue;
    const optim::AdamConsts c = optim::MakeAdamConsts(*t.params);
    optim::cuda::AdamTensorArgs& a = batch.t[batch.count++];
    a = {t.master,
         t.m,
         t.v,
         t.grad.data,
         t.out.data,
         t.n,
         c.beta1,
         c.one_minus_beta1,
         c.beta2,
         c.one_minus_beta2,
         c.eps,
         c.step_size,
         c.inv_sqrt_bc2,
         c.decay,
         c.l2,
         c.grad_scale,
         static_cast<uint8_t>(t.grad.type),
         static_cast<uint8_t>(t.out.data == nullptr ? 255 : static_cast<int>(t.out.type))};
    if (t.n > max_n) max_n = t.n;
    if (batch.count == optim::cuda::kMaxTensorsPerLaunch) STRATA_RETURN_IF_ERROR(flush());
  }
  if (batch.count > 0) STRATA_RETURN_IF_ERROR(flush());
  return OkStatus();
}

Result<GradStats> ComputeGradStatsCuda(std::span<const GradShard> shards, void* cuda_stream) {
  std::vector<optim::cuda::GradStatsBatch> batches;
  std::vector<uint64_t> max_ns;
  for (size_t i = 0; i < shards.size(); ++i) {
    const GradShard& s = shards[i];
    if (s.n == 0) continue;
    if (s.grad.data == nullptr) {
      return InvalidArgumentError("ComputeGradStatsCuda: shard " + std::to_string(i) + " has a null pointer");
    }
    if (batches.empty() || batches.back().count == optim::cuda::kMaxShardsPerLaunch) {
      batches.emplace_back();
      batches.back().count = 0;
      max_ns.push_back(0);
    }
    optim::cuda::GradStatsBatch& b = batches.back();
    b.s[b.count++] = {s.grad.data, s.n, static_cast<uint8_t>(s.grad.type)};
    if (s.n > max_ns.back()) max_ns.back() = s.n;
  }
  GradStats out;
  if (batches.empty()) return out;
  const char* what = "";
  double sum = 0;
  int flag = 0;
  const int err = optim::cuda::RunGradStats(batches.data(), static_cast<int>(batches.size()), max_ns.data(),
                                            cuda_stream, &sum, &flag, &what);
  if (err != 0) return CudaError(err, what, "ComputeGradStatsCuda");
  out.sum_sq = sum;
  out.has_inf_nan = flag != 0;
  return out;
}

}  // namespace strata
