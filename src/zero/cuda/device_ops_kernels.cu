// The engine's element-wise kernels on the GPU (see device_ops_kernels.h). Grid-stride
// loops with a bounded grid: the shards are up to a few hundred million elements.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "zero/cuda/device_ops_kernels.h"

namespace strata::zero::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(size_t n) {
  const size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b == 0 ? 1 : (b < 8192 ? b : 8192));
}

__global__ void AccumulateKernel(float* dst, const float* src, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    dst[i] += src[i];
  }
}

template <typename Load>
__global__ void AddGradientKernel(float* dst, Load load, size_t n, bool overwrite) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = (overwrite ? 0.0f : dst[i]) + load(i);
  }
}

struct LoadF32 {
  const float* p;
  __device__ float operator()(size_t i) const { return p[i]; }
};
struct LoadBf16 {
  const unsigned short* p;
  __device__ float operator()(size_t i) const { return __uint_as_float(static_cast<unsigned>(p[i]) << 16); }
};
struct LoadFp16 {
  const __half* p;
  __device__ float operator()(size_t i) const { return __half2float(p[i]); }
};

__global__ void RoundThroughFp16Kernel(float* x, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    x[i] = __half2float(__float2half_rn(x[i]));
  }
}

// Gradient statistics in two passes. Pass 1: grid (kStatBlocks, shards of the batch);
// block b of shard s sums the squares of elements b * 256 + t + k * (kStatBlocks * 256)
// and writes one partial. Pass 2: one block adds every partial in index order per thread,
// then a fixed tree. Kernel parameters stay under the classic 4 KiB limit.
constexpr int kStatBlocks = 512;  // x 256 threads: enough in flight to stream HBM
constexpr int kShardsPerLaunch = 128;

struct StatsBatch {
  StatsShard s[kShardsPerLaunch];
  int count;
};

struct Partial {
  double sum_sq;
  int flag;
};

__device__ float LoadGrad(const StatsShard& s, uint64_t i) {
  if (s.type == 0) return static_cast<const float*>(s.data)[i];
  if (s.type == 1)
    return __uint_as_float(static_cast<uint32_t>(static_cast<const uint16_t*>(s.data)[i]) << 16);
  return __half2float(static_cast<const __half*>(s.data)[i]);
}

// Sums sums[0..kThreads) and ors flags into element 0, always in the same order.
__device__ void BlockReduce(double* sums, int* flags) {
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) {
      sums[threadIdx.x] += sums[threadIdx.x + w];
      flags[threadIdx.x] |= flags[threadIdx.x + w];
    }
    __syncthreads();
  }
}

__global__ void StatsPartialKernel(StatsBatch batch, Partial* partials) {
  const StatsShard& s = batch.s[blockIdx.y];
  const uint64_t stride = uint64_t{kStatBlocks} * kThreads;
  double acc = 0;
  int bad = 0;
  for (uint64_t i = uint64_t{blockIdx.x} * kThreads + threadIdx.x; i < s.n; i += stride) {
    const float x = LoadGrad(s, i);
    bad |= !isfinite(x);
    acc += static_cast<double>(x) * x;  // exact: a float's square fits a double
  }
  __shared__ double sums[kThreads];
  __shared__ int flags[kThreads];
  sums[threadIdx.x] = acc;
  flags[threadIdx.x] = bad;
  BlockReduce(sums, flags);
  if (threadIdx.x == 0)
    partials[uint64_t{blockIdx.y} * kStatBlocks + blockIdx.x] = Partial{sums[0], flags[0]};
}

__global__ void StatsFinalKernel(const Partial* partials, uint64_t count, Partial* result) {
  double acc = 0;
  int bad = 0;
  for (uint64_t i = threadIdx.x; i < count; i += kThreads) {
    acc += partials[i].sum_sq;
    bad |= partials[i].flag;
  }
  __shared__ double sums[kThreads];
  __shared__ int flags[kThreads];
  sums[threadIdx.x] = acc;
  flags[threadIdx.x] = bad;
  BlockReduce(sums, flags);
  if (threadIdx.x == 0) *result = Partial{sums[0], flags[0]};
}

}  // namespace

int LaunchAccumulate(float* dst, const float* src, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  AccumulateKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(dst, src, n);
  return static_cast<int>(cudaGetLastError());
}

int LaunchAddGradient(float* dst, const void* src, int src_bits, size_t n, bool overwrite, void* stream) {
  if (n == 0) return cudaSuccess;
  auto s = static_cast<cudaStream_t>(stream);
  if (src_bits == 32) {
    AddGradientKernel<<<Blocks(n), kThreads, 0, s>>>(dst, LoadF32{static_cast<const float*>(src)}, n, overwrite);
  } else if (src_bits == 16) {
    AddGradientKernel<<<Blocks(n), kThreads, 0, s>>>(dst, LoadBf16{static_cast<const unsigned short*>(src)}, n,
                                                     overwrite);
  } else {
    AddGradientKernel<<<Blocks(n), kThreads, 0, s>>>(dst, LoadFp16{static_cast<const __half*>(src)}, n, overwrite);
  }
  return static_cast<int>(cudaGetLastError());
}

int LaunchRoundThroughFp16(float* x, size_t n, void* stream) {
  if (n == 0) return cudaSuccess;
  RoundThroughFp16Kernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x, n);
  return static_cast<int>(cudaGetLastError());
}

size_t GradStatsScratchBytes(size_t count) {
  const size_t bytes = count * kStatBlocks * sizeof(Partial);
  return (bytes + 255) / 256 * 256;
}

int LaunchGradStats(const StatsShard* shards, size_t count, void* scratch, void* result, void* stream_ptr) {
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  auto* partials = static_cast<Partial*>(scratch);
  for (size_t first = 0; first < count; first += kShardsPerLaunch) {
    StatsBatch batch;
    batch.count = static_cast<int>(count - first < kShardsPerLaunch ? count - first : kShardsPerLaunch);
    for (int i = 0; i < batch.count; ++i) batch.s[i] = shards[first + i];
    const dim3 grid(kStatBlocks, static_cast<unsigned>(batch.count));
    StatsPartialKernel<<<grid, kThreads, 0, stream>>>(batch, partials + first * kStatBlocks);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return static_cast<int>(err);
  }
  StatsFinalKernel<<<1, kThreads, 0, stream>>>(partials, uint64_t{count} * kStatBlocks,
                                               static_cast<Partial*>(result));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace strata::zero::cuda
