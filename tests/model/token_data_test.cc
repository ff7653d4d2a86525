// Token files: prepare -> open round trip, the validation split, every bad-file error
// (each must name the path and the problem), the batch numbering across world sizes,
// determinism, and the default corpus when it is installed.
#include "strata/token_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace strata::model {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

class TokenData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-token-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  // A token file written byte by byte: header, then `tokens` of the header's width.
  std::string WriteTokens(const std::string& name, const TokenFileHeader& h,
                          const std::vector<uint32_t>& tokens) {
    std::string bytes = EncodeTokenHeader(h);
    for (uint32_t t : tokens) bytes.append(reinterpret_cast<const char*>(&t), h.token_width);
    return Write(name, bytes);
  }
  // A valid byte-level file of `n` tokens 0, 1, ..., n - 1 (mod 256).
  std::string Sequential(const std::string& name, int64_t n) {
    TokenFileHeader h;
    h.count = static_cast<uint64_t>(n);
    std::vector<uint32_t> t(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint32_t>(i % 256);
    return WriteTokens(name, h, t);
  }
  // Opening `path` fails with `code` and a message naming the path and containing `what`.
  void ExpectOpenError(const std::string& path, StatusCode code, const std::string& what) {
    Result<TokenFile> f = TokenFile::Open(path);
    ASSERT_FALSE(f.ok()) << path;
    EXPECT_EQ(f.status().code(), code) << f.status().ToString();
    EXPECT_THAT(f.status().message(), AllOf(HasSubstr(path), HasSubstr(what)));
  }

  fs::path dir_;
};

std::string AllBytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 7 + i / 256) % 256);
  return s;
}

TEST_F(TokenData, RoundTripConcatenatesInputsAndSplitsTheTail) {
  const std::string a = AllBytes(3000), b("hello, world\n\xff\x00 tail", 20);  // a NUL byte too
  const std::string fa = Write("a.txt", a), fb = Write("b.txt", b);
  const std::string text = a + b;
  Result<PrepareReport> r = PrepareTokens({fa, fb}, (dir_ / "out").string(), 0.1, 100);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // 10% of 3020 = 302 tokens of validation (more than the minimum of 100).
  EXPECT_EQ(r->input_bytes, 3020);
  EXPECT_EQ(r->val.tokens, 302);
  EXPECT_EQ(r->train.tokens, 3020 - 302);
  Result<TokenFile> train = TokenFile::Open(r->train.path), val = TokenFile::Open(r->val.path);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  ASSERT_TRUE(val.ok()) << val.status().ToString();
  EXPECT_EQ(train->vocab(), 256);
  EXPECT_EQ(train->token_width(), 2u);
  ASSERT_EQ(train->size() + val->size(), 3020);
  std::string back;
  for (const TokenFile* f : {&*train, &*val})
    for (int64_t i = 0; i < f->size(); ++i) back += static_cast<char>(f->token(i));
  EXPECT_EQ(back, text);
  std::vector<int32_t> w(5);
  val->Window(val->size() - 5, 5, w.data());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(w[i], static_cast<uint8_t>(text[text.size() - 5 + i]));
  EXPECT_EQ(fs::file_size(r->train.path), static_cast<uintmax_t>(64 + 2 * train->size()));
  // Only the two outputs: no temporaries left behind.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_ / "out"), fs::directory_iterator()), 2);
}

TEST_F(TokenData, ValidationSplitIsAtLeastTheMinimum) {
  const std::string f = Write("a.txt", AllBytes(5000));
  Result<PrepareReport> r = PrepareTokens({f}, (dir_ / "out").string());  // 5%, at least 1025
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->val.tokens, kMinValidationTokens);
  EXPECT_EQ(r->train.tokens, 5000 - kMinValidationTokens);
  r = PrepareTokens({f}, (dir_ / "out").string(), 0.0, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->val.tokens, 10);
  r = PrepareTokens({f}, (dir_ / "out").string(), 0.5, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->val.tokens, 2500);
}

TEST_F(TokenData, PrepareRefusesBadInputsNamingThem) {
  const std::string good = Write("good.txt", AllBytes(5000)), out = (dir_ / "out").string();
  const std::string missing = (dir_ / "missing.txt").string();
  Result<PrepareReport> r = PrepareTokens({good, missing}, out);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(missing), HasSubstr("does not exist")));
  const std::string empty = Write("empty.txt", "");
  r = PrepareTokens({good, empty}, out);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(empty), HasSubstr("is empty")));
  r = PrepareTokens({dir_.string()}, out);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(dir_.string()), HasSubstr("directory")));
  const std::string small = Write("small.txt", "too short");
  r = PrepareTokens({small}, out);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(small), HasSubstr("holds 9 tokens")));
  r = PrepareTokens({good}, out, 1.0);
  EXPECT_THAT(r.status().message(), HasSubstr("outside [0, 1)"));
  // Root ignores permission bits, so the unusable out_dir is one under a regular file.
  const std::string under_file = good + "/out";
  r = PrepareTokens({good}, under_file);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(under_file), HasSubstr("cannot be created")));
  EXPECT_FALSE(fs::exists(out));  // nothing written by any refused call
}

