// Status and Result<T>: how every recoverable failure in strata is reported.
//
// Contract:
//  - A Status is either OK or carries a code and a message. The message says what
//    failed, where (file, offset, key, tier, rank ...) and what the user can do.
//  - Foreign error codes (errno, cudaError_t, ncclResult_t, MPI classes) are turned
//    into a Status at the call site that received them; they never travel further.
//  - Both types are [[nodiscard]]: ignoring a failure is a compile error under -Werror.
//  - Broken invariants are not Statuses: they abort through STRATA_CHECK.
//  - Thread-safety: values; copy freely between threads.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strata {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad input from the user or caller (config, flags, alignment)
  kNotFound,            // a file, path, key or device that does not exist
  kOutOfBudget,         // a tier budget that cannot be met
  kIoError,             // a read or write failed (errno text included)
  kCorruption,          // data read back does not match what was written
  kUnavailable,         // a device, library or facility is missing on this machine
  kDeadlineExceeded,    // a collective or wait ran past its time limit
  kAborted,             // an operation was cancelled (e.g. a communicator was aborted)
  kFailedPrecondition,  // a call made in the wrong state
  kResourceExhausted,   // memory, disk space, memlock limit
  kInternal,            // a bug in strata, or an unexpected error from a library
  kUnimplemented,       // a feature not built yet
};

// Returns a short, stable name for a code, e.g. "OutOfBudget".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "OutOfBudget: device tier: ..." (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context` ("while X: <message>").
  Status WithContext(std::string_view context) const;

  // Marks a Status as deliberately ignored (documented at each use).
  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status OutOfBudgetError(std::string message);
Status IoError(std::string message);
Status CorruptionError(std::string message);
Status UnavailableError(std::string message);
Status DeadlineExceededError(std::string message);
Status AbortedError(std::string message);
Status FailedPreconditionError(std::string message);
Status ResourceExhaustedError(std::string message);
Status InternalError(std::string message);
Status UnimplementedError(std::string message);

// Builds a Status from an errno value: "<what>: <strerror> (errno N)". ENOSPC and
// EDQUOT map to ResourceExhausted, ENOENT to NotFound, EINVAL to InvalidArgument,
// EACCES/EPERM/ENOSYS to Unavailable, everything else to IoError.
Status ErrnoError(int err, std::string_view what);

// A value or a failure. Accessing value() of a failed Result aborts.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit on purpose
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit on purpose
    if (status_.ok()) status_ = InternalError("Result constructed from an OK Status without a value");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    CheckOk();
    return *value_;
  }
  const T& value() const& {
    CheckOk();
    return *value_;
  }
  T&& value() && {
    CheckOk();
    return std::move(*value_);
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const;
  std::optional<T> value_;
  Status status_;
};

[[noreturn]] void FailedResultAccess(const Status& status);

template <typename T>
void Result<T>::CheckOk() const {
  if (!value_.has_value()) FailedResultAccess(status_);
}

// Aborts the process with a message naming the broken invariant.
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, std::string_view msg);

}  // namespace strata

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` failed.
#define STRATA_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::strata::Status strata_status_ = (expr);        \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

// `lhs = value of expr`, or returns its Status from the enclosing function.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_result_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// Aborts when an invariant does not hold. Not for user errors: those return a Status.
#define STRATA_CHECK(cond)                                             \
  do {                                                                 \
    if (!(cond)) ::strata::CheckFailed(__FILE__, __LINE__, #cond, {}); \
  } while (0)
#define STRATA_CHECK_MSG(cond, msg)                                       \
  do {                                                                    \
    if (!(cond)) ::strata::CheckFailed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
