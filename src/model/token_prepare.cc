// `strata data prepare`'s work: text to token files (byte-level or BPE), each written
// whole or not at all, and the tokenizer kept beside them (include/strata/token_data.h).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "strata/token_data.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

Result<std::string> ReadInput(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) return NotFoundError("input file \"" + path + "\" does not exist");
  if (fs::is_directory(st))
    return InvalidArgumentError("input \"" + path + "\" is a directory, not a text file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError(errno, "input file \"" + path + "\" cannot be opened");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return IoError("input file \"" + path + "\": read failed");
  if (bytes.empty()) return InvalidArgumentError("input file \"" + path + "\" is empty");
  return bytes;
}

Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoError(errno, "writing \"" + path + "\"");
    p += w;
    n -= static_cast<size_t>(w);
  }
  return OkStatus();
}

// Writes `parts` to `final_path` through a temporary name in the same directory, so a
// reader never sees a half-written file under the final name.
Status WriteWhole(const std::string& final_path, const std::vector<std::string_view>& parts) {
  const std::string tmp = final_path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "creating \"" + tmp + "\" in the output directory");
  Status s;
  for (std::string_view part : parts) {
    if (s.ok()) s = WriteAll(fd, part.data(), part.size(), tmp);
  }
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError(errno, "fsync \"" + tmp + "\"");
  if (::close(fd) != 0 && s.ok()) s = ErrnoError(errno, "closing \"" + tmp + "\"");
  if (s.ok() && ::rename(tmp.c_str(), final_path.c_str()) != 0)
    s = ErrnoError(errno, "renaming \"" + tmp + "\" to \"" + final_path + "\"");
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

// Tokens [begin, end) of `ids` as a token file of vocabulary `vocab`.
template <typename T>
Status WriteTokensAs(const std::string& path, const std::vector<int32_t>& ids, int64_t begin, int64_t end,
                     const TokenFileHeader& header) {
  std::vector<T> narrow(ids.begin() + begin, ids.begin() + end);
  const std::string head = EncodeTokenHeader(header);
  return WriteWhole(path, {head, std::string_view(reinterpret_cast<const char*>(narrow.data()),
                                                  narrow.size() * sizeof(T))});
}

Status WriteTokenFile(const std::string& path, const std::vector<int32_t>& ids, int64_t begin, int64_t end,
                      int64_t vocab) {
  TokenFileHeader header;
  header.vocab = static_cast<uint64_t>(vocab);
  header.token_width = TokenWidthForVocab(header.vocab);
  header.count = static_cast<uint64_t>(end - begin);
  return header.token_width == 2 ? WriteTokensAs<uint16_t>(path, ids, begin, end, header)
                                 : WriteTokensAs<uint32_t>(path, ids, begin, end, header);
}

// Makes the renames durable: without it a crash can lose the directory entries.
Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "opening output directory \"" + dir + "\"");
  Status s;
  if (::fsync(fd) != 0) s = ErrnoError(errno, "fsync output directory \"" + dir + "\"");
  ::close(fd);
  return s;
}

// Copies the tokenizer's files into out_dir/tokenizer (bpe != null), or removes the ones
// an earlier BPE preparation left there.
Status KeepTokenizer(const std::string& out_dir, const BpeTokenizer* bpe) {
  const fs::path dir = fs::path(out_dir) / kTokenizerDir;
  const fs::path files[2] = {dir / kBpeVocabFile, dir / kBpeMergesFile};
  std::error_code ec;
  if (bpe == nullptr) {
    for (const fs::path& f : files) {
      if (fs::remove(f, ec); ec) return UnavailableError("removing \"" + f.string() + "\": " + ec.message());
    }
    fs::remove(dir, ec);  // only when empty: what else is there is the user's
    return OkStatus();
  }
  fs::create_directories(dir, ec);
  if (ec) return UnavailableError("directory \"" + dir.string() + "\" cannot be created: " + ec.message());
  const std::string sources[2] = {bpe->vocab_path(), bpe->merges_path()};
  for (int k = 0; k < 2; ++k) {
    if (fs::equivalent(sources[k], files[k], ec)) continue;
    STRATA_ASSIGN_OR_RETURN(std::string text, ReadInput(sources[k]));
    STRATA_RETURN_IF_ERROR(WriteWhole(files[k].string(), {text}));
  }
  return SyncDirectory(dir.string());
}

