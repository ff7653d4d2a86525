// The MLP driver (forward, loss, backward with hooks) and the dense reference parameters.
#include "strata/mlp.h"

#include <algorithm>
#include <string>
#include <utility>

#include "strata/mlp_cuda.h"
#include "strata/mlp_kernels.h"

namespace strata::model {

namespace {
Status CheckTensors(const std::vector<const void*>& tensors, const std::string& module, const char* hook) {
  if (tensors.size() != 2 || tensors[0] == nullptr || tensors[1] == nullptr) {
    return InvalidArgumentError(std::string("MLP: hook ") + hook + " for module " + module +
                                " must return 2 non-null tensors (weight, bias), got " +
                                std::to_string(tensors.size()));
  }
  return OkStatus();
}
}  // namespace

Mlp::Mlp(MlpSpec spec, Backend backend, void* stream)
    : spec_(std::move(spec)), backend_(backend), stream_(stream) {
  STRATA_CHECK_MSG(ValidateSpec(spec_).ok(), ValidateSpec(spec_).message());
  modules_ = MlpModules(spec_);
  dims_ = MlpDims(spec_);
  pre_.resize(modules_.modules.size());
  acts_.resize(modules_.modules.size());
}

Mlp::~Mlp() {
  if (backend_ != Backend::kCuda) return;
  for (Buffer* b : {&grad_a_, &grad_b_, &targets_, &labels_, &sample_loss_}) {
    if (b->ptr != nullptr) cuda::Free(b->ptr).IgnoreError();  // nothing to do about it in a destructor
  }
  for (auto* list : {&acts_, &pre_}) {
    for (Buffer& b : *list) {
      if (b.ptr != nullptr) cuda::Free(b.ptr).IgnoreError();
    }
  }
}

Status Mlp::Ensure(Buffer& buffer, int64_t floats) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(floats, 1));
  if (buffer.capacity >= n) return OkStatus();
  if (backend_ == Backend::kCpu) {
    buffer.host.resize(n);
    buffer.ptr = buffer.host.data();
  } else {
    if (buffer.ptr != nullptr) STRATA_RETURN_IF_ERROR(cuda::Free(buffer.ptr));
    buffer.ptr = nullptr;
    buffer.capacity = 0;
    STRATA_ASSIGN_OR_RETURN(void* p, cuda::Malloc(n * sizeof(float)));
    buffer.ptr = static_cast<float*>(p);
  }
  buffer.capacity = n;
  return OkStatus();
}

Result<double> Mlp::ForwardBackward(const Batch& batch, double normaliser, ModuleHooks& hooks) {
  return Run(batch, normaliser, hooks, true);
}

Result<double> Mlp::Forward(const Batch& batch, double normaliser, ModuleHooks& hooks) {
  return Run(batch, normaliser, hooks, false);
}

Result<bool> Mlp::AccumulateBoth(const ModuleGrads& grads, int layer) {
  if (grads.accumulate[0] == grads.accumulate[1]) return grads.accumulate[0] != 0;
  const int which = grads.accumulate[0] ? 1 : 0;
  const int64_t n = which == 0 ? dims_[layer] * dims_[layer + 1] : dims_[layer + 1];
  if (backend_ == Backend::kCuda) {
    STRATA_RETURN_IF_ERROR(cuda::Zero(stream_, grads.tensors[which], n));
  } else {
    std::fill(grads.tensors[which], grads.tensors[which] + n, 0.0f);
  }
  return true;
}

Status Mlp::Upload(const Batch& batch) {
  const int64_t n = batch.size;
  STRATA_RETURN_IF_ERROR(Ensure(acts_[0], n * spec_.input_dim));
  STRATA_RETURN_IF_ERROR(cuda::CopyToDevice(acts_[0].ptr, batch.x.data(), batch.x.size() * sizeof(float)));
  if (spec_.loss == LossKind::kMse) {
    STRATA_RETURN_IF_ERROR(Ensure(targets_, n * spec_.output_dim));
    STRATA_RETURN_IF_ERROR(
        cuda::CopyToDevice(targets_.ptr, batch.targets.data(), batch.targets.size() * sizeof(float)));
    // A pageable cudaMemcpy may return before its DMA has landed, and a non-blocking
    // stream (the engine's) does not wait for the legacy stream it ran on.
    return cuda::StreamSynchronize(nullptr);
  }
  STRATA_RETURN_IF_ERROR(Ensure(labels_, n));
  STRATA_RETURN_IF_ERROR(
      cuda::CopyToDevice(labels_.ptr, batch.labels.data(), batch.labels.size() * sizeof(int32_t)));
  return cuda::StreamSynchronize(nullptr);  // as for the targets
}

