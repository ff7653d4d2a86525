// GPT-2 byte-level BPE against Hugging Face tokenizers' golden data (tests/data/bpe,
// written by scripts/bpe_golden.py), and every refusal of bad files and bad input.
#include "strata/bpe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "strata/token_data.h"

namespace strata::model {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(STRATA_TEST_DATA_DIR) + "/bpe";

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

nlohmann::json Golden() { return nlohmann::json::parse(Slurp(kDir + "/golden.json")); }

BpeTokenizer Gold() {
  Result<BpeTokenizer> t = BpeTokenizer::Load(kDir + "/vocab.json", kDir + "/merges.txt");
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

uint64_t Fnv1a64(const std::vector<int32_t>& ids) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t id : ids) {
    for (int k = 0; k < 4; ++k) {
      h ^= (static_cast<uint32_t>(id) >> (8 * k)) & 0xff;
      h *= 0x100000001b3ull;
    }
  }
  return h;
}

TEST(Bpe, LoadsTheGoldenVocabulary) {
  BpeTokenizer t = Gold();
  EXPECT_EQ(t.vocab_size(), 2000);
  EXPECT_EQ(t.merge_count(), 2000 - 256);
}

// Each string exercises one part of the pattern; the ids are tokenizers' own.
TEST(Bpe, EncodesTheGoldenStringsAsTokenizersDoes) {
  BpeTokenizer t = Gold();
  const nlohmann::json g = Golden();
  ASSERT_GE(g["strings"].size(), 10u);
  for (const auto& c : g["strings"]) {
    const std::string text = c["text"].get<std::string>();
    Result<std::vector<int32_t>> ids = t.Encode(text);
    ASSERT_TRUE(ids.ok()) << ids.status().ToString();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << "text: \"" << text << "\"";
    Result<std::string> back = t.Decode(*ids);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, text);
  }
}

// The whole default corpus, 2.6 MB: count and hash of the ids tokenizers gave.
TEST(Bpe, EncodesTheWholeCorpusAsTokenizersDoes) {
  const nlohmann::json c = Golden()["corpus"];
  Result<std::vector<std::string>> files = DefaultCorpusFiles(c["dir"].get<std::string>());
  if (!files.ok()) GTEST_SKIP() << "no default corpus here: " << files.status().ToString();
  std::vector<std::string> names;
  std::string text;
  for (const std::string& f : *files) names.push_back(fs::path(f).filename()), text += Slurp(f);
  ASSERT_EQ(names, c["files"].get<std::vector<std::string>>())
      << "the fortunes package differs from the one the golden data was written from; run "
         "scripts/bpe_golden.py again";
  ASSERT_EQ(static_cast<int64_t>(text.size()), c["bytes"].get<int64_t>());
  BpeTokenizer t = Gold();
  Result<std::vector<int32_t>> ids = t.Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(static_cast<int64_t>(ids->size()), c["tokens"].get<int64_t>());
  char hash[17];
  std::snprintf(hash, sizeof(hash), "%016llx", static_cast<unsigned long long>(Fnv1a64(*ids)));
  EXPECT_EQ(std::string(hash), c["fnv1a64"].get<std::string>());
  Result<std::string> back = t.Decode(*ids);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(*back == text) << "decoding the corpus does not give it back";
}

// Random valid UTF-8 (ASCII, Latin-1, CJK, emoji, whitespace) decodes to itself.
TEST(Bpe, RandomTextRoundTrips) {
  BpeTokenizer t = Gold();
  std::mt19937 rng(7);
  const char* parts[] = {"a", "Z",  " ",  "  ",   "\n",     "\t", "'s",  "'ll",  "9",  "é",
                         "ß", "日", "本", "🙂", "\u00a0", "!",  "...", "\r\n", "x1", "Ω"};
  for (int round = 0; round < 200; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 60);
    for (int k = 0; k < n; ++k) text += parts[rng() % std::size(parts)];
    Result<std::vector<int32_t>> ids = t.Encode(text);
    ASSERT_TRUE(ids.ok());
    Result<std::string> back = t.Decode(*ids);
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, text);
  }
}

// A text over 1 MiB is encoded in blocks on several threads: a unit that starts with a
// letter and ends with a newline has whitespace runs before its newlines (where a
// cut in the wrong place would change the pieces), so its tokens repeated are the
// tokens of the repeated text only if the blocks join exactly.
TEST(Bpe, LongTextsEncodeInBlocksAsOnePass) {
  BpeTokenizer t = Gold();
  const std::string unit = "Hello   world,  it's 1984!  \n\n   naïve\t \n";
  Result<std::vector<int32_t>> one = t.Encode(unit);
  ASSERT_TRUE(one.ok());
  std::string text;
  std::vector<int32_t> want;
  while (text.size() < (3u << 20)) {
    text += unit;
    want.insert(want.end(), one->begin(), one->end());
  }
  Result<std::vector<int32_t>> all = t.Encode(text);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(*all == want) << "the blocks of a " << text.size() << "-byte text do not join as one pass";
}

