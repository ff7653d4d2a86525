// The fallback backend: pread/pwrite on a pool of threads. Each thread takes one piece
// at a time, so the pool size is the number of pieces in flight.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "tiering/io_fault.h"
#include "tiering/io_files.h"
#include "tiering/io_state.h"

namespace strata::detail {
namespace {

class PsyncEngine final : public IoEngine {
 public:
  explicit PsyncEngine(const IoEngineOptions& o) : IoEngine(o) {
    int n = std::clamp(o.queue_depth * o.threads, 1, 64);
    for (int i = 0; i < n; ++i) workers_.emplace_back([this] { Run(); });
  }

  ~PsyncEngine() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  std::string_view backend_name() const override { return "psync"; }

  Result<int> RegisterFile(const std::string& path, bool create) override {
    int fd = -1;
    return files_.Open(path, create, &fd);
  }
  Result<int> RegisterFd(int fd, const std::string& name) override { return files_.Adopt(fd, name); }
  Status UnregisterFile(int file) override { return files_.Release(file); }
  std::string FileName(int file) const override { return files_.name(file); }
  Status RegisterBuffers(std::span<const IoBufferRegion>) override { return OkStatus(); }

 protected:
  void SubmitValidated(std::span<const IoRequest> requests, std::shared_ptr<IoState> state) override {
    const uint64_t bs = options_.block_size;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ForEachPiece(requests, state.get(), bs,
                   [&](const IoPiece& p) { queue_[static_cast<int>(p.priority)].push_back(p); });
    }
    cv_.notify_all();
  }

  std::atomic<int>* FileInflight(int file) override { return files_.inflight(file); }

 private:
  void Run() {
    for (;;) {
      IoPiece p;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_[0].empty() || !queue_[1].empty(); });
        std::deque<IoPiece>& queue = queue_[1].empty() ? queue_[0] : queue_[1];  // urgent first
        if (queue.empty()) return;  // stop_ and drained
        p = queue.front();
        queue.pop_front();
      }
      Status st = Transfer(p);
      CompletePiece(p, st);
    }
  }

  Status Transfer(IoPiece& p) {
    counters_.pieces.fetch_add(1, std::memory_order_relaxed);
    const int fd = files_.fd(p.file);
    for (;;) {
      const uint64_t want = p.length - p.done;
      const uint64_t at = p.offset + p.done;
      ssize_t n = p.op == IoOp::kRead ? ::pread(fd, p.buffer + p.done, want, static_cast<off_t>(at))
                                      : ::pwrite(fd, p.buffer + p.done, want, static_cast<off_t>(at));
      int64_t result = n < 0 ? -errno : n;
      if (options_.fault_hook) {
        result = options_.fault_hook->OnResult(IoFaultPoint{p.op, p.file, at, want}, result);
      }
      PieceOutcome out = CheckPieceResult(p, result, files_);
      if (out.step == PieceStep::kDone) return OkStatus();
      if (out.step == PieceStep::kFailed) return out.status;
      if (out.short_retry) counters_.short_retries.fetch_add(1, std::memory_order_relaxed);
      if (out.again_retry) counters_.again_retries.fetch_add(1, std::memory_order_relaxed);
    }
  }

  FileTable files_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<IoPiece> queue_[2];  // by IoPriority
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<IoEngine> CreatePsyncEngine(const IoEngineOptions& options) {
  return std::make_unique<PsyncEngine>(options);
}

}  // namespace strata::detail
