// IoEngine's backend-independent part: validation, completion state, result checking,
// backend selection.
#include <algorithm>
#include <cerrno>
#include <string>

#include "strata/io.h"
#include "strata/log.h"
#include "strata/units.h"
#include "tiering/io_files.h"
#include "tiering/io_state.h"

namespace strata {

bool IoHandle::Poll() const {
  return state_ && state_->done.load(std::memory_order_acquire) != 0;
}

Status IoHandle::Wait() const {
  if (!state_) return FailedPreconditionError("IoHandle::Wait on an empty handle");
  while (state_->done.load(std::memory_order_acquire) == 0) state_->done.wait(0);
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->first_error;
}

uint64_t IoHandle::bytes_done() const { return state_ ? state_->bytes.load() : 0; }

namespace detail {

void CompletePiece(const IoPiece& piece, const Status& status) {
  IoState* st = piece.state;
  IoRequestTrack& req = st->reqs[piece.request];
  if (status.ok()) {
    st->bytes.fetch_add(piece.length, std::memory_order_relaxed);
  } else {
    std::lock_guard<std::mutex> lock(st->mu);
    if (req.status.ok()) req.status = status;
    if (st->first_error.ok()) st->first_error = status;
  }
  if (req.pieces_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Last piece of the request.
  if (req.file_inflight) req.file_inflight->fetch_sub(1, std::memory_order_release);
  if (st->completed_counter) st->completed_counter->fetch_add(1, std::memory_order_relaxed);
  if (st->callback) {
    Status req_status;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      req_status = req.status;
    }
    Status verdict = st->callback(piece.request, req_status);
    if (req_status.ok() && !verdict.ok()) {
      std::lock_guard<std::mutex> lock(st->mu);
      req.status = verdict;
      if (st->first_error.ok()) st->first_error = verdict;
    }
  }
  if (st->requests_left.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  std::shared_ptr<IoState> keep = std::move(st->self);  // last reference held by pieces
  st->done.store(1, std::memory_order_release);
  st->done.notify_all();
}

PieceOutcome CheckPieceResult(IoPiece& piece, int64_t result, const FileTable& files) {
  const uint64_t at = piece.offset + piece.done;
  const uint64_t want = piece.length - piece.done;
  auto where = [&] {
    return std::string(piece.op == IoOp::kRead ? "read" : "write") + " of " + std::to_string(want) +
           " bytes at offset " + std::to_string(at) + " of " + files.name(piece.file);
  };
  if (result == -EAGAIN || result == -EINTR || (result == 0 && piece.op == IoOp::kWrite)) {
    if (++piece.retries > kMaxPieceRetries) {
      std::string why = result == 0 ? "no progress" : (result == -EAGAIN ? "EAGAIN" : "EINTR");
      return {PieceStep::kFailed,
              IoError(where() + ": gave up after " + std::to_string(kMaxPieceRetries) +
                      " retries (" + why + "); the device is overloaded or failing")};
    }
    return {PieceStep::kResubmit, {}, false, true};
  }
  if (result < 0) return {PieceStep::kFailed, ErrnoError(static_cast<int>(-result), where())};
  if (result == 0) {
    return {PieceStep::kFailed,
            IoError(where() + ": unexpected end of file (the file is shorter than expected; "
                              "was it truncated?)")};
  }
  if (static_cast<uint64_t>(result) > want) {
    return {PieceStep::kFailed, InternalError(where() + ": kernel reported " + std::to_string(result) +
                                              " bytes, more than asked")};
  }
  piece.done += static_cast<uint32_t>(result);
  if (piece.done < piece.length) return {PieceStep::kResubmit, {}, true, false};
  return {PieceStep::kDone, {}};
}

}  // namespace detail

IoEngineOptions IoEngineOptions::FromConfig(const Config& config) {
  IoEngineOptions o;
  o.backend = config.strata.io_backend;
  o.block_size = config.aio.block_size;
  o.queue_depth = config.aio.queue_depth;
  o.threads = std::max(1, config.aio.intra_op_parallelism);
  o.sqpoll = config.strata.io_sqpoll;
  return o;
}

namespace {

Status ValidateOptions(const IoEngineOptions& o) {
  if (o.alignment == 0 || (o.alignment & (o.alignment - 1)) != 0) {
    return InvalidArgumentError("IoEngine: alignment " + std::to_string(o.alignment) +
                                " must be a power of two");
  }
  if (o.block_size == 0 || o.block_size % o.alignment != 0 || o.block_size > (1ull << 30)) {
    return InvalidArgumentError("aio.block_size: " + std::to_string(o.block_size) +
                                " must be a multiple of " + std::to_string(o.alignment) +
                                " between " + std::to_string(o.alignment) + " and 1 GiB");
  }
  if (o.queue_depth < 1 || o.queue_depth > 4096) {
    return InvalidArgumentError("aio.queue_depth: " + std::to_string(o.queue_depth) +
                                " must be between 1 and 4096");
  }
  if (o.threads < 1 || o.threads > 64) {
    return InvalidArgumentError("aio.intra_op_parallelism: " + std::to_string(o.threads) +
                                " must be between 1 and 64");
  }
  return OkStatus();
}

}  // namespace

Result<std::unique_ptr<IoEngine>> IoEngine::Create(const IoEngineOptions& options) {
  STRATA_RETURN_IF_ERROR(ValidateOptions(options));
  if (options.backend == IoBackendKind::kPsync) return detail::CreatePsyncEngine(options);
  Result<std::unique_ptr<IoEngine>> uring = detail::CreateUringEngine(options);
  if (uring.ok() || options.backend == IoBackendKind::kIoUring) return uring;
  if (uring.status().code() != StatusCode::kUnavailable) return uring;
  STRATA_LOG(kWarn, "io") << "io_uring refused (" << uring.status().message()
                          << "); falling back to the pread/pwrite thread pool (slower)";
  return detail::CreatePsyncEngine(options);
}

Result<IoHandle> IoEngine::Submit(std::span<const IoRequest> requests, IoRequestCallback on_done) {
  if (requests.empty()) return InvalidArgumentError("IoEngine::Submit: empty batch");
  const uint64_t a = options_.alignment;
  auto bad = [&](size_t i, const char* what, uint64_t value) {
    return InvalidArgumentError("IoEngine: request " + std::to_string(i) + " (" +
                                (requests[i].op == IoOp::kRead ? "read" : "write") + " of file " +
                                FileName(requests[i].file) + "): " + what + " " +
                                std::to_string(value) + " is not a multiple of the required " +
                                "O_DIRECT alignment " + std::to_string(a));
  };
  auto state = std::make_shared<detail::IoState>();
  state->reqs = std::make_unique<detail::IoRequestTrack[]>(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    std::atomic<int>* inflight = FileInflight(r.file);
    if (inflight == nullptr) {
      return InvalidArgumentError("IoEngine: request " + std::to_string(i) + ": file id " +
                                  std::to_string(r.file) + " is not registered");
    }
    if (r.length == 0) return InvalidArgumentError("IoEngine: request " + std::to_string(i) + ": length 0");
    if (r.buffer == nullptr) return InvalidArgumentError("IoEngine: request " + std::to_string(i) + ": null buffer");
    if (r.offset % a) return bad(i, "offset", r.offset);
    if (r.length % a) return bad(i, "length", r.length);
    auto addr = reinterpret_cast<uintptr_t>(r.buffer);
    if (addr % a) return bad(i, "buffer address", addr);
    if (r.offset + r.length < r.offset) return InvalidArgumentError("IoEngine: request offset overflows");
    state->reqs[i].pieces_left.store(
        static_cast<uint32_t>((r.length + options_.block_size - 1) / options_.block_size));
    state->reqs[i].file_inflight = inflight;
  }
  for (size_t i = 0; i < requests.size(); ++i) state->reqs[i].file_inflight->fetch_add(1);
  state->requests_left.store(static_cast<uint32_t>(requests.size()));
  state->callback = std::move(on_done);
  state->completed_counter = &counters_.requests;
  state->self = state;
  IoHandle handle(state);
  SubmitValidated(requests, std::move(state));
  return handle;
}

Result<IoHandle> IoEngine::Read(int file, uint64_t offset, uint64_t length, void* buffer) {
  IoRequest r{IoOp::kRead, file, offset, length, buffer};
  return Submit(std::span<const IoRequest>(&r, 1));
}

Result<IoHandle> IoEngine::Write(int file, uint64_t offset, uint64_t length, const void* buffer) {
  IoRequest r{IoOp::kWrite, file, offset, length, const_cast<void*>(buffer)};
  return Submit(std::span<const IoRequest>(&r, 1));
}

IoEngineStats IoEngine::stats() const {
  IoEngineStats s;
  s.requests = counters_.requests.load();
  s.pieces = counters_.pieces.load();
  s.submits = counters_.submits.load();
  s.short_retries = counters_.short_retries.load();
  s.again_retries = counters_.again_retries.load();
  s.fixed_pieces = counters_.fixed_pieces.load();
  return s;
}

}  // namespace strata
