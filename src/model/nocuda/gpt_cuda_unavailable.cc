// The GPT's CUDA kernels in a build without CUDA: every call says so.
#include <memory>
#include <string>

#include "model/gpt_ops.h"
#include "model/nocuda/no_cuda.h"
#include "strata/gpt_cuda.h"

namespace strata::model::cuda {

Status EmbeddingForward(void*, const int32_t*, const void*, const void*, DType, int64_t, int64_t, int64_t,
                        int64_t, float*) {
  return NoCuda("EmbeddingForward");
}
Status EmbeddingBackward(void*, const int32_t*, const float*, int64_t, int64_t, int64_t, int64_t, float*,
                         float*, bool, bool) {
  return NoCuda("EmbeddingBackward");
}
Status LayerNormForward(void*, const float*, const void*, const void*, DType, int64_t, int64_t, float*,
                        float*, float*) {
  return NoCuda("LayerNormForward");
}
Status LayerNormBackward(void*, const float*, const float*, const void*, DType, const float*, const float*,
                         int64_t, int64_t, float*, float*, float*, bool) {
  return NoCuda("LayerNormBackward");
}
Status AttentionForward(void*, const float*, int64_t, int64_t, int64_t, int64_t, float*, float*) {
  return NoCuda("AttentionForward");
}
Status AttentionBackward(void*, const float*, const float*, const float*, int64_t, int64_t, int64_t, int64_t,
                         float*) {
  return NoCuda("AttentionBackward");
}
Status CrossEntropyForwardBackward(void*, const float*, const int32_t*, int64_t, int64_t, double, double*,
                                   double*, float*) {
  return NoCuda("CrossEntropyForwardBackward");
}

Status AddInPlace(void*, float*, const float*, int64_t) { return NoCuda("AddInPlace"); }

}  // namespace strata::model::cuda

namespace strata::model {

Result<std::unique_ptr<GptOps>> CreateCudaGptOps(void*) { return cuda::NoCuda("the GPT's CUDA backend"); }

}  // namespace strata::model