TEST_F(TokenData, OpenRefusesEveryBadFileNamingPathAndProblem) {
  ExpectOpenError((dir_ / "nope.tokens").string(), StatusCode::kNotFound, "does not exist");
  ExpectOpenError(Write("short.tokens", "STRTOKN"), StatusCode::kCorruption,
                  "truncated: file is 7 bytes, shorter than the 64-byte header");
  std::string bad_magic = EncodeTokenHeader({});
  bad_magic[0] = 'X';
  ExpectOpenError(Write("magic.tokens", bad_magic), StatusCode::kInvalidArgument,
                  "not a strata token file: magic is 0x58");
  TokenFileHeader h;
  h.version = 7;
  ExpectOpenError(WriteTokens("version.tokens", h, {}), StatusCode::kInvalidArgument,
                  "format version 7, this build reads version 1");
  h = {};
  h.count = 4;
  ExpectOpenError(WriteTokens("vocab.tokens", h, {1, 2, 300, 999}), StatusCode::kCorruption,
                  "token 2 is 300, outside the vocabulary of 256");
  h.count = 100;  // the header promises more than the file holds
  ExpectOpenError(WriteTokens("count.tokens", h, {1, 2, 3}), StatusCode::kCorruption,
                  "truncated: file is 70 bytes, the header's count of 100 tokens needs at least 264");
  h.count = 2;
  ExpectOpenError(WriteTokens("trailing.tokens", h, {1, 2, 3}), StatusCode::kCorruption,
                  "trailing bytes: file is 70 bytes");
  const std::string ok = Sequential("ok.tokens", 10);
  std::string damaged;
  {
    std::ifstream in(ok, std::ios::binary);
    damaged.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  damaged[20] ^= 1;  // vocab 256 -> 257 without a new checksum
  ExpectOpenError(Write("damaged.tokens", damaged), StatusCode::kCorruption, "header checksum mismatch");
  h = {};
  h.token_width = 3;
  ExpectOpenError(WriteTokens("width.tokens", h, {}), StatusCode::kInvalidArgument, "token width 3 bytes");
  h = {};
  h.vocab = 70000;  // needs width 4
  ExpectOpenError(WriteTokens("wide.tokens", h, {}), StatusCode::kInvalidArgument,
                  "vocab size 70000 does not fit a token width of 2");
}

TEST_F(TokenData, WideTokensUpToTheVocabAreRead) {
  TokenFileHeader h;
  h.vocab = 70000;
  h.token_width = TokenWidthForVocab(h.vocab);
  h.count = 3;
  Result<TokenFile> f = TokenFile::Open(WriteTokens("wide.tokens", h, {0, 65536, 69999}));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->token_width(), 4u);
  EXPECT_EQ(f->token(1), 65536);
  EXPECT_EQ(f->token(2), 69999);
}

// Every sample of a rank's micro-batches, in the order a single rank would see them.
std::vector<int32_t> Samples(const TokenFile& f, uint64_t seed, int world, int64_t micro, int accumulation,
                             int64_t step, int64_t seq, std::vector<int32_t>* targets) {
  const int64_t global = world * micro * accumulation;
  std::vector<int32_t> tokens(static_cast<size_t>(global * seq));
  targets->assign(tokens.size(), -1);
  for (int m = 0; m < accumulation; ++m) {
    for (int r = 0; r < world; ++r) {
      BatchSlice s{step, r, world, m, accumulation, micro};
      const int64_t offset = (s.FirstSampleIndex() - step * global) * seq;
      FillBatch(f, seed, s, seq, tokens.data() + offset, targets->data() + offset);
    }
  }
  return tokens;
}

TEST_F(TokenData, BatchesNumberSamplesAsTheMlpDataDoes) {
  Result<TokenFile> f = TokenFile::Open(Sequential("seq.tokens", 5000));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const int64_t seq = 16;
  for (int64_t step : {0, 3}) {
    std::vector<int32_t> t1, t2;
    const std::vector<int32_t> one = Samples(*f, 42, 1, 8, 2, step, seq, &t1);
    const std::vector<int32_t> two = Samples(*f, 42, 2, 4, 2, step, seq, &t2);
    EXPECT_EQ(one, two) << "step " << step;
    EXPECT_EQ(t1, t2) << "step " << step;
    for (size_t s = 0; s < one.size() / seq; ++s) {
      // Sequential tokens: each window is p, p + 1, ... (mod 256) and the targets lead by one.
      for (int64_t i = 0; i < seq; ++i) {
        EXPECT_EQ(t1[s * seq + i], (one[s * seq] + i + 1) % 256);
        if (i + 1 < seq) {
          EXPECT_EQ(t1[s * seq + i], one[s * seq + i + 1]);
        }
      }
    }
  }
}

