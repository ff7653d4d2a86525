// The engine's side of the gradient reduction (grad_reducer.h reduces): the end of a
// micro-batch, and where a reduced part goes, the gradient shard on the optimizer's tier:
// the device, pinned host memory (through host_recv, engine_grads.cc), or NVMe.
#include "strata/log.h"
#include "zero/engine_impl.h"

namespace strata {

Status Engine::Impl::EndMicroBatch() {
  if (open_backward >= 0) {
    return FailedPreconditionError("engine: the micro-batch ended while the backward of module \"" +
                                   model.modules[open_backward].name +
                                   "\" is open (BeginBackward without EndBackward)");
  }
  STRATA_RETURN_IF_ERROR(reducer->EndMicroBatch(LastMicroBatch()));
  if (std::optional<std::string> change = order->EndMicroBatch()) STRATA_LOG(kInfo, "engine") << *change;
  return OkStatus();
}

Status Engine::Impl::TakeReduced(int chunk, const float* part, bool first_in_window, bool last) {
  const ZeroTier tier = GradTierOf(chunk);
  if (tier == ZeroTier::kNvme) {  // speculates itself
    return stream_grads ? AccumulateGradPieces(chunk, part, first_in_window, last)
                        : AccumulateGradOnNvme(chunk, part, first_in_window, last);
  }
  STRATA_RETURN_IF_ERROR(tier == ZeroTier::kHost ? AccumulateToHost(opt[chunk].grad, part)
                                                 : OpsOn(tier).Accumulate(zero::OpsLane::kReduce,
                                                                          opt[chunk].grad, part, opt_elems));
  if (last) MaybeSpeculate(chunk);
  return OkStatus();
}

}  // namespace strata
