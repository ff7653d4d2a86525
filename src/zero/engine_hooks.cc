// The hooks the model calls around each use of a module: stage 3 gathers (the
// gatherer, param_gatherer.h), gradient buffers, the call order (trace.h), and the asynchronous
// reduction of chunks whose gradients are final for the micro-batch.
//
// Every collective is issued by comm_worker in the order the training thread submits
// it; that order depends only on the model's calls and the configuration, so it is the
// same on every rank (which is what makes the collectives match).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "strata/grad_stats.h"
#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

Status Engine::BeginMicroBatch() {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.RefuseWhileEvaluating("BeginMicroBatch"));
  if (s.in_micro_batch) {
    STRATA_RETURN_IF_ERROR(s.FailHook(s.EndMicroBatch(), "BeginMicroBatch", s.micro_batch));
    ++s.micro_batch;
  }
  s.in_micro_batch = true;
  if (s.micro_batch >= s.config.gradient_accumulation_steps) {
    return FailedPreconditionError("engine: " + std::to_string(s.micro_batch + 1) +
                                   " micro-batches without Step(); gradient_accumulation_steps is " +
                                   std::to_string(s.config.gradient_accumulation_steps));
  }
  s.reducer->BeginMicroBatch(s.order->uses().backward_uses);
  return OkStatus();
}

Status Engine::SetEvaluating(bool evaluating) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  if (s.in_micro_batch) {
    return FailedPreconditionError("engine: SetEvaluating inside a micro-batch; call it after Step()");
  }
  STRATA_RETURN_IF_ERROR(s.CheckHooksDone());
  s.evaluating = evaluating;
  s.window_disturbed = true;  // its passes are no part of a step's time
  return OkStatus();
}

Status Engine::SetLearningRate(double lr) {
  Impl& s = *impl_;
  if (!(lr >= 0 && std::isfinite(static_cast<float>(lr)))) {
    char text[64];
    std::snprintf(text, sizeof(text), "%g", lr);
    return InvalidArgumentError(std::string("engine: SetLearningRate(") + text +
                                "): the learning rate must be a finite fp32 number >= 0");
  }
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  if (s.in_micro_batch) {
    return FailedPreconditionError("engine: SetLearningRate inside an accumulation window (micro-batch " +
                                   std::to_string(s.micro_batch + 1) + " of " +
                                   std::to_string(s.config.gradient_accumulation_steps) +
                                   "); call it after Step(), before the next BeginMicroBatch");
  }
  // Every step path copies `adam` when it steps a chunk, speculative steps included;
  // none is in flight outside a window.
  s.adam.lr = static_cast<float>(lr);
  return OkStatus();
}

double Engine::learning_rate() const { return impl_->adam.lr; }

Status Engine::Impl::RefuseWhileEvaluating(const char* call) const {
  if (!evaluating) return OkStatus();
  return FailedPreconditionError(std::string("engine: ") + call +
                                 " while evaluating; call SetEvaluating(false) first");
}

Status Engine::Impl::CheckModule(int module) const {
  if (module >= 0 && module < layout.num_modules()) return OkStatus();
  return InvalidArgumentError("engine: module index " + std::to_string(module) +
                              " out of range: the model declared " + std::to_string(layout.num_modules()) +
                              " modules");
}

Status Engine::Impl::CheckNotFinal(int chunk, const std::string& what, std::string_view hook, int index) {
  if (!reducer->Final(chunk)) return OkStatus();
  return FailHook(
      FailedPreconditionError("engine: " + what + " after the gradients of chunk " + std::to_string(chunk) +
                              " were reduced for this micro-batch: the recorded call order had no such "
                              "use with the same forward (a frozen module given a backward?)"),
      hook, index);
}

void Engine::Impl::CountBackwardUse(int chunk) {
  reducer->CountUse(chunk, /*follows=*/!order->diverged(), LastMicroBatch());
}

Status Engine::Impl::EnterModule(int module, int pos) {
  return stage == 3 ? gatherer->Enter(module, pos) : OkStatus();
}

ModuleParams Engine::Impl::ParamsOf(int module) {
  ModuleParams p;
  p.dtype = compute;
  for (TensorId id : layout.module_tensors[module]) {
    const zero::TensorPlace& t = layout.tensors[id];
    p.tensors.push_back(static_cast<uint8_t*>(ChunkParams(t.chunk)) + t.offset * csize);
  }
  return p;
}

Result<ModuleParams> Engine::Fetch(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  if (s.evaluating) {
    s.open_pos[module] = -1;  // no trace position: gathered on demand
    STRATA_RETURN_IF_ERROR(s.FailHook(s.EnterModule(module, -1), "Fetch", module));
    s.module_start = std::chrono::steady_clock::now();
    return s.ParamsOf(module);
  }
  if (!s.in_micro_batch) STRATA_RETURN_IF_ERROR(BeginMicroBatch());
  const int pos = s.order->Note(zero::UseKind::kForward, module);
  s.open_pos[module] = pos;
  STRATA_RETURN_IF_ERROR(s.FailHook(s.EnterModule(module, pos), "Fetch", module));
  if (pos == 0 && s.LastMicroBatch()) s.ReadStatesAhead();
  s.module_start = std::chrono::steady_clock::now();
  return s.ParamsOf(module);
}

