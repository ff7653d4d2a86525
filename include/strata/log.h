// Logging with levels and subsystems.
//
// Configured by the environment variable STRATA_LOG, read by InitLoggingFromEnv():
//   STRATA_LOG=debug                 every subsystem at debug
//   STRATA_LOG=info,io=debug,comm=trace   default info; io at debug; comm at trace
// Levels: trace, debug, info, warn, error, off. Default: info.
// Subsystems are free-form short names ("io", "tier", "comm", "adam", "engine", ...).
//
// Usage:  STRATA_LOG(kWarn, "io") << "falling back to pread: " << why;
// Output goes to stderr, one line per message, prefixed with level and subsystem;
// lines from different threads do not interleave. Thread-safe.
#pragma once

#include <sstream>
#include <string>
#include <string_view>

#include "strata/status.h"

namespace strata {

enum class LogLevel { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

// Parses a STRATA_LOG spec; an unknown level or a malformed entry is InvalidArgument.
Status ConfigureLogging(std::string_view spec);
// Reads STRATA_LOG; a bad value is reported on stderr and the default kept.
void InitLoggingFromEnv();
bool LogEnabled(LogLevel level, std::string_view subsystem);
void LogWrite(LogLevel level, std::string_view subsystem, const std::string& message);
// Where messages go (default: stderr). For tests; `sink` may be nullptr to restore.
using LogSink = void (*)(LogLevel, std::string_view subsystem, const std::string& message);
void SetLogSink(LogSink sink);

class LogMessage {
 public:
  LogMessage(LogLevel level, std::string_view subsystem) : level_(level), subsystem_(subsystem) {}
  ~LogMessage() { LogWrite(level_, subsystem_, stream_.str()); }
  std::ostringstream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::string_view subsystem_;
  std::ostringstream stream_;
};

}  // namespace strata

// A for statement rather than if/else, so that `if (x) STRATA_LOG(...) << y;` needs no
// braces and draws no dangling-else warning.
#define STRATA_LOG(level, subsystem)                                                                       \
  for (bool strata_log_on_ = ::strata::LogEnabled(::strata::LogLevel::level, (subsystem)); strata_log_on_; \
       strata_log_on_ = false)                                                                             \
  ::strata::LogMessage(::strata::LogLevel::level, (subsystem)).stream()
