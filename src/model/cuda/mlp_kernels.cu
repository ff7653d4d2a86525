// CUDA kernels of the MLP: the Linear layers' matrix products on cuBLAS (matmul.h) with
// their bias kernels, GELU (tanh approximation, as on the CPU), losses. Every CUDA call is
// checked.
// nvcc (13.0) reports warning 2810 for assigning to a [[nodiscard]] class type (as in
// status.h's Result); that is not a discarded value, so the diagnostic is suppressed.
#pragma nv_diag_suppress 2810

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

#include "model/cuda/matmul.h"
#include "strata/mlp_cuda.h"

namespace strata::model::cuda {

namespace {

Status CudaError(cudaError_t err, const char* what) {
  return InternalError(std::string("model CUDA: ") + what + ": " + cudaGetErrorName(err) + " (" +
                       cudaGetErrorString(err) + ")");
}

#define STRATA_CUDA_RETURN(call, what)                                   \
  do {                                                                   \
    cudaError_t strata_err_ = (call);                                    \
    if (strata_err_ != cudaSuccess) return CudaError(strata_err_, what); \
  } while (0)

Status LaunchStatus(const char* what) {
  STRATA_CUDA_RETURN(cudaGetLastError(), what);
  return OkStatus();
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }

// y[b, o] += bias[o]: after the product, as the CPU kernel adds it (sum first, then bias).
template <typename T>
__global__ void BiasAddKernel(const T* bias, int64_t batch, int64_t out, float* y) {
  const int64_t n = batch * out;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += ToF(bias[i % out]);
  }
}

__global__ void BiasGradKernel(const float* dy, int64_t batch, int64_t out, float* db, bool accumulate) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= out) return;
  float acc = 0.0f;
  for (int64_t b = 0; b < batch; ++b) acc += dy[b * out + o];
  db[o] = accumulate ? db[o] + acc : acc;
}

constexpr float kGeluK0 = 0.7978845608028654f;
constexpr float kGeluK1 = 0.044715f;

__global__ void GeluForwardKernel(const float* x, int64_t n, float* y) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float t = tanhf(kGeluK0 * (v + kGeluK1 * v * v * v));
  y[i] = 0.5f * v * (1.0f + t);
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, int64_t n, float* dx) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float t = tanhf(kGeluK0 * (v + kGeluK1 * v * v * v));
  const float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kGeluK0 * (1.0f + 3.0f * kGeluK1 * v * v);
  dx[i] = dy[i] * d;
}

__global__ void LossKernel(bool mse, const float* y, const float* targets, const int32_t* labels,
                           int64_t batch, int64_t out, double normaliser, float* sample_loss, float* dy) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= batch) return;
  const float* yb = y + b * out;
  double loss = 0.0;
  if (mse) {
    const float* tb = targets + b * out;
    const float scale = static_cast<float>(2.0 / (normaliser * static_cast<double>(out)));
    for (int64_t j = 0; j < out; ++j) {
      const float d = yb[j] - tb[j];
      loss += static_cast<double>(d) * d;
      if (dy != nullptr) dy[b * out + j] = scale * d;
    }
    loss /= normaliser * static_cast<double>(out);
  } else {
    int32_t label = labels[b];
    if (label < 0 || label >= out) label = 0;  // the host checks labels before launching
    float m = yb[0];
    for (int64_t j = 1; j < out; ++j) m = fmaxf(m, yb[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < out; ++j) sum += exp(static_cast<double>(yb[j] - m));
    const double lse = log(sum) + m;
    loss = (lse - yb[label]) / normaliser;
    if (dy != nullptr) {
      for (int64_t j = 0; j < out; ++j) {
        const double p = exp(static_cast<double>(yb[j]) - lse);
        dy[b * out + j] = static_cast<float>((p - (j == label ? 1.0 : 0.0)) / normaliser);
      }
    }
  }
  sample_loss[b] = static_cast<float>(loss);
}

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// A grid-stride launch over n elements: at most 8192 blocks of 256.
unsigned StrideBlocks(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 1 ? 1 : (b < 8192 ? b : 8192));
}

