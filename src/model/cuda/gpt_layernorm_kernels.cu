// The GPT's LayerNorm kernels: one warp per row for the statistics and dx; the weight and
// bias gradients in the CPU kernel's order (pieces of kLayerNormChunk rows summed in row
// order, then the pieces in ascending order), with explicit roundings so that no fused
// multiply-add changes that arithmetic.
#include "model/cuda/gpt_device.cuh"
#include "model/cuda/gpt_launch.h"
#include "strata/gpt_kernels.h"

namespace strata::model::cuda {
namespace {

// As in the CPU kernel (gpt_kernels.cc): rows per piece of the weight-gradient sums.
constexpr int64_t kLayerNormChunk = 32;

template <typename T>
__global__ void ForwardKernel(const float* x, const T* weight, const T* bias, int64_t rows, int64_t channels,
                              float* y, float* mean, float* rstd) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (row >= rows) return;
  const float* xr = x + row * channels;
  float sum = 0.0f;
  for (int64_t c = lane; c < channels; c += kWarp) sum += xr[c];
  const float m = WarpReduce(sum, SumOp{}) / static_cast<float>(channels);
  // Centred squares, as on the CPU (E[x^2] - m^2 cancels badly).
  float var = 0.0f;
  for (int64_t c = lane; c < channels; c += kWarp) {
    const float d = xr[c] - m;
    var += d * d;
  }
  const float s = 1.0f / sqrtf(WarpReduce(var, SumOp{}) / static_cast<float>(channels) + kLayerNormEps);
  float* yr = y + row * channels;
  for (int64_t c = lane; c < channels; c += kWarp) yr[c] = (xr[c] - m) * s * ToF(weight[c]) + ToF(bias[c]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// partial [chunks, 2, C]: piece k's sums of dy * xhat and of dy for every channel.
__global__ void PartialGradKernel(const float* x, const float* dy, const float* mean, const float* rstd,
                                  int64_t rows, int64_t channels, float* partial) {
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  const int64_t k = blockIdx.x;
  if (c >= channels) return;
  float pw = 0.0f, pb = 0.0f;
  const int64_t end = min(rows, (k + 1) * kLayerNormChunk);
  for (int64_t i = k * kLayerNormChunk; i < end; ++i) {
    const float xhat = __fmul_rn(__fsub_rn(x[i * channels + c], mean[i]), rstd[i]);
    const float d = dy[i * channels + c];
    pw = __fadd_rn(pw, __fmul_rn(d, xhat));
    pb = __fadd_rn(pb, d);
  }
  partial[k * 2 * channels + c] = pw;
  partial[k * 2 * channels + channels + c] = pb;
}

__global__ void FinishGradKernel(const float* partial, int64_t chunks, int64_t channels, float* dweight,
                                 float* dbias, bool accumulate) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  float w = 0.0f, b = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    w = __fadd_rn(w, partial[k * 2 * channels + c]);
    b = __fadd_rn(b, partial[k * 2 * channels + channels + c]);
  }
  dweight[c] = accumulate ? __fadd_rn(dweight[c], w) : w;
  dbias[c] = accumulate ? __fadd_rn(dbias[c], b) : b;
}

// dx = rstd * (w dy - mean(w dy) - xhat mean(w dy xhat)). Each lane reads dy[c] before it
// writes dx[c] for the same c, so dx may alias dy.
template <typename T>
__global__ void InputGradKernel(const float* x, const float* dy, const T* weight, const float* mean,
                                const float* rstd, int64_t rows, int64_t channels, float* dx) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  if (row >= rows) return;
  const float* xr = x + row * channels;
  const float* dyr = dy + row * channels;
  const float m = mean[row], s = rstd[row];
  float dnorm_sum = 0.0f, dnorm_xhat_sum = 0.0f;
  for (int64_t c = lane; c < channels; c += kWarp) {
    const float dnorm = ToF(weight[c]) * dyr[c];
    dnorm_sum += dnorm;
    dnorm_xhat_sum += dnorm * ((xr[c] - m) * s);
  }
  const float dnorm_mean = WarpReduce(dnorm_sum, SumOp{}) / static_cast<float>(channels);
  const float dnorm_xhat_mean = WarpReduce(dnorm_xhat_sum, SumOp{}) / static_cast<float>(channels);
  float* dxr = dx + row * channels;
  for (int64_t c = lane; c < channels; c += kWarp) {
    const float xhat = (xr[c] - m) * s;
    dxr[c] = s * (ToF(weight[c]) * dyr[c] - dnorm_mean - xhat * dnorm_xhat_mean);
  }
}

}  // namespace

cudaError_t LaunchLayerNormForward(const float* x, const void* weight, const void* bias, DType dtype,
                                   int64_t rows, int64_t channels, float* y, float* mean, float* rstd,
                                   cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  WithParamType(dtype, [&](auto tag) {
    using T = decltype(tag);
    ForwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(
        x, static_cast<const T*>(weight), static_cast<const T*>(bias), rows, channels, y, mean, rstd);
  });
  return cudaGetLastError();
}

size_t LayerNormGradScratchFloats(int64_t rows, int64_t channels) {
  const int64_t chunks = (rows + kLayerNormChunk - 1) / kLayerNormChunk;
  return static_cast<size_t>(chunks * 2 * channels);
}

cudaError_t LaunchLayerNormBackward(const float* x, const float* dy, const void* weight, DType dtype,
                                    const float* mean, const float* rstd, int64_t rows, int64_t channels,
                                    float* dx, float* dweight, float* dbias, bool accumulate, float* scratch,
                                    cudaStream_t stream) {
  const int64_t chunks = (rows + kLayerNormChunk - 1) / kLayerNormChunk;
  const unsigned channel_blocks = static_cast<unsigned>((channels + kThreads - 1) / kThreads);
  if (chunks > 0) {
    // Before dx: it may overwrite dy.
    PartialGradKernel<<<dim3(static_cast<unsigned>(chunks), channel_blocks), kThreads, 0, stream>>>(
        x, dy, mean, rstd, rows, channels, scratch);
  }
  FinishGradKernel<<<channel_blocks, kThreads, 0, stream>>>(scratch, chunks, channels, dweight, dbias,
                                                            accumulate);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || dx == nullptr || rows == 0) return err;
  WithParamType(dtype, [&](auto tag) {
    using T = decltype(tag);
    InputGradKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(x, dy, static_cast<const T*>(weight), mean,
                                                              rstd, rows, channels, dx);
  });
  return cudaGetLastError();
}

}  // namespace strata::model::cuda
