// Checkpoint directories: the save protocol (temporary directory, fsyncs, atomic rename)
// and the helpers over a parent of checkpoints (the newest one, keeping the newest K).
#include "zero/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <system_error>
#include <vector>

#include "strata/checkpoint.h"
#include "strata/log.h"
#include "zero/checkpoint_manifest.h"

namespace strata::ckpt {
namespace fs = std::filesystem;

namespace {

constexpr char kTmpInfix[] = ".tmp-";
constexpr size_t kTmpInfixLen = sizeof(kTmpInfix) - 1;

Status FsError(const std::error_code& ec, const std::string& what) { return ErrnoError(ec.value(), what); }

std::string ParentOf(const std::string& dir) {
  const std::string parent = fs::path(dir).parent_path().string();
  return parent.empty() ? "." : parent;
}

struct Complete {
  std::string path;
  int64_t step_calls = 0;
};

// The complete checkpoints under `parent`, oldest first.
Result<std::vector<Complete>> ListComplete(const std::string& parent) {
  std::error_code ec;
  fs::directory_iterator it(parent, ec);
  if (ec) return FsError(ec, "checkpoint: listing " + parent);
  std::vector<Complete> found;
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || IsTmpDirName(name)) continue;
    auto m = ReadManifest(e.path().string());
    if (m.ok()) found.push_back({e.path().string(), m->info.step_calls});
  }
  std::sort(found.begin(), found.end(), [](const Complete& a, const Complete& b) {
    return a.step_calls != b.step_calls ? a.step_calls < b.step_calls : a.path < b.path;
  });
  return found;
}

}  // namespace

std::string TrimDir(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return d;
}

std::string TmpDirFor(const std::string& dir, uint64_t nonce) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(nonce));
  return dir + kTmpInfix + hex;
}

bool IsTmpDirName(const std::string& name) {
  const size_t at = name.rfind(kTmpInfix);
  if (at == std::string::npos || at == 0 || name.size() != at + kTmpInfixLen + 16) return false;
  return std::all_of(name.begin() + at + kTmpInfixLen, name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

Status SyncDir(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "checkpoint: open directory " + path);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(err, "checkpoint: fsync directory " + path);
  return OkStatus();
}

void RemoveTree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) STRATA_LOG(kWarn, "ckpt") << "could not remove " << path << ": " << ec.message();
}

Status PrepareSaveDir(const std::string& dir, const std::string& tmp) {
  const std::string parent = ParentOf(dir);
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return FsError(ec, "checkpoint: creating " + parent);
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec) && !fs::exists(fs::path(dir) / kManifestName, ec)) {
    return FailedPreconditionError("checkpoint: " + dir +
                                   " exists and is not a checkpoint (no manifest.json); a save replaces only "
                                   "an older checkpoint: name another directory or remove it");
  }
  const std::string stem = fs::path(dir).filename().string() + kTmpInfix;
  std::error_code list_ec;
  for (const fs::directory_entry& e : fs::directory_iterator(parent, list_ec)) {
    const std::string name = e.path().filename().string();
    if (IsTmpDirName(name) && name.compare(0, stem.size(), stem) == 0) {
      STRATA_LOG(kInfo, "ckpt") << "removing " << e.path().string() << ", left by a save that did not finish";
      RemoveTree(e.path().string());
    }
  }
  if (list_ec) return FsError(list_ec, "checkpoint: listing " + parent);
  ec.clear();
  if (!fs::create_directory(tmp, ec) || ec) {
    return ec ? FsError(ec, "checkpoint: creating " + tmp)
              : FailedPreconditionError("checkpoint: " + tmp + " exists already (another save into " + dir +
                                        " at the same time?)");
  }
  return OkStatus();
}

Status CommitSaveDir(const std::string& tmp, const std::string& dir) {
  STRATA_RETURN_IF_ERROR(SyncDir(tmp));
  std::error_code ec;
  const bool replace = fs::exists(dir, ec);
  if (replace) {
    // One step: a crash leaves either the old checkpoint or the new one at `dir`.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) != 0) {
      return ErrnoError(errno, "checkpoint: exchanging " + tmp + " with the older checkpoint " + dir +
                                   " (renameat2 RENAME_EXCHANGE; the file system must support it to "
                                   "replace a checkpoint: save into a new directory instead)");
    }
  } else if (::rename(tmp.c_str(), dir.c_str()) != 0) {
    return ErrnoError(errno, "checkpoint: renaming " + tmp + " to " + dir);
  }
  STRATA_RETURN_IF_ERROR(SyncDir(ParentOf(dir)));
  if (replace) RemoveTree(tmp);  // the older checkpoint, now under the temporary name
  return OkStatus();
}

}  // namespace strata::ckpt

namespace strata {

std::string CheckpointPath(const std::string& parent, int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%09lld", static_cast<long long>(step));
  return ckpt::TrimDir(parent) + "/" + name;
}

Result<std::string> LatestCheckpoint(const std::string& parent) {
  STRATA_ASSIGN_OR_RETURN(auto found, ckpt::ListComplete(parent));
  if (found.empty()) return NotFoundError("checkpoint: no complete checkpoint under " + parent);
  return found.back().path;
}

Status KeepNewestCheckpoints(const std::string& parent, int keep) {
  if (keep < 1) return InvalidArgumentError("checkpoint: keep " + std::to_string(keep) + "; keep at least 1");
  STRATA_ASSIGN_OR_RETURN(auto found, ckpt::ListComplete(parent));
  for (size_t i = 0; i + keep < found.size(); ++i) {
    STRATA_LOG(kInfo, "ckpt") << "removing " << found[i].path << " (keeping the newest " << keep << ")";
    ckpt::RemoveTree(found[i].path);
  }
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(parent, ec)) {
    if (e.is_directory(ec) && ckpt::IsTmpDirName(e.path().filename().string())) {
      STRATA_LOG(kInfo, "ckpt") << "removing " << e.path().string() << ", left by a save that did not finish";
      ckpt::RemoveTree(e.path().string());
    }
  }
  if (ec) return ErrnoError(ec.value(), "checkpoint: listing " + parent);
  return OkStatus();
}

}  // namespace strata
