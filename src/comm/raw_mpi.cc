#include "comm/raw_mpi.h"

#include <mpi.h>

#include <mutex>

#include "comm/dtype.h"
#include "comm/mpi_communicator.h"
#include "comm/mpi_util.h"

namespace strata::comm {
namespace {

template <bool kBf16>
void Sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    b[i] = kBf16 ? F32ToBf16(Bf16ToF32(a[i]) + Bf16ToF32(b[i])) : F32ToF16(F16ToF32(a[i]) + F16ToF32(b[i]));
  }
}

struct Types {
  MPI_Datatype half = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL;
  MPI_Op fp16_sum = MPI_OP_NULL;
  Status status;
};

// Created once per process, kept until MPI_Finalize frees them.
const Types& Get16BitTypes() {
  static Types t;
  static std::once_flag once;
  std::call_once(once, [] {
    int rc = MPI_Type_contiguous(2, MPI_BYTE, &t.half);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&t.half);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(&Sum16<true>, /*commute=*/1, &t.bf16_sum);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(&Sum16<false>, /*commute=*/1, &t.fp16_sum);
    t.status = MpiStatus(rc, "creating bf16/fp16 MPI types and ops");
  });
  return t;
}

}  // namespace

Result<double> TimeRawMpi(Communicator& comm, RawOp op, const void* send, void* recv, size_t count, DType dtype,
                          int iters) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(&comm);
  if (mpi == nullptr) return InvalidArgumentError("TimeRawMpi: '" + comm.name() + "' is not an MPI communicator");
  if (count > static_cast<size_t>(INT32_MAX)) return InvalidArgumentError("TimeRawMpi: count over INT_MAX");
  double seconds = 0;
  Status s = mpi->RunInOrder("raw MPI benchmark", [&](MpiContext& ctx) -> Status {
    MPI_Datatype type = MPI_FLOAT;
    MPI_Op sum = MPI_SUM;
    if (dtype != DType::kF32) {
      const Types& t = Get16BitTypes();
      STRATA_RETURN_IF_ERROR(t.status);
      type = t.half;
      sum = dtype == DType::kBf16 ? t.bf16_sum : t.fp16_sum;
    }
    const int n = static_cast<int>(count);
    STRATA_MPI_RETURN_IF_ERROR(MPI_Barrier(ctx.comm), "MPI_Barrier");
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      int rc = MPI_SUCCESS;
      switch (op) {
        case RawOp::kAllGather: rc = MPI_Allgather(send, n, type, recv, n, type, ctx.comm); break;
        case RawOp::kReduceScatter: rc = MPI_Reduce_scatter_block(send, recv, n, type, sum, ctx.comm); break;
        case RawOp::kAllReduce: rc = MPI_Allreduce(send, recv, n, type, sum, ctx.comm); break;
        case RawOp::kBroadcast: rc = MPI_Bcast(recv, n, type, 0, ctx.comm); break;
      }
      STRATA_MPI_RETURN_IF_ERROR(rc, "raw MPI collective");
    }
    seconds = MPI_Wtime() - t0;
    return OkStatus();
  });
  STRATA_RETURN_IF_ERROR(s);
  return seconds;
}

}  // namespace strata::comm
