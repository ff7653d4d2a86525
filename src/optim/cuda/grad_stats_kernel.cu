// The fused inf/NaN + sum-of-squares pass on the GPU: blockIdx.y = shard, each block
// strides over its shard, reduces in double through shared memory, and adds its partial
// into the scratch (double sum, int flag) with one atomic per block.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "optim/cuda/launch.h"

namespace strata::optim::cuda {
namespace {

constexpr int kThreads = 256;

struct Scratch {
  double sum_sq;
  int flag;
};

__global__ void GradStatsKernel(GradStatsBatch batch, Scratch* out) {
  const GradShardArgs& s = batch.s[blockIdx.y];
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  double acc = 0;
  int bad = 0;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < s.n; i += stride) {
    float x;
    if (s.type == 0) {
      x = static_cast<const float*>(s.g)[i];
    } else if (s.type == 1) {
      x = __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(s.g)[i]) << 16);
    } else {
      x = __half2float(static_cast<const __half*>(s.g)[i]);
    }
    bad |= !isfinite(x);
    acc += static_cast<double>(x) * x;
  }
  __shared__ double sums[kThreads];
  __shared__ int flags[kThreads];
  sums[threadIdx.x] = acc;
  flags[threadIdx.x] = bad;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sums[threadIdx.x] += sums[threadIdx.x + w];
      flags[threadIdx.x] |= flags[threadIdx.x + w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&out->sum_sq, sums[0]);
    if (flags[0]) atomicOr(&out->flag, 1);
  }
}

}  // namespace

int LaunchGradStats(const GradStatsBatch& batch, uint64_t max_n, void* scratch, void* stream,
                    const char** what) {
  if (batch.count == 0 || max_n == 0) return 0;
  uint64_t blocks = (max_n + kThreads - 1) / kThreads;
  if (blocks > 1024) blocks = 1024;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(batch.count));
  GradStatsKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(batch,
                                                                            static_cast<Scratch*>(scratch));
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) *what = "GradStatsKernel launch";
  return static_cast<int>(err);
}

int RunGradStats(const GradStatsBatch* batches, int count, const uint64_t* max_ns, void* stream_ptr,
                 double* sum_sq, int* flag, const char** what) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  Scratch* scratch = nullptr;
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&scratch), sizeof(Scratch), stream);
  if (err != cudaSuccess) {
    *what = "cudaMallocAsync (grad stats scratch)";
    return static_cast<int>(err);
  }
  Scratch host{0, 0};
  err = cudaMemsetAsync(scratch, 0, sizeof(Scratch), stream);
  if (err != cudaSuccess) *what = "cudaMemsetAsync (grad stats scratch)";
  for (int b = 0; b < count && err == cudaSuccess; ++b) {
    err = static_cast<cudaError_t>(LaunchGradStats(batches[b], max_ns[b], scratch, stream, what));
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(&host, scratch, sizeof(Scratch), cudaMemcpyDeviceToHost, stream);
    if (err != cudaSuccess) *what = "cudaMemcpyAsync (grad stats result)";
  }
  const cudaError_t free_err = cudaFreeAsync(scratch, stream);
  if (err == cudaSuccess && free_err != cudaSuccess) {
    err = free_err;
    *what = "cudaFreeAsync (grad stats scratch)";
  }
  if (err == cudaSuccess) {
    err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) *what = "cudaStreamSynchronize (grad stats)";
  }
  *sum_sq = host.sum_sq;
  *flag = host.flag;
  return static_cast<int>(err);
}

}  // namespace strata::optim::cuda
