// Lanes: one FIFO worker per kind of move (h2d, d2h, nvme-read, nvme-write, cpu). A lane
// runs one job at a time, in submission order, so its busy time is the sum of its jobs.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "strata/tier.h"

namespace strata::tiering {

class LaneSet {
 public:
  LaneSet();
  // Drains every lane, then joins the workers.
  ~LaneSet();
  LaneSet(const LaneSet&) = delete;
  LaneSet& operator=(const LaneSet&) = delete;

  void Submit(Lane lane, std::function<void()> job);

 private:
  struct Worker {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> jobs;
    bool stop = false;
    std::thread thread;
  };
  static void Run(Worker* w);
  std::array<Worker, kNumLanes> workers_;
};

}  // namespace strata::tiering
