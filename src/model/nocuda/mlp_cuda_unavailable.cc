// The CUDA kernels in a build without CUDA: every call says so.
#include "model/nocuda/no_cuda.h"
#include "strata/mlp_cuda.h"

namespace strata::model::cuda {

Status DeviceAvailable() { return NoCuda("the CUDA device"); }
Status LinearForward(void*, const float*, int64_t, int64_t, int64_t, const void*, const void*, DType,
                     float*) {
  return NoCuda("LinearForward");
}
Status LinearBackward(void*, const float*, const float*, int64_t, int64_t, int64_t, const void*, DType,
                      float*, float*, float*, bool) {
  return NoCuda("LinearBackward");
}
Status GeluForward(void*, const float*, int64_t, float*) { return NoCuda("GeluForward"); }
Status GeluBackward(void*, const float*, const float*, int64_t, float*) { return NoCuda("GeluBackward"); }
Status LossForwardBackward(void*, LossKind, const float*, const float*, const int32_t*, int64_t, int64_t,
                           double, float*, float*) {
  return NoCuda("LossForwardBackward");
}
Result<void*> Malloc(size_t) { return NoCuda("Malloc"); }
Status Free(void*) { return NoCuda("Free"); }
Status CopyToDevice(void*, const void*, size_t) { return NoCuda("CopyToDevice"); }
Status CopyToHost(void*, const void*, size_t) { return NoCuda("CopyToHost"); }
Status StreamSynchronize(void*) { return NoCuda("StreamSynchronize"); }
Status Zero(void*, float*, int64_t) { return NoCuda("Zero"); }

}  // namespace strata::model::cuda
