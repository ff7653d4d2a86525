// Fault injection for IoEngine tests: a hook both backends call with the raw result of
// every piece attempt (bytes transferred or -errno), before their completion checks.
// It can replace that result with an error (EIO, ENOSPC, EAGAIN, ...) or a short count,
// so tests drive the engine's real retry and error paths against a real file.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "strata/io.h"

namespace strata {

struct IoFaultPoint {
  IoOp op;
  int file;
  uint64_t offset;  // file offset of this attempt
  uint64_t length;  // bytes asked for in this attempt
};

class IoFaultHook {
 public:
  virtual ~IoFaultHook() = default;
  // Returns the result the engine should see. Called from engine threads.
  virtual int64_t OnResult(const IoFaultPoint& point, int64_t result) = 0;
};

// A scripted hook: each rule fires on attempts that match it, `times` times.
class ScriptedFaults : public IoFaultHook {
 public:
  enum class Kind { kError, kShort };
  struct Rule {
    Kind kind = Kind::kError;
    int error = 0;               // errno for kError (EIO, ENOSPC, EAGAIN, EINTR, ...)
    int64_t attempt = -1;        // fire at the hook's Nth attempt (0-based) only (-1: any)
    int64_t offset = -1;         // fire on attempts starting at this file offset (-1: any)
    int op = -1;                 // 0 read, 1 write, -1 any
    int times = 1;               // how many times it may fire (-1: always)
    uint64_t alignment = 4096;   // kShort: the short count is rounded down to this
  };
  void Add(const Rule& rule);
  int64_t OnResult(const IoFaultPoint& point, int64_t result) override;
  // How many times rules fired, and attempts seen.
  uint64_t fired() const;
  uint64_t attempts() const;

 private:
  mutable std::mutex mu_;
  std::vector<Rule> rules_;
  uint64_t fired_ = 0;
  uint64_t attempts_ = 0;
};

}  // namespace strata
