// The Linear layers' matrix products on cuBLAS (see matmul.h).
//
// cuBLAS is column-major: a row-major [r, c] buffer is the column-major [c, r] matrix, so
// each product below is written for the transposes (y^T = W x^T and so on) and needs no
// copy. cublasGemmEx takes A and B of one type, so with 16-bit weights one side is
// converted in a stream-ordered scratch (cudaMallocAsync on the same stream): it is
// valid for exactly the work between its allocation and its free on that stream, whatever
// other streams and host threads do.
#include "model/cuda/matmul.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "model/cuda/convert_kernels.h"
#include "model/cuda/cuda_status.h"

namespace strata::model::cuda {
namespace {

Status CublasStatus(cublasStatus_t st, std::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return OkStatus();
  std::string msg = "model cuBLAS: " + std::string(what) + ": " + cublasGetStatusName(st) + " (" +
                    cublasGetStatusString(st) + ")";
  if (st == CUBLAS_STATUS_ALLOC_FAILED) return ResourceExhaustedError(msg);
  if (st == CUBLAS_STATUS_NOT_INITIALIZED) return UnavailableError(msg);
  return InternalError(msg);
}

// -1: not decided yet; otherwise a MatmulPrecision, or kBadEnv.
constexpr int kUndecided = -1, kBadEnv = 3;
std::atomic<int> precision{kUndecided};

int PrecisionFromEnv() {
  const char* v = std::getenv("STRATA_CUDA_MATMUL");
  const std::string_view s = v == nullptr ? "" : v;
  if (s.empty() || s == "mixed") return static_cast<int>(MatmulPrecision::kMixed);
  if (s == "tensor") return static_cast<int>(MatmulPrecision::kTensorCores);
  if (s == "fp32") return static_cast<int>(MatmulPrecision::kFp32);
  return kBadEnv;
}

// The pool that the scratch comes from keeps up to this much after a synchronisation,
// instead of unmapping it (the default threshold, 0): the products run every step.
constexpr uint64_t kPoolKeepBytes = uint64_t{1} << 30;

Status KeepPoolMemory(int device) {
  cudaMemPool_t pool = nullptr;
  STRATA_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool"));
  uint64_t threshold = 0;
  STRATA_RETURN_IF_ERROR(CudaStatus(
      cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), "cudaMemPoolGetAttribute"));
  if (threshold >= kPoolKeepBytes) return OkStatus();  // someone asked for more already
  threshold = kPoolKeepBytes;
  return CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
                    "cudaMemPoolSetAttribute (release threshold)");
}

// One cuBLAS handle per device for the calling thread: a handle must not be used by two
// threads at once, and binding it to the call's stream is then race-free.
class ThreadHandles {
 public:
  ThreadHandles() = default;
  ThreadHandles(const ThreadHandles&) = delete;
  ThreadHandles& operator=(const ThreadHandles&) = delete;
  ~ThreadHandles() {
    // At thread exit there is nobody to report a failure to.
    for (cublasHandle_t h : handles_) {
      if (h != nullptr) (void)cublasDestroy(h);
    }
  }

  Result<cublasHandle_t> For(int device) {
    if (device >= static_cast<int>(handles_.size())) handles_.resize(device + 1, nullptr);
    if (handles_[device] == nullptr) {
      STRATA_RETURN_IF_ERROR(KeepPoolMemoryOnce(device));
      cublasHandle_t h = nullptr;
      STRATA_RETURN_IF_ERROR(CublasStatus(cublasCreate(&h), "cublasCreate"));
      handles_[device] = h;
    }
    return handles_[device];
  }

 private:
  static Status KeepPoolMemoryOnce(int device) {
    static std::mutex mu;
    static std::vector<bool> done;
    std::lock_guard<std::mutex> lock(mu);
    if (device < static_cast<int>(done.size()) && done[device]) return OkStatus();
    STRATA_RETURN_IF_ERROR(KeepPoolMemory(device));
    if (device >= static_cast<int>(done.size())) done.resize(device + 1, false);
    done[device] = true;
    return OkStatus();
  }

