#include "tiering/io_fault.h"

namespace strata {

void ScriptedFaults::Add(const Rule& rule) {
  std::lock_guard<std::mutex> lock(mu_);
  rules_.push_back(rule);
}

int64_t ScriptedFaults::OnResult(const IoFaultPoint& p, int64_t result) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t n = attempts_++;
  for (Rule& r : rules_) {
    if (r.times == 0) continue;
    if (r.attempt >= 0 && static_cast<uint64_t>(r.attempt) != n) continue;
    if (r.offset >= 0 && static_cast<uint64_t>(r.offset) != p.offset) continue;
    if (r.op >= 0 && r.op != static_cast<int>(p.op)) continue;
    if (r.kind == Kind::kShort) {
      // Only shorten a successful transfer, and only to a non-zero aligned count so
      // the remainder stays valid for O_DIRECT.
      if (result <= 0) continue;
      int64_t s = (result / 2) / static_cast<int64_t>(r.alignment) * static_cast<int64_t>(r.alignment);
      if (s <= 0) continue;
      result = s;
    } else {
      result = -r.error;
    }
    if (r.times > 0) --r.times;
    ++fired_;
    break;
  }
  return result;
}

uint64_t ScriptedFaults::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}
uint64_t ScriptedFaults::attempts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return attempts_;
}

}  // namespace strata
