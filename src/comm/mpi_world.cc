// Starting and ending MPI, and the checks that make a mis-launched job a clear error.
#include <cstdlib>
#include <string>

#include "comm/mpi_communicator.h"
#include "comm/mpi_util.h"
#include "strata/log.h"

namespace strata {

bool WorldInitialized() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  return inited && !finalized;
}

Result<std::unique_ptr<Communicator>> InitWorld(const CommOptions& options, int expected_world_size) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) return FailedPreconditionError("InitWorld: MPI was already finalised in this process");
  // Read before MPI_Init: a singleton MPI sets these itself.
  static const bool launched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
                               std::getenv("PMI_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
  int provided = 0;
  if (!inited) {
    // The default error handler of MPI_Init aborts; nothing can be returned from there.
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) return comm::MpiStatus(rc, "MPI_Init_thread");
  } else {
    STRATA_MPI_RETURN_IF_ERROR(MPI_Query_thread(&provided), "MPI_Query_thread");
  }
  // Each communicator's worker thread calls MPI concurrently with the others and with
  // the caller (Split, InitWorld): nothing less than MPI_THREAD_MULTIPLE will do.
  if (provided < MPI_THREAD_MULTIPLE) {
    return UnavailableError("InitWorld: the MPI library provides thread level " + std::to_string(provided) +
                            ", strata needs MPI_THREAD_MULTIPLE (" + std::to_string(MPI_THREAD_MULTIPLE) +
                            "); use an MPI built with thread support (OpenMPI does by default)" +
                            (inited ? " or initialise it with MPI_Init_thread(MPI_THREAD_MULTIPLE)" : ""));
  }
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int size = 0;
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  const char* env_size = std::getenv("WORLD_SIZE");
  if (size == 1 && env_size != nullptr && std::atoi(env_size) > 1) {
    return FailedPreconditionError("InitWorld: WORLD_SIZE=" + std::string(env_size) +
                                   " but MPI sees a world of 1: strata ranks are started by mpirun, e.g. `mpirun -np " +
                                   env_size + " --bind-to none strata ...`");
  }
  if (expected_world_size > 0 && size != expected_world_size) {
    return FailedPreconditionError(
        "InitWorld: expected a world of " + std::to_string(expected_world_size) + " ranks, MPI has " +
        std::to_string(size) + (launched ? "" : " (not started by mpirun)") + "; run `mpirun -np " +
        std::to_string(expected_world_size) + " --bind-to none <command>`");
  }
  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "MPI_Comm_dup(MPI_COMM_WORLD)");
  STRATA_ASSIGN_OR_RETURN(auto world, comm::MpiCommunicator::Create(dup, options));
  STRATA_LOG(kDebug, "comm") << "world: rank " << world->rank() << " of " << world->size();
  return std::unique_ptr<Communicator>(std::move(world));
}

Status FinalizeWorld() {
  if (!WorldInitialized()) return OkStatus();
  STRATA_MPI_RETURN_IF_ERROR(MPI_Finalize(), "MPI_Finalize");
  return OkStatus();
}

void AbortWorld(int exit_code) {
  if (WorldInitialized()) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace strata
