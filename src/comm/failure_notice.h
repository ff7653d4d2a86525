// A rank's failure notice to its peers (Communicator::PostFailure), for the MPI and the
// NCCL communicator alike. On the node it goes through the watch board (plain loads, no
// MPI call); to the ranks the board cannot reach (other nodes) as a short MPI message on
// a communicator of its own, which a peer picks up with MPI_Improbe while it polls a
// collective it waits in.
//
// Why messages and not a one-sided window over every rank: on many transports a
// passive-target put progresses only when the target enters MPI, which a waiting peer
// does anyway (it polls MPI_Testall), so a window would gain little over a message, and
// a probe on a communicator that carries nothing else never matches a collective's
// traffic.
#pragma once

#include <mpi.h>

#include <atomic>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "comm/watch_board.h"
#include "strata/status.h"

namespace strata::comm {

class FailureNotice {
 public:
  FailureNotice() = default;
  FailureNotice(const FailureNotice&) = delete;
  FailureNotice& operator=(const FailureNotice&) = delete;
  ~FailureNotice();

  // Collective over `comm` (dups it). `board` is the communicator's watch board (it
  // must outlive this), inert or not.
  Status Init(MPI_Comm comm, WatchBoard* board);
  // Finishes what was sent (for at most a second: a peer that is gone cannot take it),
  // takes what arrived and frees the communicator. Collective, as MPI_Comm_free.
  void Free();

  // Any thread; the first call only: posts `what` (its first 255 bytes) on the board and
  // sends it to every other rank the board does not reach. Nothing is posted once this
  // rank has seen a peer's failure (First): its own follows from that one, which
  // already reached every rank, and a relay could reach a rank on another node first
  // and name this rank instead. Returns whether it posted. MPI errors are logged, not
  // returned: the caller is already failing, and its peers still have the watchdog.
  bool Post(std::string_view what);
  // What the posting rank's own communicator is failed with: Aborted, saying whether it
  // posted `what` or failed after a peer did (Post's result).
  static Status OwnFailure(bool posted, std::string_view what);
  // Any thread: the failure a peer posted, as "rank 3 failed: <what>": the board's
  // first, else the first message that arrived; empty when none. Plain loads, then one
  // MPI_Improbe per call until a message arrives.
  std::string First();

 private:
  // The first message that arrived, else empty.
  std::string Received();
  // With mu_ held: receives one waiting notice into *text, setting *source to its
  // sender, or to -1 when none is waiting. Returns the first failing MPI call's code.
  int TakeMessage(std::string* text, int* source);

  static constexpr int kTag = 1;
  static constexpr size_t kMaxText = 255;
  MPI_Comm comm_ = MPI_COMM_NULL;
  WatchBoard* board_ = nullptr;
  int rank_ = 0, size_ = 1;
  std::atomic<bool> posted_{false};
  std::string sent_;  // the text in flight (MPI reads it until the sends complete)
  std::mutex mu_;     // guards the members below and the probe and receive
  std::vector<MPI_Request> sends_;
  std::string received_;
  bool probe_failed_ = false;  // an MPI error was logged once; probing stops
};

}  // namespace strata::comm
