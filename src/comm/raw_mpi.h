// The plain MPI calls the Communicator is measured against (`strata bench comm`):
// MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce, MPI_Bcast on the same MPI
// communicator, timed in a loop on its worker thread (no handle, no queue). bf16/fp16
// sums use user-defined MPI ops (MPI_Op_create; fp32 per pair, rounded at each step as
// MPI combines). No mpi.h here: callers outside src/comm include this header.
#pragma once

#include <cstddef>

#include "strata/comm.h"

namespace strata::comm {

enum class RawOp { kAllGather, kReduceScatter, kAllReduce, kBroadcast };

// Runs `iters` back-to-back calls of `op` (count: per rank for AllGather/ReduceScatter,
// total otherwise; sum; root 0) on `comm` (an MPI communicator; collective) and returns
// the seconds they took on this rank, from an MPI_Barrier before the first to the end
// of the last.
Result<double> TimeRawMpi(Communicator& comm, RawOp op, const void* send, void* recv, size_t count, DType dtype,
                          int iters);

}  // namespace strata::comm
