// Builds without CUDA: device communicators are unavailable, and say why.
#include "strata/comm.h"

namespace strata {

bool NcclAvailable() { return false; }

Result<std::unique_ptr<Communicator>> CreateNcclCommunicator(Communicator&, const NcclOptions&,
                                                             const CommOptions& options) {
  return UnavailableError("communicator '" + options.name +
                          "': this strata was built without CUDA/NCCL (STRATA_CUDA=OFF or no toolkit found); "
                          "device collectives need a CUDA build");
}

}  // namespace strata
