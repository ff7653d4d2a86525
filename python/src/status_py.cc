#include "status_py.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cerrno>
#include <charconv>

namespace nb = nanobind;

namespace strata::py {
namespace {

PyObject* ExceptionTypeFor(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return PyExc_ValueError;
    case StatusCode::kNotFound: return PyExc_FileNotFoundError;
    case StatusCode::kOutOfBudget:
    case StatusCode::kResourceExhausted: return PyExc_MemoryError;
    case StatusCode::kIoError:
    case StatusCode::kCorruption: return PyExc_OSError;
    case StatusCode::kDeadlineExceeded: return PyExc_TimeoutError;
    case StatusCode::kUnimplemented: return PyExc_NotImplementedError;
    default: return PyExc_RuntimeError;
  }
}

}  // namespace

int ErrnoInMessage(std::string_view message) {
  constexpr std::string_view kTag = "(errno ";
  const size_t at = message.rfind(kTag);
  if (at == std::string_view::npos) return 0;
  const char* first = message.data() + at + kTag.size();
  int err = 0;
  auto [end, ec] = std::from_chars(first, message.data() + message.size(), err);
  if (ec != std::errc() || end == message.data() + message.size() || *end != ')') return 0;
  return err;
}

void RaiseStatus(const Status& status, std::string_view context, const std::string& filename) {
  const std::string message = std::string(context) + ": " + status.ToString();
  int err = ErrnoInMessage(status.message());
  if (err == 0 && status.code() == StatusCode::kNotFound) err = ENOENT;
  if (err != 0) {
    // OSError(errno, strerror, filename) picks the subclass for errno and sets .filename.
    nb::object args =
        filename.empty() ? nb::make_tuple(err, message) : nb::make_tuple(err, message, filename);
    PyErr_SetObject(PyExc_OSError, args.ptr());
  } else {
    PyErr_SetString(ExceptionTypeFor(status.code()), message.c_str());
  }
  throw nb::python_error();
}

void RaiseValueError(const std::string& message) {
  PyErr_SetString(PyExc_ValueError, message.c_str());
  throw nb::python_error();
}

}  // namespace strata::py