TEST_F(TokenData, BatchesAreDeterministicAndCoverTheFile) {
  Result<TokenFile> f = TokenFile::Open(Sequential("seq.tokens", 300));
  ASSERT_TRUE(f.ok());
  std::vector<int32_t> ta, tb;
  EXPECT_EQ(Samples(*f, 7, 1, 32, 1, 5, 8, &ta), Samples(*f, 7, 1, 32, 1, 5, 8, &tb));
  EXPECT_EQ(ta, tb);
  EXPECT_NE(Samples(*f, 7, 1, 32, 1, 5, 8, &ta), Samples(*f, 8, 1, 32, 1, 5, 8, &tb));
  // Starts stay in [0, size - seq - 1] and reach both ends of it.
  int64_t lo = 1 << 30, hi = -1;
  for (int64_t s = 0; s < 20000; ++s) {
    const int64_t p = SampleStart(3, s, f->size(), 8);
    lo = std::min(lo, p);
    hi = std::max(hi, p);
  }
  EXPECT_EQ(lo, 0);
  EXPECT_EQ(hi, f->size() - 8 - 1);
}

TEST_F(TokenData, DefaultCorpusPreparesOverAMegabyte) {
  Result<std::vector<std::string>> files = DefaultCorpusFiles();
  if (!files.ok()) {
    GTEST_SKIP() << files.status().ToString();
  }
  for (const std::string& f : *files) {
    EXPECT_FALSE(f.ends_with(".dat") || f.ends_with(".u8")) << f;
  }
  EXPECT_TRUE(std::is_sorted(files->begin(), files->end()));
  Result<PrepareReport> r = PrepareTokens(*files, (dir_ / "out").string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->input_bytes, 1 << 20);
  Result<TokenFile> train = TokenFile::Open(r->train.path);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  EXPECT_GT(train->size(), 1 << 20);
}

TEST_F(TokenData, DefaultCorpusMissingTellsToRunSetup) {
  Result<std::vector<std::string>> files = DefaultCorpusFiles((dir_ / "none").string());
  EXPECT_EQ(files.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(files.status().message(), HasSubstr("scripts/setup.sh"));
  Write("x.dat", "index");
  files = DefaultCorpusFiles(dir_.string());
  EXPECT_THAT(files.status().message(), HasSubstr("holds no text files"));
}

// BPE preparation: each file's tokens as Encode gives them, the tokenizer kept beside
// them, and a vocabulary past 65536 ids written 4 bytes a token (a vocabulary of the
// 256 byte symbols and the merge "a b" -> "ab" at id 70000).
TEST_F(TokenData, BpePreparationWritesEachFilesTokensAndKeepsTheTokenizer) {
  std::string vocab = "{";
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? b : next++;
    std::string u8 =
        cp < 0x80 ? std::string(1, static_cast<char>(cp))
                  : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    if (u8 == "\"" || u8 == "\\") u8 = "\\" + u8;
    vocab += "\"" + u8 + "\": " + std::to_string(b) + ",";
  }
  vocab += "\"ab\": 70000}";
  const std::string v = Write("vocab.json", vocab), m = Write("merges.txt", "#version: 0.2\na b\n");
  Result<BpeTokenizer> bpe = BpeTokenizer::Load(v, m);
  ASSERT_TRUE(bpe.ok()) << bpe.status().ToString();
  ASSERT_EQ(bpe->vocab_size(), 70001);
  const std::string one = Write("one.txt", std::string(1500, 'x') + "ab"),
                    two = Write("two.txt", "abab cab\n");
  const std::string out = (dir_ / "out").string();
  Result<PrepareReport> r = PrepareTokens({one, two}, out, 0.0, 4, &*bpe);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<int32_t> want = *bpe->Encode(std::string(1500, 'x') + "ab");
  const std::vector<int32_t> second = *bpe->Encode("abab cab\n");
  want.insert(want.end(), second.begin(), second.end());
  ASSERT_EQ(want[1500], 70000);
  Result<TokenFile> train = TokenFile::Open(r->train.path), val = TokenFile::Open(r->val.path);
  ASSERT_TRUE(train.ok() && val.ok());
  EXPECT_EQ(train->token_width(), 4u);
  EXPECT_EQ(train->vocab(), 70001);
  std::vector<int32_t> got(static_cast<size_t>(train->size() + val->size()));
  train->Window(0, train->size(), got.data());
  val->Window(0, val->size(), got.data() + train->size());
  EXPECT_EQ(got, want);
  Result<std::optional<BpeTokenizer>> kept = LoadDataTokenizer(r->train.path, train->vocab());
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  ASSERT_TRUE(kept->has_value());
  EXPECT_EQ((*kept)->vocab_path(), out + "/tokenizer/vocab.json");
  // Byte-level tokens in the same directory take the tokenizer away.
  ASSERT_TRUE(PrepareTokens({one, two}, out, 0.0, 4).ok());
  Result<std::optional<BpeTokenizer>> gone = LoadDataTokenizer(r->train.path, 256);
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value());
  EXPECT_FALSE(fs::exists(out + "/tokenizer"));
}

}  // namespace
}  // namespace strata::model