  std::vector<cublasHandle_t> handles_;
};

// The calling thread's handle for its current device, bound to `stream`.
Result<cublasHandle_t> Handle(cudaStream_t stream) {
  int device = 0;
  STRATA_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "cudaGetDevice"));
  thread_local ThreadHandles handles;
  STRATA_ASSIGN_OR_RETURN(cublasHandle_t h, handles.For(device));
  STRATA_RETURN_IF_ERROR(CublasStatus(cublasSetStream(h, stream), "cublasSetStream"));
  return h;
}

// One GEMM operand as cuBLAS sees it: column-major with leading dimension `ld`.
struct Operand {
  const void* ptr;
  cudaDataType_t type;
  int64_t ld;
  cublasOperation_t op;
};

cudaDataType_t CudaType(DType d) {
  switch (d) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBf16: return CUDA_R_16BF;
    case DType::kFp16: return CUDA_R_16F;
  }
  return CUDA_R_32F;
}

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

// C [m x n] (column-major, fp32) = op(A) op(B) + beta C, fp32 accumulation; fp32 inputs
// use TF32 tensor cores under kTensorCores.
Status Gemm(cublasHandle_t h, MatmulPrecision p, int64_t m, int64_t n, int64_t k, const Operand& a,
            const Operand& b, float beta, float* c, int64_t ldc, std::string_view what) {
  if (!FitsInt(m) || !FitsInt(n) || !FitsInt(k) || !FitsInt(a.ld) || !FitsInt(b.ld) || !FitsInt(ldc)) {
    return InvalidArgumentError("model cuBLAS: " + std::string(what) + ": dimensions past 2^31 (" +
                                std::to_string(m) + " x " + std::to_string(n) + " x " + std::to_string(k) +
                                ")");
  }
  const bool tf32 = a.type == CUDA_R_32F && p == MatmulPrecision::kTensorCores;
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f;
  return CublasStatus(
      cublasGemmEx(h, a.op, b.op, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha,
                   a.ptr, a.type, static_cast<int>(a.ld), b.ptr, b.type, static_cast<int>(b.ld), &beta, c,
                   CUDA_R_32F, static_cast<int>(ldc), compute, CUBLAS_GEMM_DEFAULT),
      what);
}

// Points `op` (fp32, `n` elements) at a copy rounded to `dtype` (16-bit) in `dst`.
Status RoundOperand(cudaStream_t s, Operand& op, size_t n, DType dtype, char* dst) {
  STRATA_RETURN_IF_ERROR(
      CudaStatus(LaunchRoundTo16(static_cast<const float*>(op.ptr), n, dtype == DType::kBf16, dst, s),
                 "rounding to 16-bit"));
  op.ptr = dst;
  op.type = CudaType(dtype);
  return OkStatus();
}

// Points `op` (16-bit `dtype`, `n` elements) at an exact fp32 copy in `dst`.
Status WidenOperand(cudaStream_t s, Operand& op, size_t n, DType dtype, char* dst) {
  float* out = reinterpret_cast<float*>(dst);
  STRATA_RETURN_IF_ERROR(
      CudaStatus(LaunchWidenToFloat(op.ptr, n, dtype == DType::kBf16, out, s), "widening 16-bit weights"));
  op.ptr = out;
  op.type = CUDA_R_32F;
  return OkStatus();
}

size_t Elems(int64_t a, int64_t b) { return static_cast<size_t>(a) * static_cast<size_t>(b); }

}  // namespace

Result<MatmulPrecision> GetMatmulPrecision() {
  int p = precision.load(std::memory_order_acquire);
  if (p == kUndecided) {
    int expected = kUndecided;
    precision.compare_exchange_strong(expected, PrecisionFromEnv(), std::memory_order_acq_rel);
    p = precision.load(std::memory_order_acquire);
  }
  if (p == kBadEnv) {
    const char* v = std::getenv("STRATA_CUDA_MATMUL");
    return InvalidArgumentError(std::string("STRATA_CUDA_MATMUL is \"") + (v == nullptr ? "" : v) +
                                "\": want \"mixed\" (the default: 16-bit weights on tensor cores, fp32 ones "
                                "in fp32), \"tensor\" (fp32 weights as TF32 too) or \"fp32\"");
  }
  return static_cast<MatmulPrecision>(p);
}

