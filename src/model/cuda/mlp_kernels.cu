// CUDA kernels of the MLP: a tiled shared-memory GEMM (with strides, so no transposes),
// GELU (tanh approximation, as on the CPU), losses. Every CUDA call is checked.
// nvcc (13.0) reports warning 2810 for assigning to a [[nodiscard]] class type (as in
// status.h's Result); that is not a discarded value, so the diagnostic is suppressed.
#pragma nv_diag_suppress 2810

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>

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

constexpr int kTile = 16;

// C[i, j] = (accumulate ? C : 0) + sum_{p ascending} A(i, p) B(p, j) (+ bias[j]), where
// A(i, p) = a[i * sam + p * sak] and B(p, j) = b[p * sbk + j * sbn]. One thread per element
// of C, so each element's sum order is fixed.
template <typename TA, typename TB>
__global__ void GemmKernel(int64_t m, int64_t n, int64_t k, const TA* a, int64_t sam, int64_t sak,
                           const TB* b, int64_t sbk, int64_t sbn, const TB* bias, float* c, int64_t ldc,
                           bool accumulate) {
  __shared__ float as[kTile][kTile + 1];
  __shared__ float bs[kTile][kTile + 1];
  const int64_t i = static_cast<int64_t>(blockIdx.y) * kTile + threadIdx.y;
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
  float acc = 0.0f;
  if (accumulate && i < m && j < n) acc = c[i * ldc + j];
  for (int64_t p0 = 0; p0 < k; p0 += kTile) {
    const int64_t pa = p0 + threadIdx.x, pb = p0 + threadIdx.y;
    as[threadIdx.y][threadIdx.x] = (i < m && pa < k) ? ToF(a[i * sam + pa * sak]) : 0.0f;
    const int64_t jb = static_cast<int64_t>(blockIdx.x) * kTile + threadIdx.x;
    bs[threadIdx.y][threadIdx.x] = (pb < k && jb < n) ? ToF(b[pb * sbk + jb * sbn]) : 0.0f;
    __syncthreads();
    const int steps = k - p0 < kTile ? static_cast<int>(k - p0) : kTile;
    for (int p = 0; p < steps; ++p) acc = fmaf(as[threadIdx.y][p], bs[p][threadIdx.x], acc);
    __syncthreads();
  }
  if (i < m && j < n) c[i * ldc + j] = bias != nullptr ? acc + ToF(bias[j]) : acc;
}

template <typename TA, typename TB>
Status Gemm(cudaStream_t stream, int64_t m, int64_t n, int64_t k, const TA* a, int64_t sam, int64_t sak,
            const TB* b, int64_t sbk, int64_t sbn, const TB* bias, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return OkStatus();
  const dim3 block(kTile, kTile);
  const int64_t gx = (n + kTile - 1) / kTile, gy = (m + kTile - 1) / kTile;
  if (gy > 65535)
    return InvalidArgumentError("model CUDA: GEMM with too many rows (" + std::to_string(m) + ")");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy));
  GemmKernel<TA, TB><<<grid, block, 0, stream>>>(m, n, k, a, sam, sak, b, sbk, sbn, bias, c, ldc, accumulate);
  return LaunchStatus("GEMM launch");
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

// dx [batch, in] = dy [batch, out] W [out, in].
Status InputGrad(cudaStream_t s, const float* dy, int64_t batch, int64_t in, int64_t out, const void* weight,
                 DType dtype, float* dx) {
  switch (dtype) {
    case DType::kF32:
      return Gemm<float, float>(s, batch, in, out, dy, out, 1, static_cast<const float*>(weight), in, 1,
                                nullptr, dx, in, false);
    case DType::kBf16:
      return Gemm<float, __nv_bfloat16>(s, batch, in, out, dy, out, 1,
                                        static_cast<const __nv_bfloat16*>(weight), in, 1, nullptr, dx, in,
                                        false);
    case DType::kFp16:
      return Gemm<float, __half>(s, batch, in, out, dy, out, 1, static_cast<const __half*>(weight), in, 1,
                                 nullptr, dx, in, false);
  }
  return InvalidArgumentError("model CUDA: unknown dtype");
}

unsigned Blocks(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

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
  // B(p = i, j = o) = W[o, i]: strides (1, in).
  switch (dtype) {
    case DType::kF32:
      return Gemm(AsStream(stream), batch, out, in, x, in, 1, static_cast<const float*>(weight), 1, in,
                  static_cast<const float*>(bias), y, out, false);
    case DType::kBf16:
      return Gemm(AsStream(stream), batch, out, in, x, in, 1, static_cast<const __nv_bfloat16*>(weight), 1,
                  in, static_cast<const __nv_bfloat16*>(bias), y, out, false);
    case DType::kFp16:
      return Gemm(AsStream(stream), batch, out, in, x, in, 1, static_cast<const __half*>(weight), 1, in,
                  static_cast<const __half*>(bias), y, out, false);
  }
  return InvalidArgumentError("model CUDA: unknown dtype");
}

Status LinearBackward(void* stream, const float* x, const float* dy, int64_t batch, int64_t in, int64_t out,
                      const void* weight, DType dtype, float* dx, float* dweight, float* dbias,
                      bool accumulate) {
  cudaStream_t s = AsStream(stream);
  if (dx != nullptr) STRATA_RETURN_IF_ERROR(InputGrad(s, dy, batch, in, out, weight, dtype, dx));
  // dW [out, in] = dy^T x: A(i = o, p = b) = dy[b * out + o].
  Status st = Gemm<float, float>(s, out, in, batch, dy, 1, out, x, in, 1, nullptr, dweight, in, accumulate);
  STRATA_RETURN_IF_ERROR(st);
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

}  // namespace strata::model::cuda