TEST(Bpe, InvalidUtf8IsRefusedWithItsOffset) {
  BpeTokenizer t = Gold();
  for (const auto& [text, at] : std::vector<std::pair<std::string, int>>{{"abc\xff", 3},
                                                                         {"ok \xc3", 3},        // truncated
                                                                         {"\xc0\xaf", 0},       // overlong
                                                                         {"x\xed\xa0\x80", 1},  // surrogate
                                                                         {"ab\xf4\x90\x80\x80", 2}}) {
    Result<std::vector<int32_t>> ids = t.Encode(text);
    ASSERT_FALSE(ids.ok());
    EXPECT_NE(ids.status().message().find("not valid UTF-8 at byte " + std::to_string(at)), std::string::npos)
        << ids.status().ToString();
  }
}

TEST(Bpe, DecodeRefusesAnIdOutsideTheVocabulary) {
  BpeTokenizer t = Gold();
  Result<std::string> r = t.Decode({40, 2000});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("token 1 has id 2000"), std::string::npos) << r.status().ToString();
}

class BpeFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-bpe-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    Write("vocab.json", Slurp(kDir + "/vocab.json"));
    Write("merges.txt", Slurp(kDir + "/merges.txt"));
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  // The error Load gives, or "" when it loads.
  std::string LoadError() {
    Result<BpeTokenizer> t = BpeTokenizer::Load(Path("vocab.json"), Path("merges.txt"));
    return t.ok() ? "" : t.status().ToString();
  }
  fs::path dir_;
};

#define EXPECT_SAYS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << (msg)

TEST_F(BpeFiles, CopiesLoad) { EXPECT_EQ(LoadError(), ""); }

TEST_F(BpeFiles, MissingFilesAreNamed) {
  fs::remove(dir_ / "merges.txt");
  EXPECT_SAYS(LoadError(), "BPE merges \"" + Path("merges.txt") + "\" does not exist");
  fs::remove(dir_ / "vocab.json");
  EXPECT_SAYS(LoadError(), "BPE vocabulary \"" + Path("vocab.json") + "\" does not exist");
}

TEST_F(BpeFiles, BadVocabulariesAreRefused) {
  Write("vocab.json", "[1, 2]");
  EXPECT_SAYS(LoadError(), "is not a JSON object of token strings to ids");
  Write("vocab.json", "{\"a\": ");
  EXPECT_SAYS(LoadError(), "is not a JSON object");
  nlohmann::json v = nlohmann::json::parse(Slurp(kDir + "/vocab.json"));
  v["!"] = -3;
  Write("vocab.json", v.dump());
  EXPECT_SAYS(LoadError(), "token \"!\" has id -3; ids are integers in [0, 2^31)");
  v = nlohmann::json::parse(Slurp(kDir + "/vocab.json"));
  v["\"\xc4\xa0"] = 5;  // a new token with the id of "&"
  Write("vocab.json", v.dump());
  EXPECT_SAYS(LoadError(), "have the same id 5");
  v = nlohmann::json::parse(Slurp(kDir + "/vocab.json"));
  v.erase("\xc4\x80");  // byte 0's symbol, U+0100
  Write("vocab.json", v.dump());
  EXPECT_SAYS(LoadError(), "has no token for byte 0");
}

TEST_F(BpeFiles, BadMergesAreRefusedByLine) {
  const std::string good = Slurp(kDir + "/merges.txt");
  Write("merges.txt", "#version: 0.2\n\xc4\xa0 t\nh  e\n");
  EXPECT_SAYS(LoadError(), "line 3: \"h  e\" is not two tokens separated by one space");
  Write("merges.txt", "#version: 0.2\n\xc4\xa0 t\nq\xc4\xa0 zzzz\n");
  EXPECT_SAYS(LoadError(), "line 3: \"q\xc4\xa0\" is not in the vocabulary");
  Write("merges.txt", good + "\xc4\xa0 t\n");
  EXPECT_SAYS(LoadError(), "repeats the merge of line 2");
}

TEST_F(BpeFiles, LoadBpeInFindsBothOrNeither) {
  Result<std::optional<BpeTokenizer>> both = LoadBpeIn(dir_.string());
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  ASSERT_TRUE(both->has_value());
  EXPECT_EQ((*both)->vocab_size(), 2000);
  fs::remove(dir_ / "merges.txt");
  Result<std::optional<BpeTokenizer>> one = LoadBpeIn(dir_.string());
  ASSERT_FALSE(one.ok());
  EXPECT_SAYS(one.status().ToString(), "but not " + Path("merges.txt"));
  fs::remove(dir_ / "vocab.json");
  Result<std::optional<BpeTokenizer>> none = LoadBpeIn(dir_.string());
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

}  // namespace
}  // namespace strata::model