Result<double> Mlp::Run(const Batch& batch, double normaliser, ModuleHooks& hooks, bool backward) {
  const int64_t n = batch.size, in = spec_.input_dim, out = spec_.output_dim;
  const bool mse = spec_.loss == LossKind::kMse;
  const bool gpu = backend_ == Backend::kCuda;
  if (n < 1 || static_cast<int64_t>(batch.x.size()) != n * in ||
      (mse ? static_cast<int64_t>(batch.targets.size()) != n * out
           : static_cast<int64_t>(batch.labels.size()) != n)) {
    return InvalidArgumentError("MLP: batch of " + std::to_string(n) +
                                " samples does not match the model (x has " + std::to_string(batch.x.size()) +
                                " values, expected " + std::to_string(n * in) + "; targets/labels for loss " +
                                std::string(LossKindName(spec_.loss)) + ")");
  }
  if (!(normaliser > 0)) return InvalidArgumentError("MLP: loss normaliser must be > 0");
  if (!mse) {
    for (int32_t label : batch.labels) {
      if (label < 0 || label >= out) {
        return InvalidArgumentError("MLP: class label " + std::to_string(label) + " outside [0, " +
                                    std::to_string(out) + ")");
      }
    }
  }
  if (gpu) STRATA_RETURN_IF_ERROR(Upload(batch));
  const int num = static_cast<int>(modules_.modules.size());
  auto input_of = [&](int k) -> const float* { return k == 0 && !gpu ? batch.x.data() : acts_[k].ptr; };

  for (int k = 0; k < num; ++k) {
    const std::string& name = modules_.modules[k].name;
    Result<ModuleParams> params = hooks.Fetch(k);
    if (!params.ok()) return params.status().WithContext("before forward of module " + name);
    STRATA_RETURN_IF_ERROR(CheckTensors(params->tensors, name, "Fetch"));
    const int64_t width = dims_[k + 1];
    STRATA_RETURN_IF_ERROR(Ensure(pre_[k], n * width));
    if (k + 1 < num) STRATA_RETURN_IF_ERROR(Ensure(acts_[k + 1], n * width));
    if (gpu) {
      STRATA_RETURN_IF_ERROR(cuda::LinearForward(stream_, input_of(k), n, dims_[k], width, params->tensors[0],
                                                 params->tensors[1], params->dtype, pre_[k].ptr));
      if (k + 1 < num) {
        STRATA_RETURN_IF_ERROR(cuda::GeluForward(stream_, pre_[k].ptr, n * width, acts_[k + 1].ptr));
      }
    } else {
      LinearForward(input_of(k), n, dims_[k], width, params->tensors[0], params->tensors[1], params->dtype,
                    pre_[k].ptr);
      if (k + 1 < num) GeluForward(pre_[k].ptr, n * width, acts_[k + 1].ptr);
    }
    Status after = hooks.Release(k);
    if (!after.ok()) return after.WithContext("after forward of module " + name);
  }

  const int64_t widest = *std::max_element(dims_.begin(), dims_.end());
  if (backward) {
    STRATA_RETURN_IF_ERROR(Ensure(grad_a_, n * widest));
    STRATA_RETURN_IF_ERROR(Ensure(grad_b_, n * widest));
  }
  double loss = 0;
  if (gpu) {
    STRATA_RETURN_IF_ERROR(Ensure(sample_loss_, n));
    STRATA_RETURN_IF_ERROR(
        cuda::LossForwardBackward(stream_, spec_.loss, pre_.back().ptr, mse ? targets_.ptr : nullptr,
                                  mse ? nullptr : reinterpret_cast<const int32_t*>(labels_.ptr), n, out,
                                  normaliser, sample_loss_.ptr, backward ? grad_a_.ptr : nullptr));
    STRATA_RETURN_IF_ERROR(cuda::StreamSynchronize(stream_));
    sample_loss_host_.resize(static_cast<size_t>(n));
    STRATA_RETURN_IF_ERROR(cuda::CopyToHost(sample_loss_host_.data(), sample_loss_.ptr, n * sizeof(float)));
    for (float v : sample_loss_host_) loss += v;  // sample order, as on the CPU
  } else {
    loss = LossForwardBackward(spec_.loss, pre_.back().ptr, mse ? batch.targets.data() : nullptr,
                               mse ? nullptr : batch.labels.data(), n, out, normaliser,
                               backward ? grad_a_.ptr : nullptr);
  }
  if (!backward) return loss;

  // grad_a_ holds d loss / d pre_[k]; the layer's input gradient goes to grad_b_, through
  // the previous GELU in place, and the two swap.
  for (int k = num - 1; k >= 0; --k) {
    const std::string& name = modules_.modules[k].name;
    Result<ModuleBackward> bw = hooks.BeginBackward(k);
    if (!bw.ok()) return bw.status().WithContext("before backward of module " + name);
    STRATA_RETURN_IF_ERROR(CheckTensors(bw->params.tensors, name, "BeginBackward"));
    if (bw->grads.tensors.size() != 2 || bw->grads.tensors[0] == nullptr || bw->grads.tensors[1] == nullptr ||
        bw->grads.accumulate.size() != 2) {
      return InvalidArgumentError(
          "MLP: hook BeginBackward for module " + name +
          " must return 2 non-null gradient tensors (weight, bias) and their accumulate flags");
    }
    STRATA_ASSIGN_OR_RETURN(const bool accumulate, AccumulateBoth(bw->grads, k));
    float* dx = k > 0 ? grad_b_.ptr : nullptr;
    if (gpu) {
      STRATA_RETURN_IF_ERROR(cuda::LinearBackward(stream_, input_of(k), grad_a_.ptr, n, dims_[k],
                                                  dims_[k + 1], bw->params.tensors[0], bw->params.dtype, dx,
                                                  bw->grads.tensors[0], bw->grads.tensors[1], accumulate));
      if (k > 0) STRATA_RETURN_IF_ERROR(cuda::GeluBackward(stream_, pre_[k - 1].ptr, dx, n * dims_[k], dx));
    } else {
      LinearBackward(input_of(k), grad_a_.ptr, n, dims_[k], dims_[k + 1], bw->params.tensors[0],
                     bw->params.dtype, dx, bw->grads.tensors[0], bw->grads.tensors[1], accumulate);
      if (k > 0) GeluBackward(pre_[k - 1].ptr, dx, n * dims_[k], dx);
    }
    if (k > 0) std::swap(grad_a_, grad_b_);
    Status after = hooks.EndBackward(k);
    if (!after.ok()) return after.WithContext("after backward of module " + name);
  }
  if (gpu) STRATA_RETURN_IF_ERROR(cuda::StreamSynchronize(stream_));
  return loss;
}