// The tokens of every input, in order: each file's bytes, or its BPE tokens (a file is
// encoded on its own, as a document).
Result<std::vector<int32_t>> Tokenise(const std::vector<std::string>& files, BpeTokenizer* bpe,
                                      PrepareReport* report) {
  std::vector<int32_t> ids;
  for (const std::string& f : files) {
    STRATA_ASSIGN_OR_RETURN(std::string bytes, ReadInput(f));
    report->inputs.push_back(f);
    report->input_bytes += static_cast<int64_t>(bytes.size());
    if (bpe == nullptr) {
      for (unsigned char c : bytes) ids.push_back(c);
      continue;
    }
    Result<std::vector<int32_t>> part = bpe->Encode(bytes);
    if (!part.ok()) return part.status().WithContext("input file \"" + f + "\"");
    ids.insert(ids.end(), part->begin(), part->end());
  }
  return ids;
}

}  // namespace

Result<PrepareReport> PrepareTokens(const std::vector<std::string>& files, const std::string& out_dir,
                                    double validation_fraction, int64_t min_validation_tokens,
                                    BpeTokenizer* bpe) {
  if (files.empty()) return InvalidArgumentError("no input files to tokenise");
  if (!(validation_fraction >= 0.0 && validation_fraction < 1.0))
    return InvalidArgumentError("validation fraction " + std::to_string(validation_fraction) +
                                " is outside [0, 1)");
  if (min_validation_tokens < 1)
    return InvalidArgumentError("the minimum validation split must be >= 1 token");
  PrepareReport report;
  report.vocab = bpe == nullptr ? kByteVocab : bpe->vocab_size();
  STRATA_ASSIGN_OR_RETURN(std::vector<int32_t> ids, Tokenise(files, bpe, &report));
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t val = std::max(static_cast<int64_t>(std::ceil(validation_fraction * static_cast<double>(n))),
                               min_validation_tokens);
  if (n - val < min_validation_tokens)
    return InvalidArgumentError((files.size() == 1 ? "input file \"" + files[0] + "\" holds "
                                                   : std::to_string(files.size()) + " input files hold ") +
                                std::to_string(n) + " tokens; a validation split of " + std::to_string(val) +
                                " tokens needs at least " + std::to_string(val + min_validation_tokens) +
                                " (add text)");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return UnavailableError("output directory \"" + out_dir + "\" cannot be created: " + ec.message());
  report.train = {(fs::path(out_dir) / "train.tokens").string(), n - val};
  report.val = {(fs::path(out_dir) / "val.tokens").string(), val};
  STRATA_RETURN_IF_ERROR(WriteTokenFile(report.train.path, ids, 0, n - val, report.vocab));
  STRATA_RETURN_IF_ERROR(WriteTokenFile(report.val.path, ids, n - val, n, report.vocab));
  STRATA_RETURN_IF_ERROR(KeepTokenizer(out_dir, bpe));
  STRATA_RETURN_IF_ERROR(SyncDirectory(out_dir));
  return report;
}

Result<std::vector<std::string>> DefaultCorpusFiles(const std::string& dir) {
  const std::string hint = "; run scripts/setup.sh (it installs Debian's fortunes package)";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return NotFoundError("corpus directory \"" + dir + "\" does not exist" + hint);
  std::vector<std::string> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".dat" || ext == ".u8" || e.is_symlink() || !e.is_regular_file()) continue;
    files.push_back(e.path().string());
  }
  if (ec) return ErrnoError(ec.value(), "listing corpus directory \"" + dir + "\"");
  if (files.empty()) return NotFoundError("corpus directory \"" + dir + "\" holds no text files" + hint);
  std::sort(files.begin(), files.end());
  return files;
}

Result<std::optional<BpeTokenizer>> LoadDataTokenizer(const std::string& token_file, int64_t vocab) {
  const std::string dir = (fs::path(token_file).parent_path() / kTokenizerDir).string();
  STRATA_ASSIGN_OR_RETURN(std::optional<BpeTokenizer> bpe, LoadBpeIn(dir));
  if (bpe && bpe->vocab_size() != vocab)
    return InvalidArgumentError("the tokenizer in \"" + dir + "\" has a vocabulary of " +
                                std::to_string(bpe->vocab_size()) + " tokens, but \"" + token_file +
                                "\" has " + std::to_string(vocab) +
                                ": they are not from one `strata data prepare`; run it again");
  return bpe;
}

}  // namespace strata::model