Status Engine::Release(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  // At stage 3 a released gather buffer may be refilled at once: the module's kernels
  // must be done. The module's time then counts them (on a GPU), not only their launch.
  if (s.stage == 3) STRATA_RETURN_IF_ERROR(s.FailHook(s.WaitForModel(), "Release", module));
  s.Span(s.track_compute, "forward " + s.model.modules[module].name, s.module_start);
  s.TimeModule();
  if (s.stage == 3) s.gatherer->Leave(module, s.open_pos[module], s.LastMicroBatch());
  return OkStatus();
}

Result<ModuleBackward> Engine::BeginBackward(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.RefuseWhileEvaluating("BeginBackward"));
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  if (!s.in_micro_batch) STRATA_RETURN_IF_ERROR(BeginMicroBatch());
  for (int c : s.layout.module_chunks[module]) {
    STRATA_RETURN_IF_ERROR(s.CheckNotFinal(c, "backward of module \"" + s.model.modules[module].name + "\"",
                                           "BeginBackward", module));
  }
  const int pos = s.order->Note(zero::UseKind::kBackward, module);
  s.open_pos[module] = pos;
  STRATA_RETURN_IF_ERROR(s.FailHook(s.EnterModule(module, pos), "BeginBackward", module));
  for (int c : s.layout.module_chunks[module]) {
    if (s.reducer->Holds(c)) continue;
    STRATA_RETURN_IF_ERROR(
        s.FailHook(s.reducer->Hold(c, s.layout.module_chunks[module]), "BeginBackward", module));
  }
  ModuleBackward b;
  b.params = s.ParamsOf(module);
  for (TensorId id : s.layout.module_tensors[module]) {
    const zero::TensorPlace& t = s.layout.tensors[id];
    b.grads.tensors.push_back(s.reducer->Buffer(t.chunk) + t.offset);
    b.grads.accumulate.push_back(s.reducer->MarkWritten(id));
  }
  s.open_backward = module;
  s.module_start = std::chrono::steady_clock::now();
  return b;
}

Status Engine::EndBackward(int module) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.CheckModule(module));
  // The reductions below read the module's gradients; a released gather buffer may be
  // refilled at once. The module's time counts its kernels, as Release's does.
  STRATA_RETURN_IF_ERROR(s.FailHook(s.WaitForModel(), "EndBackward", module));
  s.Span(s.track_compute, "backward " + s.model.modules[module].name, s.module_start);
  s.TimeModule();
  if (s.stage == 3) s.gatherer->Leave(module, s.open_pos[module], s.LastMicroBatch());
  s.open_backward = -1;
  for (int c : s.layout.module_chunks[module]) s.CountBackwardUse(c);
  // Keep the queue short: drop finished reductions, surfacing their errors now.
  return s.FailHook(s.reducer->PollDone(), "EndBackward", module);
}

Status Engine::AccumulateGrad(TensorId tensor, const void* grad, DType dtype) {
  Impl& s = *impl_;
  STRATA_RETURN_IF_ERROR(s.RefuseAfterFailure());
  STRATA_RETURN_IF_ERROR(s.RefuseWhileEvaluating("AccumulateGrad"));
  if (tensor < 0 || tensor >= static_cast<int>(s.layout.tensors.size()) || grad == nullptr) {
    return InvalidArgumentError("engine: AccumulateGrad of tensor id " + std::to_string(tensor) +
                                (grad == nullptr ? " with no data" : "") + ": the model declared " +
                                std::to_string(s.layout.tensors.size()) + " tensors");
  }
  if (dtype != DType::kF32 && dtype != DType::kBf16 && dtype != DType::kFp16) {
    return InvalidArgumentError("engine: AccumulateGrad of \"" + s.model.tensors[tensor].name + "\" in " +
                                std::string(DTypeName(dtype)) + ": hand in fp32, bf16 or fp16");
  }
  if (!s.in_micro_batch) STRATA_RETURN_IF_ERROR(BeginMicroBatch());
  const zero::TensorPlace& t = s.layout.tensors[tensor];
  std::vector<int> chunks;  // one, or a run's
  for (int c = s.layout.FirstChunk(tensor); c <= s.layout.LastChunk(tensor); ++c) chunks.push_back(c);
  for (int c : chunks) {
    STRATA_RETURN_IF_ERROR(s.CheckNotFinal(c, "gradient of tensor \"" + s.model.tensors[tensor].name + "\"",
                                           "AccumulateGrad", tensor));
  }
  s.order->Note(zero::UseKind::kGrad, tensor);
  // The gradient was written by the model's kernels.
  STRATA_RETURN_IF_ERROR(s.FailHook(s.WaitForModel(), "AccumulateGrad", tensor));
  for (int c : chunks) {
    if (!s.reducer->Holds(c))
      STRATA_RETURN_IF_ERROR(s.FailHook(s.reducer->Hold(c, chunks), "AccumulateGrad", tensor));
  }
  // A run's chunks have adjacent buffers (GradReducer::Hold): the tensor is one span.
  const bool add = s.reducer->MarkWritten(tensor);
  Status added = s.ops->AddGradient(zero::OpsLane::kTraining, s.reducer->Buffer(t.chunk) + t.offset, grad,
                                    dtype, t.numel, /*overwrite=*/!add);
  STRATA_RETURN_IF_ERROR(s.FailHook(added, "AccumulateGrad", tensor));
  for (int c : chunks) s.CountBackwardUse(c);
  return OkStatus();
}

}  // namespace strata
