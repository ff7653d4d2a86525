#include "strata/swap_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>

#include "strata/units.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

int ReadPid(const std::string& lock_path) {
  int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[32] = {};
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  return n > 0 ? std::atoi(buf) : 0;
}

uint64_t AllocatedBytes(const std::string& path) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

}  // namespace

namespace {

// Splits "strata-optim-r1.swap" into stem "strata-optim", rank 1 and "swap"; false for
// any other name.
bool ParseSwapName(const std::string& name, std::string* stem, int* rank, bool* swap) {
  const size_t dot = name.rfind('.');
  if (name.rfind("strata-", 0) != 0 || dot == std::string::npos) return false;
  const std::string ext = name.substr(dot + 1);
  if (ext != "swap" && ext != "lock") return false;
  const size_t r = name.rfind("-r", dot);
  if (r == std::string::npos || r + 2 >= dot || r < 7) return false;
  const std::string digits = name.substr(r + 2, dot - r - 2);
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  *stem = name.substr(0, r);
  *rank = std::stoi(digits);
  *swap = ext == "swap";
  return true;
}

}  // namespace

std::vector<SwapFileInfo> ListSwapFiles(const std::string& dir) {
  std::map<std::string, SwapFileInfo> by_store;  // "<stem>-r<rank>"
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    std::string stem;
    int rank = 0;
    bool swap = false;
    if (!ParseSwapName(e.path().filename().string(), &stem, &rank, &swap)) continue;
    SwapFileInfo& f = by_store[stem + "-r" + std::to_string(rank)];
    f.stem = stem;
    f.rank = rank;
    (swap ? f.swap_path : f.lock_path) = e.path().string();
  }
  std::vector<SwapFileInfo> out;
  for (auto& [key, f] : by_store) {
    f.bytes = AllocatedBytes(f.swap_path);
    if (!f.lock_path.empty()) f.owner_pid = ReadPid(f.lock_path);
    out.push_back(std::move(f));
  }
  return out;
}

Result<std::vector<SwapFileInfo>> RemoveStaleSwapFiles(const std::string& dir, int first_rank,
                                                       std::vector<SwapFileInfo>* in_use) {
  std::vector<SwapFileInfo> removed;
  for (SwapFileInfo& f : ListSwapFiles(dir)) {
    if (f.rank < first_rank) continue;
    int fd = -1;
    if (!f.lock_path.empty()) {
      fd = ::open(f.lock_path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        ::close(fd);
        if (in_use) in_use->push_back(f);
        continue;  // a live store: not ours to touch
      }
    }
    Status s = OkStatus();
    for (const std::string& p : {f.swap_path, f.lock_path}) {
      if (!p.empty() && ::unlink(p.c_str()) != 0 && errno != ENOENT && s.ok()) {
        s = ErrnoError(errno, "removing stale swap file " + p + " (remove it by hand: rm -f " + p + ")");
      }
    }
    if (fd >= 0) ::close(fd);
    STRATA_RETURN_IF_ERROR(s);
    removed.push_back(std::move(f));
  }
  return removed;
}

std::vector<SwapFileInfo> OwnSwapFiles(const std::string& dir) {
  std::vector<SwapFileInfo> own;
  const int pid = static_cast<int>(::getpid());
  for (SwapFileInfo& f : ListSwapFiles(dir)) {
    if (f.owner_pid == pid) own.push_back(std::move(f));
  }
  return own;
}

std::string DescribeSwapFiles(const std::vector<SwapFileInfo>& files) {
  uint64_t bytes = 0;
  std::string names;
  int count = 0;
  for (const SwapFileInfo& f : files) {
    bytes += f.bytes;
    for (const std::string& p : {f.swap_path, f.lock_path}) {
      if (p.empty()) continue;
      names += (count++ ? ", " : "") + p;
    }
  }
  return FormatBytes(bytes) + " in " + std::to_string(count) + (count == 1 ? " file: " : " files: ") + names;
}

}  // namespace strata
