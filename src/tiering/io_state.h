// Internal to the IoEngine backends: the completion state of one submission and the
// piece (a block_size slice of a request) that backends queue and retry.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include "strata/io.h"

namespace strata::detail {

struct IoRequestTrack {
  std::atomic<uint32_t> pieces_left{0};
  std::atomic<int>* file_inflight = nullptr;
  Status status;  // first failure of this request, under IoState::mu
};

struct IoState {
  std::atomic<uint32_t> requests_left{0};
  std::atomic<uint32_t> done{0};  // 0 -> 1 exactly once; waited on with atomic wait
  std::atomic<uint64_t> bytes{0};
  std::mutex mu;
  Status first_error;
  IoRequestCallback callback;
  std::unique_ptr<IoRequestTrack[]> reqs;
  // Keeps the state alive while pieces are queued; dropped by the last completion.
  std::shared_ptr<IoState> self;
  std::atomic<uint64_t>* completed_counter = nullptr;  // engine's request counter
};

// A slice of a request as queued by a backend. Plain value; no allocation.
struct IoPiece {
  IoState* state = nullptr;
  uint32_t request = 0;
  IoOp op = IoOp::kRead;
  int file = -1;
  uint64_t offset = 0;             // of the piece's first byte in the file
  uint32_t length = 0;             // of the whole piece
  uint32_t done = 0;               // bytes already transferred
  uint32_t retries = 0;            // -EAGAIN/-EINTR/zero-progress retries so far
  bool cut_at_buffer_end = false;  // the last attempt stopped at a registered buffer's end
  char* buffer = nullptr;
  IoPriority priority = IoPriority::kNormal;
};

// Cuts each request into pieces of at most `block_size` bytes, in order, and hands
// every piece to `emit`. The one place the split rule lives, for every backend.
template <typename Emit>
void ForEachPiece(std::span<const IoRequest> requests, IoState* state, uint64_t block_size, Emit&& emit) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    for (uint64_t off = 0; off < r.length; off += block_size) {
      IoPiece p;
      p.state = state;
      p.request = static_cast<uint32_t>(i);
      p.op = r.op;
      p.file = r.file;
      p.offset = r.offset + off;
      p.length = static_cast<uint32_t>(std::min(block_size, r.length - off));
      p.buffer = static_cast<char*>(r.buffer) + off;
      p.priority = r.priority;
      emit(p);
    }
  }
}

// Retries of one piece after -EAGAIN, -EINTR or a zero-byte write before giving up.
inline constexpr uint32_t kMaxPieceRetries = 64;

// Records the end of a piece (status OK: all of it transferred). Runs the request's
// callback when it was the request's last piece and completes the submission when it
// was the last request. Thread-safe; each piece must be completed exactly once.
void CompletePiece(const IoPiece& piece, const Status& status);

// The outcome of one attempt at a piece: `result` is bytes transferred or -errno, as
// the kernel (or the fault hook) reported it.
enum class PieceStep { kDone, kResubmit, kFailed };
struct PieceOutcome {
  PieceStep step;
  Status status;  // set when kFailed
  bool short_retry = false;
  bool again_retry = false;
};
// Shared completion checking of both backends: advances piece.done / piece.retries.
class FileTable;
PieceOutcome CheckPieceResult(IoPiece& piece, int64_t result, const FileTable& files);

}  // namespace strata::detail
