#include "cli/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>

namespace strata::cli {
namespace {

// No swap file of this process was found: its state was all in memory (the host budget
// held it), or the engine had not made its stores yet.
constexpr char kNoSwapFiles[] = "it had no swap files (its state was in memory, or not made yet)";

sigset_t StopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

const char* SignalName(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "a signal"; }

// Waits up to `ms` for SIGINT or SIGTERM; 0 when none came.
int WaitSignal(int ms) {
  const sigset_t set = StopSignals();
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  const int sig = ::sigtimedwait(&set, nullptr, &ts);
  return sig > 0 ? sig : 0;
}

}  // namespace

InterruptGuard::InterruptGuard(Options options) : options_(options) {
  const sigset_t set = StopSignals();
  ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
  watcher_ = std::thread([this] { Watch(); });
}

InterruptGuard::~InterruptGuard() {
  stop_.store(true);
  watcher_.join();
}

void InterruptGuard::SetSwap(std::vector<std::string> dirs, int rank, int world_size) {
  std::lock_guard lock(mu_);
  dirs_ = std::move(dirs);
  rank_ = rank;
  world_size_ = world_size;
}

Status InterruptGuard::Check() const {
  const int sig = signal();
  if (sig == 0) return OkStatus();
  return AbortedError(std::string("interrupted by ") + SignalName(sig));
}

std::string InterruptGuard::Prefix() const {
  std::lock_guard lock(mu_);
  return world_size_ > 1 ? "strata: rank " + std::to_string(rank_) + ": " : "strata: ";
}

void InterruptGuard::Watch() {
  while (!stop_.load()) {
    if (const int sig = WaitSignal(100)) OnSignal(sig);
  }
}

void InterruptGuard::SetPeers(std::vector<int> pids) {
  std::lock_guard lock(mu_);
  peer_pids_ = std::move(pids);
}

std::string InterruptGuard::LostPeers() const {
  std::vector<int> pids;
  {
    std::lock_guard lock(mu_);
    pids = peer_pids_;
  }
  std::string lost;
  for (size_t r = 0; r < pids.size(); ++r) {
    if (pids[r] <= 0 || pids[r] == ::getpid()) continue;
    // A killed child stays a zombie until its launcher reaps it: gone all the same.
    std::FILE* f = std::fopen(("/proc/" + std::to_string(pids[r]) + "/stat").c_str(), "r");
    char state = 'X';
    if (f != nullptr) {
      if (std::fscanf(f, "%*d (%*[^)]) %c", &state) != 1) state = '?';
      std::fclose(f);
    }
    if (state != 'X' && state != 'Z') continue;
    lost += (lost.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " (pid " + std::to_string(pids[r]) +
                                          ") has died (killed or crashed)");
  }
  return lost;
}

std::vector<SwapFileInfo> InterruptGuard::TakeOwnFiles(bool remove) {
  std::vector<SwapFileInfo> files;
  std::lock_guard lock(mu_);
  for (const std::string& d : dirs_) {
    for (SwapFileInfo& f : OwnSwapFiles(d)) {
      if (remove) {
        for (const std::string& p : {f.swap_path, f.lock_path}) {
          if (!p.empty()) ::unlink(p.c_str());
        }
      }
      files.push_back(std::move(f));
    }
  }
  if (remove) removed_.insert(removed_.end(), files.begin(), files.end());
  return files;
}

std::string InterruptGuard::Removed() const {
  std::lock_guard lock(mu_);
  return removed_.empty() ? std::string(kNoSwapFiles)
                          : "removed its swap files (" + DescribeSwapFiles(removed_) + ")";
}

void InterruptGuard::OnSignal(int sig) {
  if (signal_.load() != 0) EndNow(sig, "a second signal");
  if (options_.keep_swap) {
    signal_.store(sig, std::memory_order_release);
    EndNow(sig, "--keep-swap");
  }
  TakeOwnFiles(/*remove=*/true);
  signal_.store(sig, std::memory_order_release);
  const std::string lost = LostPeers();
  std::fprintf(stderr, "%s%s received%s: stopping the run; %s (send it again to end at once)\n",
               Prefix().c_str(), SignalName(sig), lost.empty() ? "" : (" after " + lost).c_str(),
               Removed().c_str());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.grace_s);
  while (std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(mu_);
      if (unwound_) return;
    }
    if (const int again = WaitSignal(20)) EndNow(again, "a second signal");
  }
  {
    std::lock_guard lock(mu_);
    if (unwound_) return;
  }
  EndNow(sig, "the run did not stop in time");
}

void InterruptGuard::EndNow(int sig, const char* why) {
  std::string what;
  if (options_.keep_swap) {
    std::vector<SwapFileInfo> files = TakeOwnFiles(/*remove=*/false);
    what = files.empty() ? std::string("; ") + kNoSwapFiles
                         : "; kept its swap files for inspection (" + DescribeSwapFiles(files) +
                               "); delete them with: rm -f";
    for (const SwapFileInfo& f : files) what += " " + f.swap_path + " " + f.lock_path;
  } else {
    bool announced = false;  // said so as the signal came
    {
      std::lock_guard lock(mu_);
      announced = !removed_.empty();
    }
    const size_t more = TakeOwnFiles(/*remove=*/true).size();
    if (!announced || more > 0) what = "; " + Removed();
  }
  std::fprintf(stderr, "%s%s: ended at once (%s)%s; exit status %d\n", Prefix().c_str(), SignalName(sig), why,
               what.c_str(), 128 + sig);
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(128 + sig);
}

std::string InterruptGuard::FinishUnwind(int* exit_code) {
  {
    std::lock_guard lock(mu_);
    unwound_ = true;
  }
  TakeOwnFiles(/*remove=*/true);  // a store opened after the signal came
  const int sig = signal();
  *exit_code = 128 + sig;
  return Prefix() + "interrupted by " + SignalName(sig) + ": stopped the run; " + Removed() +
         "; exit status " + std::to_string(*exit_code);
}

}  // namespace strata::cli
