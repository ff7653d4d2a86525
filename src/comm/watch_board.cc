#include "comm/watch_board.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <new>

#include "comm/mpi_util.h"
#include "strata/log.h"

namespace strata::comm {
namespace {

// Where a rank's slot starts in its part of the window (the same rule on every rank).
void* AlignSlot(void* base) {
  auto p = reinterpret_cast<uintptr_t>(base);
  constexpr uintptr_t kAlign = 64;
  return reinterpret_cast<void*>((p + kAlign - 1) & ~(kAlign - 1));
}

}  // namespace

WatchBoard::~WatchBoard() { Free(); }

Status WatchBoard::Init(MPI_Comm comm, bool one_node_per_rank) {
  int size = 0, rank = 0;
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm, &size), "watch board: MPI_Comm_size");
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm, &rank), "watch board: MPI_Comm_rank");
  by_comm_rank_.assign(static_cast<size_t>(size), nullptr);
  if (one_node_per_rank) {
    STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_split(comm, rank, 0, &node_comm_), "watch board: MPI_Comm_split");
  } else {
    STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node_comm_),
                               "watch board: MPI_Comm_split_type(SHARED)");
  }
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(node_comm_, MPI_ERRORS_RETURN),
                             "watch board: MPI_Comm_set_errhandler");
  void* base = nullptr;
  // Room to align the slot: MPI does not promise more than 8-byte alignment.
  static_assert(alignof(Slot) == 64, "AlignSlot aligns to 64");
  STRATA_MPI_RETURN_IF_ERROR(
      MPI_Win_allocate_shared(sizeof(Slot) + alignof(Slot), 1, MPI_INFO_NULL, node_comm_, &base, &win_),
      "watch board: MPI_Win_allocate_shared");
  STRATA_MPI_RETURN_IF_ERROR(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN),
                             "watch board: MPI_Win_set_errhandler");
  mine_ = new (AlignSlot(base)) Slot{};
  // Everyone has constructed its slot before anyone reads a peer's.
  STRATA_MPI_RETURN_IF_ERROR(MPI_Barrier(node_comm_), "watch board: MPI_Barrier");
  int node_size = 0;
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_size(node_comm_, &node_size), "watch board: MPI_Comm_size");
  MPI_Group node_group, comm_group;
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_group(node_comm_, &node_group), "watch board: MPI_Comm_group");
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_group(comm, &comm_group), "watch board: MPI_Comm_group");
  std::vector<int> node_ranks(static_cast<size_t>(node_size)), comm_ranks(static_cast<size_t>(node_size));
  for (int i = 0; i < node_size; ++i) node_ranks[static_cast<size_t>(i)] = i;
  int rc = MPI_Group_translate_ranks(node_group, node_size, node_ranks.data(), comm_group, comm_ranks.data());
  MPI_Group_free(&node_group);
  MPI_Group_free(&comm_group);
  STRATA_MPI_RETURN_IF_ERROR(rc, "watch board: MPI_Group_translate_ranks");
  for (int i = 0; i < node_size; ++i) {
    MPI_Aint bytes = 0;
    int disp = 0;
    void* peer = nullptr;
    STRATA_MPI_RETURN_IF_ERROR(MPI_Win_shared_query(win_, i, &bytes, &disp, &peer),
                               "watch board: MPI_Win_shared_query");
    int r = comm_ranks[static_cast<size_t>(i)];
    if (r >= 0 && r < size) by_comm_rank_[static_cast<size_t>(r)] = static_cast<Slot*>(AlignSlot(peer));
  }
  return OkStatus();
}

void WatchBoard::Free() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {  // the window and communicator ended with MPI
    mine_ = nullptr;
    by_comm_rank_.clear();
    win_ = MPI_WIN_NULL;
    node_comm_ = MPI_COMM_NULL;
    return;
  }
  if (win_ != MPI_WIN_NULL) {
    if (mine_ != nullptr) mine_->~Slot();
    mine_ = nullptr;
    by_comm_rank_.clear();
    int rc = MPI_Win_free(&win_);
    if (rc != MPI_SUCCESS) {
      STRATA_LOG(kWarn, "comm") << MpiStatus(rc, "MPI_Win_free").ToString();
    }
    win_ = MPI_WIN_NULL;
  }
  if (node_comm_ != MPI_COMM_NULL) {
    MPI_Comm_free(&node_comm_);
    node_comm_ = MPI_COMM_NULL;
  }
}

