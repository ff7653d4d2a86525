// strata.overlap "auto": whether the engine overlaps the optimizer with the backward is
// measured on the run itself, not guessed (internal).
//
// Why: overlap is not always faster. When the CPU steps the optimizer and the model runs
// on the same cores (the sim device, or a CPU-bound host), the speculative steps take
// cores from the backward, and the overlapped step is slower than the serial one (20M
// MLP, stage 2, optimizer on the CPU, 2 cores: 0.11 s against 0.08 s). On a GPU the
// backward does not need the cores, and overlap wins. The two schedules give the same
// result bit for bit (engine_test), so the engine may switch between them at any
// window boundary: it times a few windows of each, interleaved against drift, and keeps
// the faster. A pure state machine, tested on its own.
#pragma once

#include <string>

namespace strata::zero {

class OverlapTuner {
 public:
  // Windows timed in each mode; the first window (trace recording, first touch) is not.
  static constexpr int kTrialsPerMode = 2;

  // enabled false: the mode stays `fixed` (an explicit strata.overlap).
  OverlapTuner(bool enabled, bool fixed);

  // The mode of window `window` (0-based, one per Step()).
  bool ModeFor(int window) const;

  // The wall seconds of window `window` (from the end of the previous Step() to the end
  // of its own), in the order they end. Returns true when this sample decided the mode.
  bool Record(int window, double seconds);

  bool decided() const { return decided_; }
  // "overlapped 0.112 s, serial 0.081 s a step (best of 2 each): overlap off", once decided.
  const std::string& reason() const { return reason_; }

 private:
  bool enabled_;
  bool mode_;  // the decision, or the fixed mode
  bool decided_ = false;
  double best_on_ = 0, best_off_ = 0;
  int seen_on_ = 0, seen_off_ = 0;
  std::string reason_;
};

}  // namespace strata::zero
