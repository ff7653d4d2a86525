// The GPT's softmax kernels: the attention's causal softmax (one warp per score row) and
// its backward, and the cross-entropy over the vocabulary (one block per row, the loss in
// double as on the CPU, the rows' terms added in row order by one thread).
#include <cmath>

#include "model/cuda/gpt_device.cuh"
#include "model/cuda/gpt_launch.h"

namespace strata::model::cuda {
namespace {

constexpr int kVocabThreads = 512;

// Row r of the [mats * seq, seq] scores is query i = r % seq; keys j <= i are live. The
// scaled score is rounded before the max is subtracted, as the CPU kernel stores it.
__global__ void CausalSoftmaxKernel(float* att, int64_t rows, int64_t seq, float scale) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;
  const int64_t i = r % seq;
  float* row = att + r * seq;
  float row_max = -INFINITY;
  for (int64_t j = lane; j <= i; j += kWarp) row_max = fmaxf(row_max, __fmul_rn(row[j], scale));
  row_max = WarpReduce(row_max, MaxOp{});
  float sum = 0.0f;
  for (int64_t j = lane; j <= i; j += kWarp) {
    const float e = expf(__fmul_rn(row[j], scale) - row_max);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpReduce(sum, SumOp{});
  for (int64_t j = lane; j <= i; j += kWarp) row[j] *= inv;
  for (int64_t j = i + 1 + lane; j < seq; j += kWarp) row[j] = 0.0f;
}

// d = scale * a * (d - sum_j a_j d_j) over the live keys, zero above the diagonal.
__global__ void CausalSoftmaxBackwardKernel(const float* att, float* datt, int64_t rows, int64_t seq,
                                            float scale) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (r >= rows) return;
  const int64_t i = r % seq;
  const float* a = att + r * seq;
  float* d = datt + r * seq;
  float dot = 0.0f;
  for (int64_t j = lane; j <= i; j += kWarp) dot += a[j] * d[j];
  dot = WarpReduce(dot, SumOp{});
  for (int64_t j = lane; j <= i; j += kWarp) d[j] = scale * a[j] * (d[j] - dot);
  for (int64_t j = i + 1 + lane; j < seq; j += kWarp) d[j] = 0.0f;
}

// Block r: row r. Every read of the row (the target's logit included) happens before the
// block's last barrier, every write of dlogits after it, so dlogits may alias logits.
__global__ void CrossEntropyKernel(const float* logits, const int32_t* targets, int64_t vocab,
                                   double normaliser, double* row_loss, float* dlogits) {
  __shared__ float shared_max[kWarp];
  __shared__ double shared_sum[kWarp];
  const int64_t r = blockIdx.x;
  const float* y = logits + r * vocab;
  const int32_t target = targets[r];
  const bool valid = target >= 0 && target < vocab;
  const float y_target = valid ? y[target] : 0.0f;
  float row_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) row_max = fmaxf(row_max, y[j]);
  row_max = BlockReduce(row_max, MaxOp{}, -INFINITY, shared_max);
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += exp(static_cast<double>(y[j]) - row_max);
  const double lse = log(BlockReduce(sum, SumOp{}, 0.0, shared_sum)) + row_max;
  if (threadIdx.x == 0) row_loss[r] = valid ? (lse - y_target) / normaliser : NAN;
  if (dlogits == nullptr) return;
  float* d = dlogits + r * vocab;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const double p = exp(static_cast<double>(y[j]) - lse);
    d[j] = valid ? static_cast<float>((p - (j == target ? 1.0 : 0.0)) / normaliser) : NAN;
  }
}

// The CPU's order: one sum, row after row.
__global__ void SumInOrderKernel(const double* row_loss, int64_t rows, double* loss) {
  double total = 0.0;
  for (int64_t r = 0; r < rows; ++r) total += row_loss[r];
  *loss = total;
}

}  // namespace

cudaError_t LaunchCausalSoftmax(float* att, int64_t mats, int64_t seq, float scale, cudaStream_t stream) {
  const int64_t rows = mats * seq;
  if (rows == 0) return cudaSuccess;
  CausalSoftmaxKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(att, rows, seq, scale);
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmaxBackward(const float* att, float* datt, int64_t mats, int64_t seq, float scale,
                                        cudaStream_t stream) {
  const int64_t rows = mats * seq;
  if (rows == 0) return cudaSuccess;
  CausalSoftmaxBackwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(att, datt, rows, seq, scale);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropy(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                               double normaliser, double* row_loss, double* loss, float* dlogits,
                               cudaStream_t stream) {
  if (rows > 0) {
    CrossEntropyKernel<<<static_cast<unsigned>(rows), kVocabThreads, 0, stream>>>(
        logits, targets, vocab, normaliser, row_loss, dlogits);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (loss == nullptr) return cudaSuccess;
  SumInOrderKernel<<<1, 1, 0, stream>>>(row_loss, rows, loss);
  return cudaGetLastError();
}

}  // namespace strata::model::cuda
