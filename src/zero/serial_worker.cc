#include "zero/serial_worker.h"

namespace strata::zero {

SerialWorker::~SerialWorker() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_future<Status> SerialWorker::Submit(std::function<Status()> job) {
  std::packaged_task<Status()> task(std::move(job));
  std::shared_future<Status> fut = task.get_future().share();
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { Run(); });
    jobs_.push_back(std::move(task));
  }
  cv_.notify_one();
  return fut;
}

void SerialWorker::Drain() {
  std::unique_lock lock(mu_);
  idle_cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
}

void SerialWorker::Run() {
  for (;;) {
    std::packaged_task<Status()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left: queued jobs always run
      task = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    task();
    {
      std::lock_guard lock(mu_);
      busy_ = false;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace strata::zero
