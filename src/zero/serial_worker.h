// A thread that runs submitted jobs one at a time, in submission order. The engine
// uses one for collectives (their order must match across ranks), one for parameter
// fetches and one for the optimizer.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include "strata/status.h"

namespace strata::zero {

class SerialWorker {
 public:
  explicit SerialWorker(std::string name) : name_(std::move(name)) {}
  ~SerialWorker();
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `job`; the future holds its Status. Thread-safe. The thread starts on first use.
  std::shared_future<Status> Submit(std::function<Status()> job);
  // Waits until every job submitted so far has run.
  void Drain();

 private:
  void Run();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::packaged_task<Status()>> jobs_;
  bool stop_ = false;
  bool busy_ = false;
  std::thread thread_;
};

}  // namespace strata::zero
