// Token data for language-model training: a token file format, the tool that writes it
// from text (byte-level tokens, or GPT-2's BPE), a memory-mapped reader, and
// deterministic batches.
//
// Token file format (version 1, little-endian):
//   offset  size  field
//        0     8  magic "STRTOKN\0"
//        8     4  format version (uint32, 1)
//       12     4  token width in bytes (uint32: 2 when vocab <= 65536, else 4)
//       16     8  vocab size (uint64, >= 1, fits the token width)
//       24     8  token count (uint64)
//       32    24  reserved, zero
//       56     8  header checksum (uint64: FNV-1a 64 of bytes 0-55)
//       64     -  token count tokens, each an unsigned integer of the token width
// The file is exactly 64 + count * width bytes.
//
// Contract:
//  - PrepareTokens tokenises text byte by byte (vocab 256: token = byte value, no
//    vocabulary files) or, given a BpeTokenizer (strata/bpe.h), each input file with it;
//    concatenates the inputs' tokens in the order given, and writes
//    <out_dir>/train.tokens (the stream's head) and <out_dir>/val.tokens (its tail).
//    With BPE, it copies vocab.json and merges.txt to <out_dir>/tokenizer/, where
//    training finds them to encode its prompt and decode its samples; byte-level
//    preparation removes that directory's two files, so it never describes other tokens.
//    Each file appears whole or not at all (temporary name, fsync, rename).
//  - TokenFile::Open maps a file read-only and validates all of it once: header, size and
//    every token id against the vocabulary. After a successful Open the accessors cannot
//    fail. Errors name the path and what is wrong: NotFound (missing), Corruption
//    (truncated, trailing bytes, bad checksum, token out of vocabulary), InvalidArgument
//    (not a token file, unknown version or width, vocab that does not fit the width).
//  - Batches follow the sample numbering of strata/model.h (BatchSlice): a sample is a
//    pure function of (seed, global sample index), so world size N with micro-batch B
//    sees exactly the samples of world size 1 with micro-batch N * B.
//  - Thread-safety: a TokenFile is immutable after Open; its const methods and FillBatch
//    may be called from any number of threads. PrepareTokens calls on different out_dirs
//    may run concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "strata/bpe.h"
#include "strata/model.h"
#include "strata/status.h"

namespace strata::model {

inline constexpr char kTokenFileMagic[8] = {'S', 'T', 'R', 'T', 'O', 'K', 'N', '\0'};
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenHeaderBytes = 64;
inline constexpr int64_t kByteVocab = 256;
// One training block of the default GPT (block_size 1024) plus its shifted target: the
// validation split is never smaller, so validation always has a full sequence.
inline constexpr int64_t kMinValidationTokens = 1025;
// Where Debian's fortunes and fortunes-min packages install their text.
inline constexpr char kDefaultCorpusDir[] = "/usr/share/games/fortunes";
// The subdirectory of a data directory that holds its BPE tokenizer's two files.
inline constexpr char kTokenizerDir[] = "tokenizer";

struct TokenFileHeader {
  uint32_t version = kTokenFileVersion;
  uint32_t token_width = 2;
  uint64_t vocab = kByteVocab;
  uint64_t count = 0;
};

// The 64 header bytes for `header`, with magic and checksum (for writers and tests).
std::string EncodeTokenHeader(const TokenFileHeader& header);
// The token width the format uses for a vocabulary: 2 up to 65536 ids, else 4.
uint32_t TokenWidthForVocab(uint64_t vocab);

struct PreparedSplit {
  std::string path;
  int64_t tokens = 0;
};
struct PrepareReport {
  std::vector<std::string> inputs;
  int64_t input_bytes = 0;
  int64_t vocab = kByteVocab;
  PreparedSplit train, val;
};

// Tokenises `files` (byte-level, or with `bpe` when given) into <out_dir>/train.tokens
// and <out_dir>/val.tokens. The validation split is the last
// max(ceil(validation_fraction * n), min_validation_tokens) tokens of the n-token stream;
// the training split must keep at least as many. Creates out_dir if needed. Inputs are
// read whole into memory, and their tokens kept there (4 bytes a token).
// Errors, each naming the file or directory: InvalidArgument for no inputs, a fraction
// outside [0, 1), an empty input, one too short to split, or (BPE) text that is not
// UTF-8, with its byte offset; NotFound for a missing input; IoError/Unavailable (errno
// text) for an unreadable input or an out_dir that cannot be created or written. On
// error, no output file is replaced and no temporary is left.
Result<PrepareReport> PrepareTokens(const std::vector<std::string>& files, const std::string& out_dir,
                                    double validation_fraction = 0.05,
                                    int64_t min_validation_tokens = kMinValidationTokens,
                                    BpeTokenizer* bpe = nullptr);

// The BPE tokenizer kept beside `token_file` (its directory's kTokenizerDir), or nullopt
// for byte-level tokens. InvalidArgument, naming both, when the tokenizer's vocabulary
// is not the token file's `vocab`; the errors of LoadBpeIn.
Result<std::optional<BpeTokenizer>> LoadDataTokenizer(const std::string& token_file, int64_t vocab);

// The default corpus: the plain-text files of `dir` (not *.dat or *.u8 index files, not
// links or directories), sorted by name. NotFound, telling to run scripts/setup.sh, when
// the directory is missing or holds none.
Result<std::vector<std::string>> DefaultCorpusFiles(const std::string& dir = kDefaultCorpusDir);

class TokenFile {
 public:
  // Maps `path` read-only and validates it (see the contract for the errors).
  static Result<TokenFile> Open(const std::string& path);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int64_t vocab() const { return vocab_; }
  int64_t size() const { return count_; }  // tokens
  uint32_t token_width() const { return width_; }
  // The tokens' bytes, the header left out: what stays resident once the file is read.
  uint64_t token_bytes() const { return static_cast<uint64_t>(count_) * width_; }
  // Token i; requires 0 <= i < size().
  int32_t token(int64_t i) const;
  // Tokens [start, start + len) into out; requires the range inside [0, size()).
  void Window(int64_t start, int64_t len, int32_t* out) const;

 private:
  TokenFile() = default;
  void Unmap();

  std::string path_;
  const uint8_t* map_ = nullptr;  // whole file, header included
  size_t map_bytes_ = 0;
  int64_t vocab_ = 0, count_ = 0;
  uint32_t width_ = 0;
};

// The start of sample `sample` under `seed`: uniform in [0, file_size - seq - 1], a pure
// function of its arguments. Requires file_size > seq >= 1.
int64_t SampleStart(uint64_t seed, int64_t sample, int64_t file_size, int64_t seq);

// The slice's micro-batch: for j in [0, slice.micro_batch_size), sample
// s = slice.FirstSampleIndex() + j starts at p = SampleStart(seed, s, file.size(), seq);
// tokens[j * seq + t] = file.token(p + t) and targets[j * seq + t] = file.token(p + t + 1).
// tokens and targets each hold micro_batch_size * seq values. Requires file.size() > seq >= 1
// (callers check it once at setup, with a message naming the file) and a valid slice.
void FillBatch(const TokenFile& file, uint64_t seed, const BatchSlice& slice, int64_t seq, int32_t* tokens,
               int32_t* targets);

}  // namespace strata::model
