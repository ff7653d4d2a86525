#include "zero/overlap_tuner.h"

#include <algorithm>
#include <cstdio>

namespace strata::zero {
namespace {

// The trial windows alternate, 1 on, 2 off, 3 on, ... (window 0 runs on, untimed), until
// each mode has its samples: windows with an evaluation or a checkpoint are not timed.
// Past kLastTrial without them, overlap stays on.
constexpr int kLastTrial = 16;

bool TrialMode(int window) { return window % 2 == 1; }

}  // namespace

OverlapTuner::OverlapTuner(bool enabled, bool fixed) : enabled_(enabled), mode_(enabled ? true : fixed) {}

bool OverlapTuner::ModeFor(int window) const {
  if (!enabled_ || decided_) return mode_;
  // Overlap until the trials start and while the last one is waited for.
  if (window >= 1 && window <= kLastTrial) return TrialMode(window);
  return true;
}

bool OverlapTuner::Record(int window, double seconds) {
  if (!enabled_ || decided_ || window < 1 || window > kLastTrial || seconds <= 0) return false;
  auto keep = [seconds](double& best, int& seen) {
    best = seen == 0 ? seconds : std::min(best, seconds);
    ++seen;
  };
  if (TrialMode(window)) {
    keep(best_on_, seen_on_);
  } else {
    keep(best_off_, seen_off_);
  }
  if (seen_on_ < kTrialsPerMode || seen_off_ < kTrialsPerMode) return false;
  // Ties go to overlap: on a device with its own compute it is the faster in the end.
  mode_ = best_on_ <= best_off_;
  decided_ = true;
  char text[160];
  std::snprintf(text, sizeof(text), "overlapped %.3f s, serial %.3f s a step (best of %d each): overlap %s",
                best_on_, best_off_, kTrialsPerMode, mode_ ? "on" : "off");
  reason_ = text;
  return true;
}

}  // namespace strata::zero
