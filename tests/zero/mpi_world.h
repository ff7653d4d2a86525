// The world communicator of an engine test program run under mpirun (label mpi): made
// on first use and kept for the process (mpi_test_main finalizes MPI).
#pragma once

#include <memory>

#include "strata/comm.h"
#include "strata/status.h"

namespace strata::testing {

inline Communicator& MpiWorld() {
  static std::unique_ptr<Communicator> world = [] {
    auto w = InitWorld(CommOptions{"world", 120});
    STRATA_CHECK_MSG(w.ok(), w.status().ToString());
    return std::move(*w);
  }();
  return *world;
}

}  // namespace strata::testing
