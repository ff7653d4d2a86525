// GPT-2's byte-level BPE tokenizer, read from the two files GPT-2 ships and that Hugging
// Face's `gpt2` model and its ByteLevelBPETokenizer save: vocab.json (token string -> id,
// the strings written in GPT-2's byte-to-Unicode alphabet) and merges.txt (one merge
// "a b" per line, highest priority first, after an optional "#version" line).
//
// Contract:
//  - Encode splits UTF-8 text with GPT-2's pre-tokenisation pattern
//      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//    (PCRE2, Unicode properties), then merges each piece's bytes by merge priority, as
//    GPT-2's encoder.py and tokenizers' BPE model do. All input is text: a special token
//    such as <|endoftext|> in it is encoded as its characters.
//  - Decode maps ids back to the bytes they stand for; Decode(Encode(t)) == t.
//  - Load checks the files whole: every one of the 256 byte symbols has an id, ids are
//    unique and in [0, 2^31), each merge names two tokens whose concatenation is in the
//    vocabulary. Errors name the file, the line or token, and what is wrong: NotFound
//    for a missing file, InvalidArgument for the rest.
//  - Encode of a text over 1 MiB cuts it into blocks of about 256 KiB where no piece can
//    cross (after a newline that a printable non-space ASCII character follows) and
//    encodes them on the caller's oneTBB arena; the tokens are those of one pass.
//  - Thread-safety: Encode caches pieces it has merged, so one thread at a time may call
//    Encode on an object; Decode, vocab_size and the accessors are const and may be
//    called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strata/status.h"

namespace strata::model {

inline constexpr char kBpeVocabFile[] = "vocab.json";
inline constexpr char kBpeMergesFile[] = "merges.txt";

struct BpeTables;  // src/model/bpe_tables.h
class BpeEncoder;  // src/model/bpe.cc

class BpeTokenizer {
 public:
  static Result<BpeTokenizer> Load(const std::string& vocab_path, const std::string& merges_path);

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

  // InvalidArgument naming the byte offset of the first invalid UTF-8 sequence in `text`.
  Result<std::vector<int32_t>> Encode(std::string_view text);
  // InvalidArgument naming the first id outside the vocabulary.
  Result<std::string> Decode(const std::vector<int32_t>& ids) const;

  // One more than the largest id: the token file's vocabulary.
  int64_t vocab_size() const;
  int64_t merge_count() const;
  const std::string& vocab_path() const;
  const std::string& merges_path() const;

 private:
  explicit BpeTokenizer(std::unique_ptr<BpeTables> t);
  std::unique_ptr<BpeTables> t_;
  std::unique_ptr<BpeEncoder> encoder_;  // Encode's state for text encoded on the caller's thread
};

// The tokenizer that `strata data prepare --bpe DIR` keeps beside its token files:
// DIR/vocab.json and DIR/merges.txt, loaded; nullopt when neither exists (byte-level
// tokens). InvalidArgument when only one of the two exists.
Result<std::optional<BpeTokenizer>> LoadBpeIn(const std::string& dir);

}  // namespace strata::model
