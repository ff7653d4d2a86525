#include "comm/failure_notice.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "comm/mpi_util.h"
#include "strata/log.h"

namespace strata::comm {

FailureNotice::~FailureNotice() { Free(); }

Status FailureNotice::Init(MPI_Comm comm, WatchBoard* board) {
  board_ = board;
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_dup(comm, &comm_), "failure notice: MPI_Comm_dup");
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                             "failure notice: MPI_Comm_set_errhandler");
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_rank(comm_, &rank_), "failure notice: MPI_Comm_rank");
  STRATA_MPI_RETURN_IF_ERROR(MPI_Comm_size(comm_, &size_), "failure notice: MPI_Comm_size");
  return OkStatus();
}

void FailureNotice::Free() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  std::lock_guard lock(mu_);
  if (finalized || comm_ == MPI_COMM_NULL) {  // the requests and communicator ended with MPI
    sends_.clear();
    comm_ = MPI_COMM_NULL;
    return;
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!sends_.empty()) {
    int done = 0;
    if (MPI_Testall(static_cast<int>(sends_.size()), sends_.data(), &done, MPI_STATUSES_IGNORE) !=
            MPI_SUCCESS ||
        done || std::chrono::steady_clock::now() > give_up) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A send still pending goes on without its request (MPI allows freeing an active one).
  for (MPI_Request& r : sends_) {
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }
  sends_.clear();
  // Notices nobody asked for (the collectives ended first) are taken, so none is left
  // unmatched when the communicator goes.
  std::string text;
  int source = 0;
  while (TakeMessage(&text, &source) == MPI_SUCCESS && source >= 0) {
  }
  const int rc = MPI_Comm_free(&comm_);
  if (rc != MPI_SUCCESS)
    STRATA_LOG(kWarn, "comm") << MpiStatus(rc, "failure notice: MPI_Comm_free").ToString();
  comm_ = MPI_COMM_NULL;
}

std::string FailureNotice::First() {
  std::string failed = board_ != nullptr ? board_->FailedRank() : std::string();
  return failed.empty() ? Received() : failed;
}

bool FailureNotice::Post(std::string_view what) {
  if (comm_ == MPI_COMM_NULL || !First().empty() || posted_.exchange(true)) return false;
  if (board_ != nullptr) board_->PostFailure(what);
  std::lock_guard lock(mu_);
  sent_.assign(what.substr(0, kMaxText));
  for (int r = 0; r < size_; ++r) {
    if (r == rank_ || (board_ != nullptr && board_->Sees(r))) continue;
    MPI_Request req = MPI_REQUEST_NULL;
    const int rc = MPI_Isend(sent_.data(), static_cast<int>(sent_.size()), MPI_CHAR, r, kTag, comm_, &req);
    if (rc != MPI_SUCCESS) {
      STRATA_LOG(kWarn, "comm") << MpiStatus(rc, "failure notice to rank " + std::to_string(r)).ToString()
                                << " (that rank will wait for its watchdog)";
      continue;
    }
    sends_.push_back(req);
  }
  return true;
}

Status FailureNotice::OwnFailure(bool posted, std::string_view what) {
  return AbortedError((posted ? "this rank posted its failure: " : "this rank failed after a peer did: ") +
                      std::string(what));
}

int FailureNotice::TakeMessage(std::string* text, int* source) {
  *source = -1;
  int flag = 0;
  MPI_Message msg;
  MPI_Status st;
  int rc = MPI_Improbe(MPI_ANY_SOURCE, kTag, comm_, &flag, &msg, &st);
  if (rc != MPI_SUCCESS || !flag) return rc;
  int count = 0;
  rc = MPI_Get_count(&st, MPI_CHAR, &count);
  if (rc != MPI_SUCCESS) return rc;
  text->assign(static_cast<size_t>(std::max(count, 0)), '\0');
  rc = MPI_Mrecv(text->data(), count, MPI_CHAR, &msg, MPI_STATUS_IGNORE);
  if (rc == MPI_SUCCESS) *source = st.MPI_SOURCE;
  return rc;
}

std::string FailureNotice::Received() {
  std::lock_guard lock(mu_);
  if (!received_.empty() || probe_failed_ || comm_ == MPI_COMM_NULL) return received_;
  std::string text;
  int source = -1;
  const int rc = TakeMessage(&text, &source);
  if (rc != MPI_SUCCESS) {
    STRATA_LOG(kWarn, "comm") << MpiStatus(rc, "receiving a failure notice").ToString()
                              << " (notices from other nodes are no longer looked for)";
    probe_failed_ = true;
  } else if (source >= 0) {
    received_ = "rank " + std::to_string(source) + " failed: " + text;
  }
  return received_;
}

}  // namespace strata::comm
