// The directory protocol of a checkpoint save (checkpoint.h): the temporary directory,
// the fsyncs, and the atomic rename that makes a save visible only once it is complete.
// Rank 0 runs these; every rank writes its files into the temporary directory between
// PrepareSaveDir and CommitSaveDir.
#pragma once

#include <cstdint>
#include <string>

#include "strata/status.h"

namespace strata::ckpt {

// `dir` without trailing slashes ("" stays "").
std::string TrimDir(const std::string& dir);
// "<dir>.tmp-<nonce as 16 hex digits>".
std::string TmpDirFor(const std::string& dir, uint64_t nonce);
// Whether a directory name is one TmpDirFor makes.
bool IsTmpDirName(const std::string& name);

// Before a save into `dir`: creates its parent, refuses (FailedPrecondition) a `dir` that
// exists and is neither empty nor a checkpoint (nothing of someone else's is replaced),
// removes what earlier saves into `dir` left behind (<dir>.tmp-*), and creates `tmp`.
Status PrepareSaveDir(const std::string& dir, const std::string& tmp);
// Makes the save complete: fsyncs `tmp` (its files are fsynced and its manifest written
// already), renames it to `dir` (exchanging it atomically with an older `dir`, which is
// then removed) and fsyncs the parent.
Status CommitSaveDir(const std::string& tmp, const std::string& dir);
// fsync of a directory, so the entries created in it survive a crash.
Status SyncDir(const std::string& path);
// Removes a tree, logging (not returning) what could not be removed.
void RemoveTree(const std::string& path);

}  // namespace strata::ckpt
