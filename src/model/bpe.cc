// BpeTokenizer's encoding and decoding (include/strata/bpe.h); the files are read by
// bpe_files.cc. PCRE2 is included here only.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <climits>
#include <filesystem>

#include "model/bpe_tables.h"

namespace strata::model {
namespace {

// GPT-2's pattern (encoder.py), as tokenizers' ByteLevel pre-tokenizer uses it.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Bounds an encoder's cache of merged pieces: a corpus has a few hundred thousand.
constexpr size_t kMaxCachedPieces = 1 << 20;
// Text longer than this is encoded in blocks of about kBlockBytes on oneTBB threads.
constexpr size_t kParallelBytes = 1 << 20, kBlockBytes = 256 << 10;

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

}  // namespace

// One thread's encoding state over shared tables: PCRE2 match data and the cache of
// pieces it has merged.
class BpeEncoder {
 public:
  explicit BpeEncoder(const BpeTables& t)
      : t_(t), md_(pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(t.pattern), nullptr)) {}
  ~BpeEncoder() { pcre2_match_data_free(md_); }
  BpeEncoder(const BpeEncoder&) = delete;
  BpeEncoder& operator=(const BpeEncoder&) = delete;

  // Appends the tokens of text[begin, end) to `out`. `text` is the whole (valid UTF-8)
  // text, so that the pattern's lookahead sees past `end`; no piece crosses `end` when
  // it is a cut of SafeCuts, or the text's end.
  Status EncodeRange(std::string_view text, size_t begin, size_t end, std::vector<int32_t>* out) {
    if (md_ == nullptr) return ResourceExhaustedError("BPE: PCRE2 could not allocate match data");
    const auto* code = static_cast<const pcre2_code*>(t_.pattern);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t at = begin;
    while (at < end) {
      const int rc = pcre2_match(code, subject, text.size(), at, PCRE2_NO_UTF_CHECK, md_, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof(msg));
        return InternalError("BPE: PCRE2 match failed at byte " + std::to_string(at) + ": " +
                             reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* span = pcre2_get_ovector_pointer(md_);
      const size_t from = std::min<size_t>(span[0], end), to = std::min<size_t>(span[1], end);
      // The pattern's alternatives cover every character, so matches are back to back;
      // were one skipped, its bytes would still be encoded, as a piece of their own.
      if (from > at) Append(text.substr(at, from - at), out);
      if (to > from) Append(text.substr(from, to - from), out);
      at = std::max(to, at + 1);
    }
    if (at < end) Append(text.substr(at, end - at), out);
    return OkStatus();
  }

 private:
  void Append(std::string_view piece, std::vector<int32_t>* out) {
    std::string key(piece);
    auto it = cache_.find(key);
    if (it == cache_.end()) {
      if (cache_.size() >= kMaxCachedPieces) cache_.clear();
      it = cache_.emplace(std::move(key), MergePiece(t_, piece)).first;
    }
    out->insert(out->end(), it->second.begin(), it->second.end());
  }

  const BpeTables& t_;
  pcre2_match_data* md_;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

namespace {

// Where `text` may be cut into blocks of about kBlockBytes: right after a newline that
// a printable non-space ASCII character follows. No piece of the pattern holds both: a
// letter, digit or symbol run takes at most a leading space (U+0020), and a whitespace
// run ends before a non-space character. Begins with 0, ends with text.size().
std::vector<size_t> SafeCuts(std::string_view text) {
  std::vector<size_t> cuts{0};
  size_t at = kBlockBytes;
  while (at < text.size()) {
    const size_t nl = text.find('\n', at);
    if (nl == std::string_view::npos || nl + 1 >= text.size()) break;
    const unsigned char next = static_cast<unsigned char>(text[nl + 1]);
    if (next > 0x20 && next < 0x7F) {
      cuts.push_back(nl + 1);
      at = nl + 1 + kBlockBytes;
    } else {
      at = nl + 1;
    }
  }
  cuts.push_back(text.size());
  return cuts;
}

}  // namespace

BpeTables::~BpeTables() { pcre2_code_free(static_cast<pcre2_code*>(pattern)); }

BpeTokenizer::BpeTokenizer(std::unique_ptr<BpeTables> t)
    : t_(std::move(t)), encoder_(std::make_unique<BpeEncoder>(*t_)) {}
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
  std::vector<int32_t> out;
  out.reserve(text.size() / 3);
  if (text.size() < kParallelBytes) {
    STRATA_RETURN_IF_ERROR(encoder_->EncodeRange(text, 0, text.size(), &out));
    return out;
  }
  const std::vector<size_t> cuts = SafeCuts(text);
  const size_t blocks = cuts.size() - 1;
  std::vector<std::vector<int32_t>> parts(blocks);
  std::vector<Status> status(blocks);
  tbb::enumerable_thread_specific<std::unique_ptr<BpeEncoder>> encoders;
  tbb::parallel_for(size_t{0}, blocks, [&](size_t b) {
    std::unique_ptr<BpeEncoder>& e = encoders.local();
    if (!e) e = std::make_unique<BpeEncoder>(*t_);
    status[b] = e->EncodeRange(text, cuts[b], cuts[b + 1], &parts[b]);
  });
  for (size_t b = 0; b < blocks; ++b) {
    STRATA_RETURN_IF_ERROR(status[b]);
    out.insert(out.end(), parts[b].begin(), parts[b].end());
  }
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
