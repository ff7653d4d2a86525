// Lane workers.
#include "tiering/tier_lanes.h"

namespace strata::tiering {

LaneSet::LaneSet() {
  for (Worker& w : workers_) w.thread = std::thread(&LaneSet::Run, &w);
}

LaneSet::~LaneSet() {
  for (Worker& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w.mu);
      w.stop = true;
    }
    w.cv.notify_all();
  }
  for (Worker& w : workers_) w.thread.join();
}

void LaneSet::Submit(Lane lane, std::function<void()> job) {
  Worker& w = workers_[static_cast<size_t>(lane)];
  {
    std::lock_guard<std::mutex> lock(w.mu);
    w.jobs.push_back(std::move(job));
  }
  w.cv.notify_one();
}

void LaneSet::Run(Worker* w) {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(w->mu);
      w->cv.wait(lock, [&] { return w->stop || !w->jobs.empty(); });
      if (w->jobs.empty()) return;  // stop requested and drained
      job = std::move(w->jobs.front());
      w->jobs.pop_front();
    }
    job();
  }
}

}  // namespace strata::tiering
