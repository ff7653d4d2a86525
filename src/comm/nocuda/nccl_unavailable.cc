// Builds without NCCL (no CUDA at all, or CUDA without NCCL): device communicators are
// unavailable, and say why.
#include "strata/comm.h"

namespace strata {

bool NcclAvailable() { return false; }

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator&, const NcclOptions&,
                                                             const CommOptions& options) {
#if STRATA_HAVE_CUDA
  return UnavailableError("communicator '" + options.name +
                          "': this strata was built without NCCL (CUDA is there, but NCCL was not found or "
                          "STRATA_NCCL=OFF); device collectives need NCCL: install it and reconfigure "
                          "(STRATA_NCCL_ROOT or NCCL_HOME where it is not beside CUDA)");
#else
  return UnavailableError("communicator '" + options.name +
                          "': this strata was built without CUDA/NCCL (STRATA_CUDA=OFF or no toolkit found); "
                          "device collectives need a CUDA build with NCCL");
#endif
}

}  // namespace strata
