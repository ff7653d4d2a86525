// Runs the `strata` binary as a user would: arguments, captured stdout and stderr, the
// exit status, and (for interruption tests) a signal sent once a line has appeared.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

namespace strata::testing {

struct CliRun {
  std::string out, err;
  int exit_status = -1;  // the process's exit code; 128 + n when killed by signal n
  double seconds_after_signal = -1;
};

// Runs `program` with `args`. With `trigger` non-empty, calls `action` with the child's
// pid once that text has appeared on stdout; seconds_after_signal counts from then.
inline CliRun RunProgram(const std::string& program, const std::vector<std::string>& args,
                         const std::string& trigger, const std::function<void(pid_t)>& action,
                         int timeout_s = 240) {
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(program.c_str(), argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  CliRun r;
  bool signalled = false;
  auto start = std::chrono::steady_clock::now(), sent = start;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(timeout_s)) {
      ::kill(pid, SIGKILL);
      break;
    }
    if (::poll(fds, 2, 100) < 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
        continue;
      }
      (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
    }
    if (!signalled && !trigger.empty() && r.out.find(trigger) != std::string::npos) {
      action(pid);
      signalled = true;
      sent = std::chrono::steady_clock::now();
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (signalled)
    r.seconds_after_signal = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
  r.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Runs STRATA_BINARY with `args`; with `signal_after` non-empty, sends it `sig` once
// that text has appeared on stdout.
inline CliRun RunStrata(const std::vector<std::string>& args, const std::string& signal_after = "",
                        int sig = 0) {
  return RunProgram(STRATA_BINARY, args, signal_after, [sig](pid_t pid) { ::kill(pid, sig); });
}

// Token files in `data_dir` from `dir`/text.txt, sentences of four repeating words that a
// tiny GPT learns within a few dozen steps (`strata data prepare`, byte-level). Fails
// the test (ASSERT) when preparing fails.
inline void PrepareWordData(const std::filesystem::path& dir, const std::string& data_dir) {
  const std::string text = (dir / "text.txt").string();
  std::ofstream out(text);
  const char* words[] = {"alpha", "beta", "gamma", "delta"};
  for (int i = 0; i < 2000; ++i) out << words[i % 4] << (i % 9 == 8 ? ".\n" : " ");
  out.close();
  CliRun r = RunStrata({"data", "prepare", text, "--out", data_dir});
  ASSERT_EQ(r.exit_status, 0) << r.err;
}

// A fixture with a fresh folder of its own under the temp directory (named by `prefix` and
// the pid), removed after each test.
class ScratchDirTest : public ::testing::Test {
 protected:
  explicit ScratchDirTest(const std::string& prefix) : prefix_(prefix) {}
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / (prefix_ + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;

 private:
  std::string prefix_;
};

}  // namespace strata::testing
