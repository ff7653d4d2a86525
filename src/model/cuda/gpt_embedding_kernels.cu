// The GPT's embedding kernels. The token-embedding gradient is deterministic without float
// atomics: a stable radix sort groups the positions by token (ascending (b, t) within a
// token), and one block owns each token's row and adds its positions in that order, as
// the CPU kernel does.
#include <cmath>
#include <cub/device/device_radix_sort.cuh>

#include "model/cuda/gpt_device.cuh"
#include "model/cuda/gpt_launch.h"

namespace strata::model::cuda {
namespace {

template <typename T>
__global__ void EmbeddingForwardKernel(const int32_t* tokens, const T* wte, const T* wpe, int64_t n,
                                       int64_t seq, int64_t channels, int64_t vocab, float* out) {
  const int64_t total = n * channels;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t bt = i / channels, c = i % channels;
    const int32_t token = tokens[bt];
    out[i] = token >= 0 && token < vocab
                 ? ToF(wte[token * channels + c]) + ToF(wpe[(bt % seq) * channels + c])
                 : NAN;
  }
}

// One thread per (t, c): the batch in ascending order.
__global__ void PositionGradKernel(const float* dout, int64_t batch, int64_t seq, int64_t channels,
                                   float* dwpe, bool accumulate) {
  const int64_t total = seq * channels;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.0f;
    for (int64_t b = 0; b < batch; ++b) acc += dout[b * total + i];
    dwpe[i] = accumulate ? dwpe[i] + acc : acc;
  }
}

// Sort keys: the token, or `vocab` for an id out of range (sorted last and skipped).
__global__ void SortInputKernel(const int32_t* tokens, int64_t n, int64_t vocab, uint32_t* keys,
                                uint32_t* positions) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t t = tokens[i];
  keys[i] = static_cast<uint32_t>(t >= 0 && t < vocab ? t : vocab);
  positions[i] = static_cast<uint32_t>(i);
}

// Block i owns the token whose run of sorted keys starts at i (other blocks return).
__global__ void TokenGradKernel(const uint32_t* keys, const uint32_t* positions, const float* dout, int64_t n,
                                int64_t channels, int64_t vocab, float* dwte, bool accumulate) {
  const int64_t first = blockIdx.x;
  const uint32_t key = keys[first];
  if ((first > 0 && keys[first - 1] == key) || key >= vocab) return;
  float* g = dwte + static_cast<int64_t>(key) * channels;
  for (int64_t c = threadIdx.x; c < channels; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t p = first; p < n && keys[p] == key; ++p) {
      acc += dout[static_cast<int64_t>(positions[p]) * channels + c];
    }
    g[c] = accumulate ? g[c] + acc : acc;
  }
}

// The key bits the sort needs: keys lie in [0, vocab].
int KeyBits(int64_t vocab) {
  int bits = 1;
  while (bits < 32 && (int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

size_t Align(size_t bytes) { return (bytes + 255) / 256 * 256; }

// The scratch's pieces: keys and positions, in and out, then CUB's temporary storage.
struct SortScratch {
  uint32_t *keys_in, *keys_out, *pos_in, *pos_out;
  void* temp;
  size_t temp_bytes;
};

SortScratch Carve(void* scratch, int64_t n, size_t temp_bytes) {
  char* p = static_cast<char*>(scratch);
  const size_t piece = Align(static_cast<size_t>(n) * sizeof(uint32_t));
  return SortScratch{reinterpret_cast<uint32_t*>(p),
                     reinterpret_cast<uint32_t*>(p + piece),
                     reinterpret_cast<uint32_t*>(p + 2 * piece),
                     reinterpret_cast<uint32_t*>(p + 3 * piece),
                     p + 4 * piece,
                     temp_bytes};
}

}  // namespace

cudaError_t LaunchEmbeddingForward(const int32_t* tokens, const void* wte, const void* wpe, DType dtype,
                                   int64_t batch, int64_t seq, int64_t channels, int64_t vocab, float* out,
                                   cudaStream_t stream) {
  const int64_t n = batch * seq;
  if (n * channels == 0) return cudaSuccess;
  WithParamType(dtype, [&](auto tag) {
    using T = decltype(tag);
    EmbeddingForwardKernel<<<StrideBlocks(n * channels, kThreads), kThreads, 0, stream>>>(
        tokens, static_cast<const T*>(wte), static_cast<const T*>(wpe), n, seq, channels, vocab, out);
  });
  return cudaGetLastError();
}

cudaError_t LaunchPositionGrad(const float* dout, int64_t batch, int64_t seq, int64_t channels, float* dwpe,
                               bool accumulate, cudaStream_t stream) {
  if (seq * channels == 0) return cudaSuccess;
  PositionGradKernel<<<StrideBlocks(seq * channels, kThreads), kThreads, 0, stream>>>(
      dout, batch, seq, channels, dwpe, accumulate);
  return cudaGetLastError();
}

cudaError_t TokenGradScratchBytes(int64_t n, int64_t vocab, size_t* bytes) {
  size_t temp = 0;
  const cudaError_t err = cub::DeviceRadixSort::SortPairs<uint32_t, uint32_t>(
      nullptr, temp, nullptr, nullptr, nullptr, nullptr, static_cast<int>(n), 0, KeyBits(vocab));
  *bytes = 4 * Align(static_cast<size_t>(n) * sizeof(uint32_t)) + temp;
  return err;
}

cudaError_t LaunchTokenGrad(const int32_t* tokens, const float* dout, int64_t n, int64_t channels,
                            int64_t vocab, float* dwte, bool accumulate, void* scratch, size_t scratch_bytes,
                            cudaStream_t stream) {
  if (!accumulate) {
    // Rows of tokens that do not occur are zero; the others are overwritten below.
    const cudaError_t err =
        cudaMemsetAsync(dwte, 0, static_cast<size_t>(vocab * channels) * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  if (n == 0 || channels == 0) return cudaSuccess;
  const size_t pieces = 4 * Align(static_cast<size_t>(n) * sizeof(uint32_t));
  if (scratch_bytes < pieces) return cudaErrorInvalidValue;
  SortScratch sc = Carve(scratch, n, scratch_bytes - pieces);
  SortInputKernel<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      tokens, n, vocab, sc.keys_in, sc.pos_in);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  // Radix sort is stable: each token's positions stay ascending.
  err = cub::DeviceRadixSort::SortPairs(sc.temp, sc.temp_bytes, sc.keys_in, sc.keys_out, sc.pos_in,
                                        sc.pos_out, static_cast<int>(n), 0, KeyBits(vocab), stream);
  if (err != cudaSuccess) return err;
  TokenGradKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(sc.keys_out, sc.pos_out, dout, n,
                                                                     channels, vocab, dwte, accumulate);
  return cudaGetLastError();
}

}  // namespace strata::model::cuda
