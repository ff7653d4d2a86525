// What each rank of a communicator last entered, in an MPI-3 shared-memory window over
// the ranks of this node (MPI_Win_allocate_shared), so that a rank's watchdog can read
// its peers' progress with plain loads: no MPI call, so a peer that is stuck or asleep
// cannot block the report. Ranks on other nodes are not visible (a failure reaches them
// as a message: failure_notice.h).
// A rank that has failed and will join no more collectives posts that here too
// (PostFailure), so that its peers stop waiting for it at once instead of at the
// watchdog's limit.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::comm {

class WatchBoard {
 public:
  WatchBoard() = default;
  WatchBoard(const WatchBoard&) = delete;
  WatchBoard& operator=(const WatchBoard&) = delete;
  ~WatchBoard();

  // Collective over `comm`. After an error the board is inert (reports say so).
  // `one_node_per_rank` (tests, CommOptions): each rank's board shows only itself.
  Status Init(MPI_Comm comm, bool one_node_per_rank = false);
  // Collective over the node's ranks of `comm` (frees the window).
  void Free();

  // Owner side (one writer: the communicator's worker thread).
  void Enter(uint64_t seq, std::string_view what);
  // The same text as the previous Enter.
  void Enter(uint64_t seq);
  void Finish(uint64_t seq);

  // One line per rank of the communicator: "rank 1: last entered #3 Barrier (finished)".
  std::string Report() const;

  // Any thread; the first call only: tells this node's ranks that this rank failed and
  // will join no more collectives, with `what` (its first 255 bytes).
  void PostFailure(std::string_view what);
  // The rank of the communicator on this node (this one included) that posted a failure
  // first, as "rank 1 failed: <what>"; empty when none did. A failure is often followed
  // by the peers' own (their collectives with it end), so the first is the cause. Plain
  // loads, any thread.
  std::string FailedRank() const;
  // Whether rank `rank` of the communicator is on this board (this node). Any thread.
  bool Sees(int rank) const {
    return rank >= 0 && static_cast<size_t>(rank) < by_comm_rank_.size() && by_comm_rank_[rank] != nullptr;
  }

 private:
  // Each slot has cache lines of its own: the window places the ranks' slots next to
  // each other, and the owner writes its slot on every collective while the peer
  // writes the neighbouring one.
  struct alignas(64) Slot {
    std::atomic<uint64_t> version;  // odd while the owner writes (seqlock)
    std::atomic<uint64_t> entered;  // 0: nothing entered yet
    std::atomic<uint64_t> finished;
    std::atomic<uint64_t> what[8];  // NUL-padded text, 64 bytes
    std::atomic<uint64_t> failed;      // steady-clock ns of the rank's failure, once posted (after its text)
    std::atomic<uint64_t> failure[32];  // NUL-padded text, 256 bytes; written once
  };
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  MPI_Win win_ = MPI_WIN_NULL;
  Slot* mine_ = nullptr;
  std::vector<Slot*> by_comm_rank_;  // nullptr: another node
  std::atomic<bool> posted_{false};
};

}  // namespace strata::comm
