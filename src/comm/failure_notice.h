// A rank's failure notice to the ranks the watch board cannot reach (those on other
// nodes): a short MPI message on a communicator of its own, which a peer picks up with
// MPI_Improbe while it polls a collective it waits in. The watch board remains the fast
// path on the node (plain loads, no MPI call); this one crosses nodes.
//
// Why messages and not a one-sided window over every rank: on many transports a
// passive-target put progresses only when the target enters MPI, which a waiting peer
// does anyway (it polls MPI_Testall), so a window would gain little over a message, and
// a probe on a communicator that carries nothing else never matches a collective's
// traffic.
#pragma once

#include <mpi.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::comm {

class FailureNotice {
 public:
  FailureNotice() = default;
  FailureNotice(const FailureNotice&) = delete;
  FailureNotice& operator=(const FailureNotice&) = delete;
  ~FailureNotice();

  // Collective over `comm` (dups it).
  Status Init(MPI_Comm comm);
  // Finishes what was sent (for at most a second: a peer that is gone cannot take it),
  // takes what arrived and frees the communicator. Collective, as MPI_Comm_free.
  void Free();

  // Any thread; the first call only: sends `what` (its first 255 bytes) to every other
  // rank for which `reached_otherwise(rank)` is false. MPI errors are logged, not
  // returned: the caller is already failing, and its peers still have the watchdog.
  void Post(std::string_view what, const std::function<bool(int)>& reached_otherwise);
  // Any thread: "rank 3 failed: <what>" for the first notice that arrived, once one
  // has; else empty. One MPI_Improbe per call until a notice arrives.
  std::string Received();

 private:
  static constexpr int kTag = 1;
  static constexpr size_t kMaxText = 255;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::atomic<bool> posted_{false};
  std::string sent_;  // the text in flight (MPI reads it until the sends complete)
  std::mutex mu_;     // guards the members below and the probe and receive
  std::vector<MPI_Request> sends_;
  std::string received_;
  bool probe_failed_ = false;  // an MPI error was logged once; probing stops
};

}  // namespace strata::comm
