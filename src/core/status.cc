#include "strata/status.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace strata {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kOutOfBudget: return "OutOfBudget";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kInternal: return "Internal";
    case StatusCode::kUnimplemented: return "Unimplemented";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

Status InvalidArgumentError(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status NotFoundError(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status OutOfBudgetError(std::string m) { return {StatusCode::kOutOfBudget, std::move(m)}; }
Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
Status CorruptionError(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
Status UnavailableError(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status DeadlineExceededError(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
Status AbortedError(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
Status FailedPreconditionError(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
Status ResourceExhaustedError(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
Status InternalError(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
Status UnimplementedError(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }

Status ErrnoError(int err, std::string_view what) {
  char buf[256];
  // GNU strerror_r may return a static string rather than fill buf.
  const char* text = strerror_r(err, buf, sizeof(buf));
  std::string msg(what);
  msg += ": ";
  msg += text;
  msg += " (errno " + std::to_string(err) + ")";
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      msg += "; free space on that file system or point the path elsewhere";
      return ResourceExhaustedError(std::move(msg));
    case ENOMEM: return ResourceExhaustedError(std::move(msg));
    case ENOENT: return NotFoundError(std::move(msg));
    case EINVAL: return InvalidArgumentError(std::move(msg));
    case EACCES:
    case EPERM:
    case ENOSYS:
    case EOPNOTSUPP: return UnavailableError(std::move(msg));
    default: return IoError(std::move(msg));
  }
}

void FailedResultAccess(const Status& status) {
  std::fprintf(stderr, "strata: fatal: value() of a failed Result: %s\n", status.ToString().c_str());
  std::abort();
}

void CheckFailed(const char* file, int line, const char* expr, std::string_view msg) {
  std::fprintf(stderr, "strata: fatal: check failed at %s:%d: %s%s%.*s\n", file, line, expr,
               msg.empty() ? "" : ": ", static_cast<int>(msg.size()), msg.data());
  std::abort();
}

}  // namespace strata
