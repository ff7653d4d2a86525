// Launchers of the GPT's CUDA kernels (gpt_*_kernels.cu), behind plain types so that the
// adapter (gpt_cuda.cc) is ordinary C++ that turns their cudaError_t into Statuses. Each
// enqueues on `stream` and returns the launch's error (cudaGetLastError, or the first
// failing runtime call); the arguments are checked by the caller (non-null where used,
// sizes positive unless said otherwise, channels % heads == 0).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "strata/dtype.h"

namespace strata::model::cuda {

// --- gpt_embedding_kernels.cu
cudaError_t LaunchEmbeddingForward(const int32_t* tokens, const void* wte, const void* wpe, DType dtype,
                                   int64_t batch, int64_t seq, int64_t channels, int64_t vocab, float* out,
                                   cudaStream_t stream);
// dwpe rows t < seq (batch may be 0: zeros, or unchanged with accumulate).
cudaError_t LaunchPositionGrad(const float* dout, int64_t batch, int64_t seq, int64_t channels, float* dwpe,
                               bool accumulate, cudaStream_t stream);
// Scratch bytes LaunchTokenGrad needs for n = batch * seq positions (n < 2^31).
cudaError_t TokenGradScratchBytes(int64_t n, int64_t vocab, size_t* bytes);
// dwte [vocab, channels] from the n positions' dout rows; `scratch` has
// TokenGradScratchBytes bytes, 256-byte aligned, and stays valid for the enqueued work.
cudaError_t LaunchTokenGrad(const int32_t* tokens, const float* dout, int64_t n, int64_t channels,
                            int64_t vocab, float* dwte, bool accumulate, void* scratch, size_t scratch_bytes,
                            cudaStream_t stream);

// --- gpt_layernorm_kernels.cu
cudaError_t LaunchLayerNormForward(const float* x, const void* weight, const void* bias, DType dtype,
                                   int64_t rows, int64_t channels, float* y, float* mean, float* rstd,
                                   cudaStream_t stream);
// Floats of scratch LaunchLayerNormBackward needs (the pieces' partial sums).
size_t LayerNormGradScratchFloats(int64_t rows, int64_t channels);
// dx may be null or alias dy; rows may be 0 (then dweight, dbias are zeroed or kept).
cudaError_t LaunchLayerNormBackward(const float* x, const float* dy, const void* weight, DType dtype,
                                    const float* mean, const float* rstd, int64_t rows, int64_t channels,
                                    float* dx, float* dweight, float* dbias, bool accumulate, float* scratch,
                                    cudaStream_t stream);

// --- gpt_softmax_kernels.cu
// att holds `mats` [seq, seq] raw scores q k^T; each row i becomes softmax(scale * row)
// over keys j <= i, zero above the diagonal.
cudaError_t LaunchCausalSoftmax(float* att, int64_t mats, int64_t seq, float scale, cudaStream_t stream);
// datt holds d out / d att; it becomes d out / d (raw scores) = scale * att * (datt - dot),
// zero above the diagonal.
cudaError_t LaunchCausalSoftmaxBackward(const float* att, float* datt, int64_t mats, int64_t seq, float scale,
                                        cudaStream_t stream);
// row_loss [rows], loss (nullable: the row-ordered sum), dlogits (nullable, may alias
// logits); rows may be 0.
cudaError_t LaunchCrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                               double normaliser, double* row_loss, double* loss, float* dlogits,
                               cudaStream_t stream);

// --- gpt_residual_kernels.cu
// y[i] += x[i] for i < n (n may be 0).
cudaError_t LaunchAddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream);

}  // namespace strata::model::cuda