void SetMatmulPrecision(MatmulPrecision p) {
  precision.store(static_cast<int>(p), std::memory_order_release);
}

const char* MatmulPrecisionName(MatmulPrecision p) {
  return p == MatmulPrecision::kFp32 ? "fp32" : p == MatmulPrecision::kMixed ? "mixed" : "tensor";
}

Status MatmulForward(void* stream_ptr, const float* x, int64_t batch, int64_t in, int64_t out,
                     const void* weight, DType dtype, float* y) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (batch <= 0 || out <= 0) return OkStatus();
  if (in <= 0) {
    return CudaStatus(cudaMemsetAsync(y, 0, Elems(batch, out) * sizeof(float), stream), "cudaMemsetAsync");
  }
  STRATA_ASSIGN_OR_RETURN(const MatmulPrecision p, GetMatmulPrecision());
  STRATA_ASSIGN_OR_RETURN(cublasHandle_t h, Handle(stream));
  // y^T [out x batch] = W [out x in] x^T [in x batch]; W is the column-major [in x out].
  Operand w{weight, CudaType(dtype), in, CUBLAS_OP_T};
  Operand xs{x, CUDA_R_32F, in, CUBLAS_OP_N};
  StreamScratch scratch(stream, "matmul scratch");
  if (dtype != DType::kF32 && p != MatmulPrecision::kFp32) {
    STRATA_ASSIGN_OR_RETURN(char* buf, scratch.Allocate(Elems(batch, in) * 2));
    STRATA_RETURN_IF_ERROR(RoundOperand(stream, xs, Elems(batch, in), dtype, buf));
  } else if (dtype != DType::kF32) {
    STRATA_ASSIGN_OR_RETURN(char* buf, scratch.Allocate(Elems(out, in) * sizeof(float)));
    STRATA_RETURN_IF_ERROR(WidenOperand(stream, w, Elems(out, in), dtype, buf));
  }
  STRATA_RETURN_IF_ERROR(Gemm(h, p, out, batch, in, w, xs, 0.0f, y, out, "forward GEMM (y = x W^T)"));
  return scratch.Release();
}

Status MatmulBackward(void* stream_ptr, const float* x, const float* dy, int64_t batch, int64_t in,
                      int64_t out, const void* weight, DType dtype, float* dx, float* dweight,
                      bool accumulate) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (in <= 0 || out <= 0) return OkStatus();
  if (batch <= 0) {
    if (accumulate) return OkStatus();
    return CudaStatus(cudaMemsetAsync(dweight, 0, Elems(out, in) * sizeof(float), stream), "cudaMemsetAsync");
  }
  STRATA_ASSIGN_OR_RETURN(const MatmulPrecision p, GetMatmulPrecision());
  STRATA_ASSIGN_OR_RETURN(cublasHandle_t h, Handle(stream));
  Operand w{weight, CudaType(dtype), in, CUBLAS_OP_N};  // column-major [in x out]
  Operand dy_n{dy, CUDA_R_32F, out, CUBLAS_OP_N};       // dy^T [out x batch]
  Operand xs{x, CUDA_R_32F, in, CUBLAS_OP_N};           // x^T [in x batch]
  StreamScratch scratch(stream, "matmul scratch");
  if (dtype != DType::kF32 && p != MatmulPrecision::kFp32) {
    const size_t x_offset = AlignUp(Elems(batch, out) * 2);  // cuBLAS's fast paths want aligned operands
    STRATA_ASSIGN_OR_RETURN(char* buf, scratch.Allocate(x_offset + Elems(batch, in) * 2));
    STRATA_RETURN_IF_ERROR(RoundOperand(stream, dy_n, Elems(batch, out), dtype, buf));
    STRATA_RETURN_IF_ERROR(RoundOperand(stream, xs, Elems(batch, in), dtype, buf + x_offset));
  } else if (dtype != DType::kF32 && dx != nullptr) {
    STRATA_ASSIGN_OR_RETURN(char* buf, scratch.Allocate(Elems(out, in) * sizeof(float)));
    STRATA_RETURN_IF_ERROR(WidenOperand(stream, w, Elems(out, in), dtype, buf));
  }
  if (dx != nullptr) {
    // dx^T [in x batch] = W^T [in x out] dy^T [out x batch].
    STRATA_RETURN_IF_ERROR(
        Gemm(h, p, in, batch, out, w, dy_n, 0.0f, dx, in, "input-gradient GEMM (dx = dy W)"));
  }
  // dW^T [in x out] = x^T [in x batch] dy [batch x out].
  Operand dy_t = dy_n;
  dy_t.op = CUBLAS_OP_T;
  STRATA_RETURN_IF_ERROR(Gemm(h, p, in, out, batch, xs, dy_t, accumulate ? 1.0f : 0.0f, dweight, in,
                              "weight-gradient GEMM (dW = dy^T x)"));
  return scratch.Release();
}

