// Timeline: a thread-safe recorder of timed spans on named tracks ("lanes"), written as
// a Chrome trace (JSON; opens in Perfetto and chrome://tracing) with one track per lane.
//
// The tier manager records every move on it (one track per lane: h2d, d2h, nvme-read,
// nvme-write, cpu); the engine records its own compute, communication and optimizer
// spans on the same instance, so a user sees in one picture what overlapped and what
// waited.
//
// Contract:
//  - Times are steady_clock; the trace's zero is the Timeline's creation (or Clear()).
//  - AddTrack() returns a stable id; adding a name twice returns the same id.
//  - Record() stores a span; spans on one track may overlap (a lane with depth > 1):
//    BusySeconds() counts the union of a track's spans, never double.
//  - A disabled timeline (enabled = false) keeps no spans but still accumulates busy
//    time and span counts per track, so telemetry works without the memory cost.
//  - At most `max_spans` spans are kept (oldest kept, newer dropped and counted in
//    dropped_spans()); busy time is still accumulated for dropped spans.
//  - Threads: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata {

class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  struct Span {
    int track = 0;
    std::string name;
    Clock::time_point begin;
    Clock::time_point end;
    uint64_t bytes = 0;  // 0: not a transfer
  };

  struct TrackStats {
    std::string name;
    uint64_t spans = 0;
    uint64_t bytes = 0;
    double busy_s = 0;  // union of the track's spans
  };

  explicit Timeline(bool enabled = true, size_t max_spans = 1'000'000);
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  bool enabled() const { return enabled_; }
  Clock::time_point origin() const;

  // Returns the id of the track called `name`, creating it when new.
  int AddTrack(std::string_view name);
  std::string TrackName(int track) const;
  int num_tracks() const;

  // Records [begin, end) on `track` (end < begin is clamped to begin).
  void Record(int track, std::string_view name, Clock::time_point begin, Clock::time_point end,
              uint64_t bytes = 0);

  // Records the span from construction to destruction.
  class Scope {
   public:
    Scope(Timeline* timeline, int track, std::string name, uint64_t bytes = 0)
        : timeline_(timeline), track_(track), name_(std::move(name)), bytes_(bytes), begin_(Clock::now()) {}
    ~Scope() {
      if (timeline_ != nullptr) timeline_->Record(track_, name_, begin_, Clock::now(), bytes_);
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Timeline* timeline_;
    int track_;
    std::string name_;
    uint64_t bytes_;
    Clock::time_point begin_;
  };

  // Per-track totals since creation or Clear().
  std::vector<TrackStats> Stats() const;
  double BusySeconds(int track) const;
  std::vector<Span> Spans() const;
  uint64_t dropped_spans() const;

  // Forgets spans and totals (tracks stay) and moves the origin to now.
  void Clear();

  // The Chrome trace event format: {"traceEvents": [...], "displayTimeUnit": "ms"}, one
  // complete ("X") event per span with ts/dur in microseconds, args.bytes, and a
  // thread_name metadata event per track.
  std::string ToChromeTraceJson() const;
  // Writes ToChromeTraceJson() to `path` (IoError naming the path on failure).
  Status WriteChromeTrace(const std::string& path) const;

 private:
  struct Track {
    std::string name;
    uint64_t spans = 0;
    uint64_t bytes = 0;
    double busy_s = 0;
    Clock::time_point covered_until{};  // end of the union so far (spans recorded in rough order)
  };
  const bool enabled_;
  const size_t max_spans_;
  mutable std::mutex mu_;
  Clock::time_point origin_;
  std::vector<Track> tracks_;
  std::vector<Span> spans_;
  uint64_t dropped_ = 0;
};

}  // namespace strata