DenseMlp::DenseMlp(const MlpSpec& spec, DType compute) : compute_(compute) {
  const ModelDecl model = MlpModules(spec);
  params_.resize(model.modules.size());
  grads_.resize(model.modules.size());
  half_.resize(model.modules.size());
  for (size_t m = 0; m < model.modules.size(); ++m) {
    for (size_t t = 0; t < model.modules[m].tensors.size(); ++t) {
      const int64_t numel = model.tensors[model.modules[m].tensors[t]].numel();
      params_[m].emplace_back(numel);
      grads_[m].emplace_back(numel, 0.0f);
      InitTensorSlice(spec, static_cast<int>(m), static_cast<int>(t), 0, numel, params_[m][t].data());
      if (compute_ != DType::kF32) half_[m].emplace_back(numel);
    }
  }
  SyncCompute();
}

void DenseMlp::SyncCompute() {
  if (compute_ == DType::kF32) return;
  for (size_t m = 0; m < params_.size(); ++m) {
    for (size_t t = 0; t < params_[m].size(); ++t) {
      FromFloat(params_[m][t].data(), static_cast<int64_t>(params_[m][t].size()), compute_,
                half_[m][t].data());
    }
  }
}

void DenseMlp::ZeroGrads() {
  for (auto& module : grads_) {
    for (auto& g : module) std::fill(g.begin(), g.end(), 0.0f);
  }
}

void DenseMlp::SgdStep(float lr) {
  for (size_t m = 0; m < params_.size(); ++m) {
    for (size_t t = 0; t < params_[m].size(); ++t) {
      for (size_t i = 0; i < params_[m][t].size(); ++i) params_[m][t][i] -= lr * grads_[m][t][i];
    }
  }
  SyncCompute();
}

Result<ModuleParams> DenseMlp::Fetch(int module) {
  if (module < 0 || module >= num_modules()) {
    return InvalidArgumentError("DenseMlp: no module " + std::to_string(module));
  }
  ModuleParams p;
  p.dtype = compute_;
  for (size_t t = 0; t < params_[module].size(); ++t) {
    p.tensors.push_back(compute_ == DType::kF32 ? static_cast<const void*>(params_[module][t].data())
                                                : static_cast<const void*>(half_[module][t].data()));
  }
  return p;
}

Result<ModuleBackward> DenseMlp::BeginBackward(int module) {
  STRATA_ASSIGN_OR_RETURN(ModuleParams p, Fetch(module));
  ModuleBackward bw;
  bw.params = std::move(p);
  for (auto& g : grads_[module]) bw.grads.tensors.push_back(g.data());
  bw.grads.accumulate.assign(bw.grads.tensors.size(), accumulate_ ? 1 : 0);
  return bw;
}

}  // namespace strata::model
