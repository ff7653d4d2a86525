#include "strata/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <shared_mutex>

namespace strata {
namespace {

struct LogState {
  std::shared_mutex mu;
  LogLevel default_level = LogLevel::kInfo;
  std::map<std::string, LogLevel, std::less<>> per_subsystem;
  std::atomic<LogSink> sink{nullptr};
  std::mutex write_mu;
};

LogState& State() {
  static LogState* state = new LogState();  // never destroyed: logging works during exit
  return *state;
}

bool ParseLevel(std::string_view s, LogLevel* out) {
  static constexpr std::pair<std::string_view, LogLevel> kLevels[] = {
      {"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug},  {"info", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"warning", LogLevel::kWarn}, {"error", LogLevel::kError},
      {"off", LogLevel::kOff}};
  for (auto [name, level] : kLevels) {
    if (s == name) {
      *out = level;
      return true;
    }
  }
  return false;
}

std::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return "trace";
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarn: return "warn";
    case LogLevel::kError: return "error";
    case LogLevel::kOff: return "off";
  }
  return "?";
}

}  // namespace

Status ConfigureLogging(std::string_view spec) {
  LogLevel def = LogLevel::kInfo;
  std::map<std::string, LogLevel, std::less<>> subs;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;
    size_t eq = item.find('=');
    LogLevel level;
    std::string_view level_text = eq == std::string_view::npos ? item : item.substr(eq + 1);
    if (!ParseLevel(level_text, &level)) {
      return InvalidArgumentError("STRATA_LOG: unknown level \"" + std::string(level_text) +
                                  "\"; expected one of trace|debug|info|warn|error|off, "
                                  "e.g. STRATA_LOG=info,io=debug");
    }
    if (eq == std::string_view::npos) {
      def = level;
    } else {
      if (eq == 0) {
        return InvalidArgumentError("STRATA_LOG: empty subsystem name in \"" + std::string(item) +
                                    "\"; write subsystem=level, e.g. io=debug");
      }
      subs[std::string(item.substr(0, eq))] = level;
    }
  }
  auto& st = State();
  std::unique_lock lock(st.mu);
  st.default_level = def;
  st.per_subsystem = std::move(subs);
  return OkStatus();
}

void InitLoggingFromEnv() {
  const char* spec = std::getenv("STRATA_LOG");
  if (spec == nullptr) return;
  Status s = ConfigureLogging(spec);
  if (!s.ok()) std::fprintf(stderr, "strata: %s (keeping level info)\n", s.ToString().c_str());
}

bool LogEnabled(LogLevel level, std::string_view subsystem) {
  auto& st = State();
  std::shared_lock lock(st.mu);
  auto it = st.per_subsystem.find(subsystem);
  LogLevel threshold = it == st.per_subsystem.end() ? st.default_level : it->second;
  return threshold != LogLevel::kOff && level >= threshold;
}

void SetLogSink(LogSink sink) { State().sink.store(sink); }

void LogWrite(LogLevel level, std::string_view subsystem, const std::string& message) {
  auto& st = State();
  if (LogSink sink = st.sink.load()) {
    sink(level, subsystem, message);
    return;
  }
  std::lock_guard lock(st.write_mu);
  std::string_view name = LevelName(level);
  std::fprintf(stderr, "strata [%.*s %.*s] %s\n", static_cast<int>(name.size()), name.data(),
               static_cast<int>(subsystem.size()), subsystem.data(), message.c_str());
}

}  // namespace strata
