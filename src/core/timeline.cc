// Timeline: spans per track, busy-time union, Chrome trace output.
#include "strata/timeline.h"

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata {

namespace {
double Seconds(Timeline::Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Micros(Timeline::Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }
}  // namespace

Timeline::Timeline(bool enabled, size_t max_spans)
    : enabled_(enabled), max_spans_(max_spans), origin_(Clock::now()) {}

Timeline::Clock::time_point Timeline::origin() const {
  std::lock_guard<std::mutex> lock(mu_);
  return origin_;
}

int Timeline::AddTrack(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < tracks_.size(); ++i) {
    if (tracks_[i].name == name) return static_cast<int>(i);
  }
  tracks_.push_back(Track{std::string(name)});
  return static_cast<int>(tracks_.size() - 1);
}

std::string Timeline::TrackName(int track) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (track < 0 || static_cast<size_t>(track) >= tracks_.size()) return {};
  return tracks_[static_cast<size_t>(track)].name;
}

int Timeline::num_tracks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(tracks_.size());
}

void Timeline::Record(int track, std::string_view name, Clock::time_point begin, Clock::time_point end,
                      uint64_t bytes) {
  if (end < begin) end = begin;
  std::lock_guard<std::mutex> lock(mu_);
  if (track < 0 || static_cast<size_t>(track) >= tracks_.size()) return;
  Track& t = tracks_[static_cast<size_t>(track)];
  t.spans++;
  t.bytes += bytes;
  // Union of intervals, exact when spans arrive in order of their start (serial lanes);
  // a span starting before the covered end only adds what sticks out past it.
  if (begin < origin_) begin = std::min(origin_, end);
  Clock::time_point from = std::max(begin, t.covered_until);
  if (end > from) t.busy_s += Seconds(end - from);
  t.covered_until = std::max(t.covered_until, end);
  if (!enabled_) return;
  if (spans_.size() >= max_spans_) {
    dropped_++;
    return;
  }
  spans_.push_back(Span{track, std::string(name), begin, end, bytes});
}

std::vector<Timeline::TrackStats> Timeline::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<TrackStats> out;
  out.reserve(tracks_.size());
  for (const Track& t : tracks_) out.push_back(TrackStats{t.name, t.spans, t.bytes, t.busy_s});
  return out;
}

double Timeline::BusySeconds(int track) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (track < 0 || static_cast<size_t>(track) >= tracks_.size()) return 0;
  return tracks_[static_cast<size_t>(track)].busy_s;
}

std::vector<Timeline::Span> Timeline::Spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spans_;
}

uint64_t Timeline::dropped_spans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Timeline::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  spans_.clear();
  dropped_ = 0;
  origin_ = Clock::now();
  for (Track& t : tracks_) {
    t.spans = 0;
    t.bytes = 0;
    t.busy_s = 0;
    t.covered_until = origin_;
  }
}

std::string Timeline::ToChromeTraceJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json events = nlohmann::json::array();
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", 1}, {"tid", 0}, {"args", {{"name", "strata"}}}});
  for (size_t i = 0; i < tracks_.size(); ++i) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", static_cast<int>(i) + 1},
                      {"args", {{"name", tracks_[i].name}}}});
    events.push_back({{"name", "thread_sort_index"},
                      {"ph", "M"},
                      {"pid", 1},
                      {"tid", static_cast<int>(i) + 1},
                      {"args", {{"sort_index", i}}}});
  }
  for (const Span& s : spans_) {
    nlohmann::json e = {{"name", s.name},
                        {"ph", "X"},
                        {"pid", 1},
                        {"tid", s.track + 1},
                        {"ts", Micros(s.begin - origin_)},
                        {"dur", Micros(s.end - s.begin)}};
    if (s.bytes != 0) e["args"] = {{"bytes", s.bytes}};
    events.push_back(std::move(e));
  }
  nlohmann::json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  if (dropped_ != 0) doc["otherData"] = {{"dropped_spans", dropped_}};
  return doc.dump();
}

Status Timeline::WriteChromeTrace(const std::string& path) const {
  std::string text = ToChromeTraceJson();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return ErrnoError(errno, "opening trace file " + path + " for writing");
  out << text;
  out.close();
  if (!out) return IoError("writing trace file " + path + " failed (disk full?)");
  return OkStatus();
}

}  // namespace strata
