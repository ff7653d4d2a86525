// BpeTokenizer's encoding and decoding (include/strata/bpe.h); the files are read by
// bpe_files.cc. PCRE2 is included here only.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <climits>
#include <filesystem>

#include "model/bpe_tables.h"

namespace strata::model {
namespace {

// GPT-2's pattern (encoder.py), as tokenizers' ByteLevel pre-tokenizer uses it.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Bounds the cache of merged pieces: a corpus has a few hundred thousand distinct ones.
constexpr size_t kMaxCachedPieces = 1 << 20;

Status CompilePattern(BpeTables* t) {
  int err = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof(msg));
    return InternalError("BPE: PCRE2 cannot compile GPT-2's pattern at offset " + std::to_string(at) + ": " +
                         reinterpret_cast<const char*>(msg));
  }
  // JIT is a speed-up only: where the platform has none, matching interprets.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  t->pattern = code;
  t->match_data = pcre2_match_data_create_from_pattern(code, nullptr);
  if (t->match_data == nullptr) return ResourceExhaustedError("BPE: PCRE2 could not allocate match data");
  return OkStatus();
}

// Merges one piece's byte tokens: the pair of lowest rank first, every occurrence of it
// left to right, until no adjacent pair has a merge (GPT-2's encoder.py bpe()).
std::vector<int32_t> MergePiece(const BpeTables& t, std::string_view piece) {
  std::vector<int32_t> w;
  w.reserve(piece.size());
  for (unsigned char c : piece) w.push_back(t.byte_id[c]);
  std::vector<int32_t> next;
  while (w.size() > 1) {
    int32_t best = INT32_MAX, result = 0;
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = t.merges.find(BpeTables::PairKey(w[i], w[i + 1]));
      if (it != t.merges.end() && it->second.rank < best) {
        best = it->second.rank;
        result = it->second.result;
        best_key = it->first;
      }
    }
    if (best == INT32_MAX) break;
    next.clear();
    for (size_t i = 0; i < w.size(); ++i) {
      if (i + 1 < w.size() && BpeTables::PairKey(w[i], w[i + 1]) == best_key) {
        next.push_back(result);
        ++i;
      } else {
        next.push_back(w[i]);
      }
    }
    w.swap(next);
  }
  return w;
}

void AppendPiece(BpeTables& t, std::string_view piece, std::vector<int32_t>* out) {
  std::string key(piece);
  auto it = t.cache.find(key);
  if (it == t.cache.end()) {
    if (t.cache.size() >= kMaxCachedPieces) t.cache.clear();
    it = t.cache.emplace(std::move(key), MergePiece(t, piece)).first;
  }
  out->insert(out->end(), it->second.begin(), it->second.end());
}

}  // namespace

BpeTables::~BpeTables() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data));
  pcre2_code_free(static_cast<pcre2_code*>(pattern));
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<BpeTables> t) : t_(std::move(t)) {}
BpeTokenizer::BpeTokenizer(BpeTokenizer&&) noexcept = default;
BpeTokenizer& BpeTokenizer::operator=(BpeTokenizer&&) noexcept = default;
BpeTokenizer::~BpeTokenizer() = default;

Result<BpeTokenizer> BpeTokenizer::Load(const std::string& vocab_path, const std::string& merges_path) {
  auto t = std::make_unique<BpeTables>();
  STRATA_RETURN_IF_ERROR(LoadBpeTables(vocab_path, merges_path, t.get()));
  STRATA_RETURN_IF_ERROR(CompilePattern(t.get()));
  return BpeTokenizer(std::move(t));
}

Result<std::vector<int32_t>> BpeTokenizer::Encode(std::string_view text) {
  if (const size_t bad = FirstInvalidUtf8(text); bad != text.size())
    return InvalidArgumentError(
        "BPE: the text is not valid UTF-8 at byte " + std::to_string(bad) +
        " (GPT-2's tokenizer reads UTF-8; convert it, e.g. iconv -f latin1 -t utf-8)");
  auto* code = static_cast<pcre2_code*>(t_->pattern);
  auto* md = static_cast<pcre2_match_data*>(t_->match_data);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) {
      if (rc == PCRE2_ERROR_NOMATCH) break;
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof(msg));
      return InternalError("BPE: PCRE2 match failed at byte " + std::to_string(at) + ": " +
                           reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(md);
    // The pattern's alternatives cover every character, so matches are back to back;
    // were one skipped, its bytes would still be encoded, as a piece of their own.
    if (span[0] > at) AppendPiece(*t_, text.substr(at, span[0] - at), &out);
    AppendPiece(*t_, text.substr(span[0], span[1] - span[0]), &out);
    at = span[1];
  }
  if (at < text.size()) AppendPiece(*t_, text.substr(at), &out);
  return out;
}

Result<std::string> BpeTokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size() || !t_->id_present[id])
      return InvalidArgumentError("BPE: token " + std::to_string(i) + " has id " + std::to_string(id) +
                                  ", which the vocabulary \"" + t_->vocab_path + "\" does not hold");
    out += t_->id_bytes[id];
  }
  return out;
}

int64_t BpeTokenizer::vocab_size() const { return static_cast<int64_t>(t_->id_bytes.size()); }
int64_t BpeTokenizer::merge_count() const { return static_cast<int64_t>(t_->merges.size()); }
const std::string& BpeTokenizer::vocab_path() const { return t_->vocab_path; }
const std::string& BpeTokenizer::merges_path() const { return t_->merges_path; }

Result<std::optional<BpeTokenizer>> LoadBpeIn(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string vocab = (fs::path(dir) / kBpeVocabFile).string();
  const std::string merges = (fs::path(dir) / kBpeMergesFile).string();
  std::error_code ec;
  const bool has_vocab = fs::exists(vocab, ec), has_merges = fs::exists(merges, ec);
  if (!has_vocab && !has_merges) return std::optional<BpeTokenizer>();
  if (has_vocab != has_merges)
    return InvalidArgumentError("data directory \"" + dir + "\" has " + (has_vocab ? vocab : merges) +
                                " but not " + (has_vocab ? merges : vocab) +
                                ": a BPE tokenizer needs both (prepare the data again with "
                                "`strata data prepare --bpe DIR`)");
  STRATA_ASSIGN_OR_RETURN(BpeTokenizer t, BpeTokenizer::Load(vocab, merges));
  return std::optional<BpeTokenizer>(std::move(t));
}

}  // namespace strata::model