Status BatchedMatmul(void* stream_ptr, int64_t m, int64_t n, int64_t k, const StridedOperand& a,
                     const StridedOperand& b, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (m <= 0 || n <= 0 || batch <= 0) return OkStatus();
  if (!FitsInt(m) || !FitsInt(n) || k < 1 || !FitsInt(k) || !FitsInt(a.ld) || !FitsInt(b.ld) ||
      !FitsInt(ldc) || !FitsInt(batch)) {
    return InvalidArgumentError("model cuBLAS: batched GEMM: want 1 <= k and dimensions below 2^31 (" +
                                std::to_string(batch) + " x " + std::to_string(m) + " x " +
                                std::to_string(n) + " x " + std::to_string(k) + ")");
  }
  STRATA_ASSIGN_OR_RETURN(const MatmulPrecision p, GetMatmulPrecision());
  STRATA_ASSIGN_OR_RETURN(cublasHandle_t h, Handle(static_cast<cudaStream_t>(stream_ptr)));
  // Row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T, and a row-major
  // buffer read column-major is its transpose: swap the operands, keep each one's op.
  const cublasOperation_t op_b = b.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasComputeType_t compute =
      p == MatmulPrecision::kTensorCores ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const float alpha = 1.0f, beta = 0.0f;
  return CublasStatus(cublasGemmStridedBatchedEx(
                          h, op_b, op_a, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                          &alpha, b.ptr, CUDA_R_32F, static_cast<int>(b.ld), b.stride, a.ptr, CUDA_R_32F,
                          static_cast<int>(a.ld), a.stride, &beta, c, CUDA_R_32F, static_cast<int>(ldc),
                          stride_c, static_cast<int>(batch), compute, CUBLAS_GEMM_DEFAULT),
                      "strided-batched GEMM (attention)");
}

Status SquareGemm16(void* stream_ptr, int64_t n, DType dtype, const void* a, const void* b, float* c) {
  if (dtype == DType::kF32) return InvalidArgumentError("model cuBLAS: SquareGemm16 takes bf16 or fp16");
  if (n <= 0) return OkStatus();
  STRATA_ASSIGN_OR_RETURN(const MatmulPrecision p, GetMatmulPrecision());
  STRATA_ASSIGN_OR_RETURN(cublasHandle_t h, Handle(static_cast<cudaStream_t>(stream_ptr)));
  const Operand oa{a, CudaType(dtype), n, CUBLAS_OP_N}, ob{b, CudaType(dtype), n, CUBLAS_OP_N};
  return Gemm(h, p, n, n, n, oa, ob, 0.0f, c, n, "square 16-bit GEMM");
}

}  // namespace strata::model::cuda
