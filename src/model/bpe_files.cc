// Reading GPT-2's vocab.json and merges.txt into BpeTokenizer's tables, with the checks
// of include/strata/bpe.h.
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/bpe_tables.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

Result<std::string> ReadFile(const std::string& path, const char* what) {
  std::error_code ec;
  if (!fs::exists(path, ec))
    return NotFoundError(std::string("BPE ") + what + " \"" + path + "\" does not exist");
  if (fs::is_directory(path, ec))
    return InvalidArgumentError(std::string("BPE ") + what + " \"" + path + "\" is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError(errno, std::string("BPE ") + what + " \"" + path + "\" cannot be opened");
  std::stringstream s;
  s << in.rdbuf();
  if (in.bad()) return IoError(std::string("BPE ") + what + " \"" + path + "\": read failed");
  return s.str();
}

// Decodes one UTF-8 sequence at text[*at] (already validated) and advances past it.
char32_t NextCodePoint(std::string_view text, size_t* at) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[*at + k]); };
  const unsigned char c = b(0);
  char32_t cp;
  size_t n;
  if (c < 0x80)
    cp = c, n = 1;
  else if (c < 0xE0)
    cp = c & 0x1F, n = 2;
  else if (c < 0xF0)
    cp = c & 0x0F, n = 3;
  else
    cp = c & 0x07, n = 4;
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (b(k) & 0x3F);
  *at += n;
  return cp;
}

// The bytes a vocabulary string stands for. A string with a character outside GPT-2's
// byte alphabet (an added token such as "<pad> " written as plain text) stands for its
// own UTF-8 bytes: Encode never produces it, and Decode gives it back as written.
std::string StringBytes(const std::string& s, const std::unordered_map<char32_t, uint8_t>& to_byte) {
  std::string out;
  for (size_t at = 0; at < s.size();) {
    auto it = to_byte.find(NextCodePoint(s, &at));
    if (it == to_byte.end()) return s;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

Status ReadVocab(const std::string& path, BpeTables* t, std::unordered_map<std::string, int32_t>* ids) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "vocabulary"));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || j.empty())
    return InvalidArgumentError("BPE vocabulary \"" + path +
                                "\" is not a JSON object of token strings to ids (GPT-2's vocab.json)");
  std::unordered_map<char32_t, uint8_t> to_byte;
  const std::array<char32_t, 256> cps = ByteToCodePoint();
  for (int b = 0; b < 256; ++b) to_byte[cps[b]] = static_cast<uint8_t>(b);
  int64_t max_id = -1;
  for (auto& [token, id] : j.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
        id.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return InvalidArgumentError("BPE vocabulary \"" + path + "\": token \"" + token + "\" has id " +
                                  id.dump() + "; ids are integers in [0, 2^31)");
    if (FirstInvalidUtf8(token) != token.size())
      return InvalidArgumentError("BPE vocabulary \"" + path + "\": a token is not valid UTF-8");
    max_id = std::max(max_id, id.get<int64_t>());
    (*ids)[token] = static_cast<int32_t>(id.get<int64_t>());
  }
  t->id_bytes.assign(max_id + 1, {});
  t->id_present.assign(max_id + 1, 0);
  std::vector<const std::string*> holder(max_id + 1, nullptr);
  for (const auto& [token, id] : *ids) {
    if (holder[id])
      return InvalidArgumentError("BPE vocabulary \"" + path + "\": tokens \"" + *holder[id] + "\" and \"" +
                                  token + "\" have the same id " + std::to_string(id));
    holder[id] = &token;
    t->id_bytes[id] = StringBytes(token, to_byte);
    t->id_present[id] = 1;
  }
  for (int b = 0; b < 256; ++b) {
    std::string symbol;
    const char32_t cp = cps[b];  // at most U+0143: one or two UTF-8 bytes
    if (cp < 0x80)
      symbol.push_back(static_cast<char>(cp));
    else
      symbol += {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    auto it = ids->find(symbol);
    if (it == ids->end())
      return InvalidArgumentError("BPE vocabulary \"" + path + "\" has no token for byte " +
                                  std::to_string(b) + " (\"" + symbol +
                                  "\"): not a byte-level BPE vocabulary");
    t->byte_id[b] = it->second;
  }
  return OkStatus();
}

Status ReadMerges(const std::string& path, const std::unordered_map<std::string, int32_t>& ids,
                  BpeTables* t) {
  STRATA_ASSIGN_OR_RETURN(std::string text, ReadFile(path, "merges"));
  std::istringstream in(text);
  std::string line;
  std::unordered_map<uint64_t, int64_t> line_of;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const std::string where = "BPE merges \"" + path + "\" line " + std::to_string(n);
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || line.find(' ', space + 1) != std::string::npos)
      return InvalidArgumentError(where + ": \"" + line + "\" is not two tokens separated by one space");
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    int32_t part[3];
    const std::string* names[3] = {&left, &right, nullptr};
    const std::string joined = left + right;
    names[2] = &joined;
    for (int k = 0; k < 3; ++k) {
      auto it = ids.find(*names[k]);
      if (it == ids.end())
        return InvalidArgumentError(where + ": \"" + *names[k] + "\" is not in the vocabulary \"" +
                                    t->vocab_path + "\" (are the two files from the same tokenizer?)");
      part[k] = it->second;
    }
    const uint64_t key = BpeTables::PairKey(part[0], part[1]);
    if (auto seen = line_of.find(key); seen != line_of.end())
      return InvalidArgumentError(where + " repeats the merge of line " + std::to_string(seen->second) +
                                  " (\"" + line + "\")");
    line_of[key] = n;
    t->merges[key] = {static_cast<int32_t>(t->merges.size()), part[2]};
  }
  return OkStatus();
}

}  // namespace

std::array<char32_t, 256> ByteToCodePoint() {
  std::array<char32_t, 256> cp{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    cp[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return cp;
}

size_t FirstInvalidUtf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    char32_t cp, min;
    if (c >= 0xC2 && c <= 0xDF)
      len = 2, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF)
      len = 3, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4)
      len = 4, cp = c & 0x07, min = 0x10000;
    else
      return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return n;
}

Status LoadBpeTables(const std::string& vocab_path, const std::string& merges_path, BpeTables* t) {
  t->vocab_path = vocab_path;
  t->merges_path = merges_path;
  std::unordered_map<std::string, int32_t> ids;
  STRATA_RETURN_IF_ERROR(ReadVocab(vocab_path, t, &ids));
  return ReadMerges(merges_path, ids, t);
}

}  // namespace strata::model
