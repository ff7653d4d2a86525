#include "comm/mpi_util.h"

#include <chrono>
#include <string>

namespace strata::comm {

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status MpiStatus(int rc, std::string_view what) {
  if (rc == MPI_SUCCESS) return OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  int error_class = rc;
  if (MPI_Error_class(rc, &error_class) != MPI_SUCCESS) error_class = rc;
  std::string msg = std::string(what) + ": MPI error " + std::to_string(rc) + " (class " +
                    std::to_string(error_class) + "): " + std::string(text, static_cast<size_t>(len));
  if (error_class == MPI_ERR_NO_MEM) return ResourceExhaustedError(msg);
  if (error_class == MPI_ERR_UNSUPPORTED_OPERATION) return UnavailableError(msg);
  return InternalError(msg);
}

}  // namespace strata::comm
