// Turning strata Status failures into Python exceptions.
//
// A failure becomes the builtin exception a Python caller would catch for it: an errno
// in the message (strata's ErrnoError writes "(errno N)") gives OSError(N, ...), which
// Python turns into its subclass (FileNotFoundError, PermissionError, ...), with
// `filename` set; otherwise the code decides (InvalidArgument -> ValueError,
// NotFound -> FileNotFoundError, OutOfBudget/ResourceExhausted -> MemoryError,
// IoError/Corruption -> OSError, DeadlineExceeded -> TimeoutError,
// Unimplemented -> NotImplementedError, the rest -> RuntimeError).
// Call with the GIL held.
#pragma once

#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata::py {

// Raises the exception for `status` (not OK) with message "<context>: <status>".
[[noreturn]] void RaiseStatus(const Status& status, std::string_view context,
                              const std::string& filename = {});

// Raises ValueError(message).
[[noreturn]] void RaiseValueError(const std::string& message);

// Returns the errno a strata message names ("(errno N)"), or 0.
int ErrnoInMessage(std::string_view message);

}  // namespace strata::py