Status AddBias(cudaStream_t s, const void* bias, DType dtype, int64_t batch, int64_t out, float* y) {
  if (batch <= 0 || out <= 0) return OkStatus();
  switch (dtype) {
    case DType::kF32:
      BiasAddKernel<<<StrideBlocks(batch * out), 256, 0, s>>>(static_cast<const float*>(bias), batch, out, y);
      break;
    case DType::kBf16:
      BiasAddKernel<<<StrideBlocks(batch * out), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(bias), batch,
                                                              out, y);
      break;
    case DType::kFp16:
      BiasAddKernel<<<StrideBlocks(batch * out), 256, 0, s>>>(static_cast<const __half*>(bias), batch, out,
                                                              y);
      break;
  }
  return LaunchStatus("bias launch");
}

}  // namespace

Status DeviceAvailable() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    return UnavailableError(std::string("no usable CUDA device: ") + cudaGetErrorName(err) + " (" +
                            cudaGetErrorString(err) + ")");
  }
  if (count == 0) return UnavailableError("no CUDA device present");
  return OkStatus();
}

Status LinearForward(void* stream, const float* x, int64_t batch, int64_t in, int64_t out, const void* weight,
                     const void* bias, DType dtype, float* y) {
  if (dtype != DType::kF32 && dtype != DType::kBf16 && dtype != DType::kFp16) {
    return InvalidArgumentError("model CUDA: unknown dtype");
  }
  STRATA_RETURN_IF_ERROR(MatmulForward(stream, x, batch, in, out, weight, dtype, y));
  return AddBias(AsStream(stream), bias, dtype, batch, out, y);
}

Status LinearBackward(void* stream, const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                      const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                      bool accumulate) {
  if (dtype != DType::kF32 && dtype != DType::kBf16 && dtype != DType::kFp16) {
    return InvalidArgumentError("model CUDA: unknown dtype");
  }
  cudaStream_t s = AsStream(stream);
  STRATA_RETURN_IF_ERROR(
      MatmulBackward(stream, x, dy, batch, in, out, weight, dtype, dx, dweight, accumulate));
  if (out <= 0) return OkStatus();
  BiasGradKernel<<<Blocks(out, 256), 256, 0, s>>>(dy, batch, out, dbias, accumulate);
  return LaunchStatus("bias gradient launch");
}

Status GeluForward(void* stream, const float* x, int64_t n, float* y) {
  if (n <= 0) return OkStatus();
  GeluForwardKernel<<<Blocks(n, 256), 256, 0, AsStream(stream)>>>(x, n, y);
  return LaunchStatus("GELU forward launch");
}

Status GeluBackward(void* stream, const float* x, const float* dy, int64_t n, float* dx) {
  if (n <= 0) return OkStatus();
  GeluBackwardKernel<<<Blocks(n, 256), 256, 0, AsStream(stream)>>>(x, dy, n, dx);
  return LaunchStatus("GELU backward launch");
}

Status LossForwardBackward(void* stream, LossKind kind, const float* y, const float* targets,
                           const int32_t* labels, int64_t batch, int64_t out, double normaliser,
                           float* sample_loss, float* dy) {
  if (!(normaliser > 0)) return InvalidArgumentError("model CUDA: loss normaliser must be > 0");
  if (batch <= 0) return OkStatus();
  LossKernel<<<Blocks(batch, 128), 128, 0, AsStream(stream)>>>(kind == LossKind::kMse, y, targets, labels,
                                                               batch, out, normaliser, sample_loss, dy);
  return LaunchStatus("loss launch");
}

Result<void*> Malloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes);
  if (err != cudaSuccess) {
    // A failed allocation is also recorded as the thread's last error; clear it so the next
    // launch check does not report it again.
    (void)cudaGetLastError();
    return CudaError(err, ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str());
  }
  return ptr;
}

Status Free(void* ptr) {
  STRATA_CUDA_RETURN(cudaFree(ptr), "cudaFree");
  return OkStatus();
}

Status CopyToDevice(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy host to device");
  return OkStatus();
}

Status CopyToHost(void* dst, const void* src, size_t bytes) {
  STRATA_CUDA_RETURN(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy device to host");
  return OkStatus();
}

Status StreamSynchronize(void* stream) {
  STRATA_CUDA_RETURN(cudaStreamSynchronize(AsStream(stream)), "cudaStreamSynchronize");
  return OkStatus();
}

Status Zero(void* stream, float* ptr, int64_t n) {
  STRATA_CUDA_RETURN(cudaMemsetAsync(ptr, 0, n * sizeof(float), AsStream(stream)), "cudaMemsetAsync");
  return OkStatus();
}

}  // namespace strata::model::cuda