void WatchBoard::Enter(uint64_t seq, std::string_view what) {
  if (mine_ == nullptr) return;
  uint64_t v = mine_->version.load(std::memory_order_relaxed);
  mine_->version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  char text[64] = {};
  std::memcpy(text, what.data(), std::min(what.size(), sizeof(text) - 1));
  for (int i = 0; i < 8; ++i) {
    uint64_t w;
    std::memcpy(&w, text + 8 * i, 8);
    mine_->what[i].store(w, std::memory_order_relaxed);
  }
  mine_->entered.store(seq, std::memory_order_relaxed);
  mine_->version.store(v + 2, std::memory_order_release);
}

void WatchBoard::Enter(uint64_t seq) {
  if (mine_ == nullptr) return;
  uint64_t v = mine_->version.load(std::memory_order_relaxed);
  mine_->version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  mine_->entered.store(seq, std::memory_order_relaxed);
  mine_->version.store(v + 2, std::memory_order_release);
}

void WatchBoard::Finish(uint64_t seq) {
  if (mine_ != nullptr) mine_->finished.store(seq, std::memory_order_release);
}

void WatchBoard::PostFailure(std::string_view what) {
  if (mine_ == nullptr || posted_.exchange(true)) return;
  char text[sizeof(Slot::failure)] = {};
  std::memcpy(text, what.data(), std::min(what.size(), sizeof(text) - 1));
  for (size_t i = 0; i < std::size(mine_->failure); ++i) {
    uint64_t w;
    std::memcpy(&w, text + 8 * i, 8);
    mine_->failure[i].store(w, std::memory_order_relaxed);
  }
  // CLOCK_MONOTONIC is one clock for every process of the node, so the peers can tell
  // which failure came first.
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  mine_->failed.store(std::max<uint64_t>(1, static_cast<uint64_t>(ns)), std::memory_order_release);
}

std::string WatchBoard::FailedRank() const {
  size_t first = by_comm_rank_.size();
  uint64_t first_ns = UINT64_MAX;
  for (size_t r = 0; r < by_comm_rank_.size(); ++r) {
    const Slot* s = by_comm_rank_[r];
    const uint64_t ns = s == nullptr ? 0 : s->failed.load(std::memory_order_acquire);
    if (ns != 0 && ns < first_ns) {
      first = r;
      first_ns = ns;
    }
  }
  if (first == by_comm_rank_.size()) return "";
  const Slot* s = by_comm_rank_[first];
  char text[sizeof(Slot::failure) + 1] = {};
  for (size_t i = 0; i < std::size(s->failure); ++i) {
    uint64_t w = s->failure[i].load(std::memory_order_relaxed);
    std::memcpy(text + 8 * i, &w, 8);
  }
  return "rank " + std::to_string(first) + " failed: " + text;
}

std::string WatchBoard::Report() const {
  std::string out;
  for (size_t r = 0; r < by_comm_rank_.size(); ++r) {
    out += "\n  rank " + std::to_string(r) + ": ";
    const Slot* s = by_comm_rank_[r];
    if (s == nullptr) {
      out += "on another node (not visible from here)";
      continue;
    }
    uint64_t entered = 0, finished = 0;
    char text[65] = {};
    for (int attempt = 0; attempt < 1000; ++attempt) {
      uint64_t v1 = s->version.load(std::memory_order_acquire);
      if (v1 & 1) continue;
      entered = s->entered.load(std::memory_order_relaxed);
      for (int i = 0; i < 8; ++i) {
        uint64_t w = s->what[i].load(std::memory_order_relaxed);
        std::memcpy(text + 8 * i, &w, 8);
      }
      std::atomic_thread_fence(std::memory_order_acquire);
      if (s->version.load(std::memory_order_relaxed) == v1) break;
    }
    finished = s->finished.load(std::memory_order_acquire);
    if (entered == 0) {
      out += "has entered no collective on this communicator";
    } else {
      out += "last entered #" + std::to_string(entered) + " " + text +
             (finished >= entered ? " (finished)" : " (not finished)");
    }
  }
  if (by_comm_rank_.empty()) out = "\n  (no progress board: other ranks' state unknown)";
  return out;
}

}  // namespace strata::comm
