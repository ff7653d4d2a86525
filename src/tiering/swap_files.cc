#include "strata/swap_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <regex>

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

std::vector<SwapFileInfo> ListSwapFiles(const std::string& dir) {
  static const std::regex kName(R"((strata-[a-z0-9-]+)-r([0-9]+)\.(swap|lock))");
  std::map<std::string, SwapFileInfo> by_store;  // "<stem>-r<rank>"
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    std::smatch m;
    if (!std::regex_match(name, m, kName)) continue;
    SwapFileInfo& f = by_store[m[1].str() + "-r" + m[2].str()];
    f.stem = m[1].str();
    f.rank = std::stoi(m[2].str());
    (m[3] == "swap" ? f.swap_path : f.lock_path) = e.path().string();
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
