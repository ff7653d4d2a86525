// The tables behind BpeTokenizer (include/strata/bpe.h): built by bpe_files.cc from
// vocab.json and merges.txt, used by bpe.cc to encode and decode.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "strata/bpe.h"
#include "strata/status.h"

namespace strata::model {

// GPT-2's bytes_to_unicode: the code point that stands for each byte in vocabulary
// strings. Printable Latin-1 bytes stand for themselves; the other 68 take 256, 257, ...
// in byte order, so no token string holds a space or a control character.
std::array<char32_t, 256> ByteToCodePoint();

struct BpeTables {
  std::string vocab_path, merges_path;
  std::array<int32_t, 256> byte_id{};  // the single-byte token of each byte
  // Per id: the bytes it stands for, and whether the vocabulary has the id at all.
  std::vector<std::string> id_bytes;
  std::vector<uint8_t> id_present;
  struct Merge {
    int32_t rank = 0;    // line order: lower merges first
    int32_t result = 0;  // the id of the two tokens joined
  };
  std::unordered_map<uint64_t, Merge> merges;  // by PairKey(left, right)
  // PCRE2's compiled pattern (bpe.cc owns its lifetime); matching with it is thread-safe,
  // each thread with match data of its own.
  void* pattern = nullptr;
  ~BpeTables();

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
};

// Reads and checks both files (bpe.h's contract) into `t`, all but the pattern.
Status LoadBpeTables(const std::string& vocab_path, const std::string& merges_path, BpeTables* t);

// The offset of the first byte of `text` that does not begin or continue a valid UTF-8
// sequence (overlong forms, surrogates and code points past U+10FFFF are invalid), or
// text.size() when all of it is valid.
size_t FirstInvalidUtf8(std::string_view text);

}  // namespace strata::model
