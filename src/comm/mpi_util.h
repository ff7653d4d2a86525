// MPI helpers for the host backend (the only files that include mpi.h are in src/comm).
#pragma once

#include <mpi.h>

#include <string_view>

#include "strata/status.h"

namespace strata::comm {

// "<what>: MPI error <class name>: <MPI_Error_string>" as Internal (or Unavailable for
// resource/unsupported classes). OK for MPI_SUCCESS.
Status MpiStatus(int rc, std::string_view what);

// Steady-clock seconds (deadlines, spin windows).
double NowS();

// How long a thread polls before it starts yielding the core between polls: in
// MpiContext::WaitAll, and in a Wait on a collective that another thread runs.
inline constexpr double kSpinS = 200e-6;

#define STRATA_MPI_RETURN_IF_ERROR(call, what)                             \
  do {                                                                      \
    int strata_mpi_rc_ = (call);                                            \
    if (strata_mpi_rc_ != MPI_SUCCESS) return ::strata::comm::MpiStatus(strata_mpi_rc_, (what)); \
  } while (0)

}  // namespace strata::comm
