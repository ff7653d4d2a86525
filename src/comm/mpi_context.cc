// MpiContext: the per-collective state the host algorithms (mpi_algorithms.cc) run with.
#include <cstdlib>
#include <cstring>
#include <thread>

#include "comm/mpi_communicator.h"
#include "comm/mpi_util.h"
#include "strata/log.h"

namespace strata::comm {
namespace {

void FreeAligned(std::byte* p) { std::free(p); }

}  // namespace

Status MpiContext::WaitAll(std::vector<MPI_Request>& reqs, size_t n_recv) {
  if (reqs.empty()) return OkStatus();
  // Poll without yielding at first: a collective of a few MiB finishes within this
  // window, and a sched_yield hands the core to any other runnable process for its
  // whole slice (on a busy 2-core machine, 1 MiB all-gathers took 3x as long). Past
  // it, yield between polls: ranks may outnumber cores (mpirun --oversubscribe).
  const double spin_until = NowS() + kSpinS;
  double next_peer_check = 0;
  int spins = 0;
  for (;;) {
    int done = 0;
    int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Testall");
    if (done) return OkStatus();
    if (++spins < 64) continue;
    spins = 0;
    const double now = NowS();
    if (now > deadline_s) {
      Abandon(reqs, n_recv);
      return on_deadline ? on_deadline() : DeadlineExceededError("collective timed out");
    }
    // A rank that posted its failure will not join: stop waiting for it now. Plain loads
    // of the board, once a millisecond.
    if (on_peer_failure && now >= next_peer_check) {
      next_peer_check = now + 1e-3;
      Status failed = on_peer_failure();
      if (!failed.ok()) {
        Abandon(reqs, n_recv);
        return failed;
      }
    }
    if (now > spin_until) std::this_thread::yield();
  }
}

void MpiContext::Abandon(std::vector<MPI_Request>& reqs, size_t n_recv) {
  for (size_t i = 0; i < n_recv && i < reqs.size(); ++i) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    if (MPI_Cancel(&reqs[i]) == MPI_SUCCESS) MPI_Request_free(&reqs[i]);
  }
  reqs.clear();  // the sends (and collective requests) are abandoned on purpose
}

std::byte* MpiContext::Staging(size_t bytes) {
  if (bytes > staging_bytes_) {
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
    STRATA_CHECK_MSG(p != nullptr, "out of memory for collective staging");
    std::memset(p, 0, rounded);  // first touch now, not inside a timed collective
    staging_ = decltype(staging_)(p, FreeAligned);
    staging_bytes_ = rounded;
  }
  return staging_.get();
}

}  // namespace strata::comm
