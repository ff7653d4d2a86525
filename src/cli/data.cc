// `strata data prepare` and `strata data info`: token files for language-model training
// (format and errors in include/strata/token_data.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/table.h"
#include "strata/token_data.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

struct PrepareOptions {
  std::vector<std::string> files;
  std::string out_dir;
  std::string bpe_dir;
  double validation = 0.05;
};

std::string Percent(int64_t part, int64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", whole > 0 ? 100.0 * static_cast<double>(part) / whole : 0.0);
  return buf;
}

void RunPrepare(const PrepareOptions& opts) {
  std::vector<std::string> files = opts.files;
  const bool default_corpus = files.empty();
  if (default_corpus) {
    Result<std::vector<std::string>> corpus = model::DefaultCorpusFiles();
    ThrowIfError(corpus.status());
    files = std::move(corpus).value();
  }
  std::optional<model::BpeTokenizer> bpe;
  if (!opts.bpe_dir.empty()) {
    Result<std::optional<model::BpeTokenizer>> found = model::LoadBpeIn(opts.bpe_dir);
    ThrowIfError(found.status().WithContext("--bpe"));
    if (!found->has_value())
      ThrowIfError(NotFoundError("--bpe " + opts.bpe_dir + ": the directory has neither " +
                                 model::kBpeVocabFile + " nor " + model::kBpeMergesFile +
                                 " (GPT-2's tokenizer files, as Hugging Face's gpt2 model ships them)"));
    bpe = std::move(*found);
  }
  Result<model::PrepareReport> r = model::PrepareTokens(files, opts.out_dir, opts.validation,
                                                        model::kMinValidationTokens, bpe ? &*bpe : nullptr);
  ThrowIfError(r.status());
  const std::string tokens = bpe ? "GPT-2 BPE tokens (vocab " + std::to_string(r->vocab) + ", " +
                                       std::to_string(bpe->merge_count()) + " merges, kept in " +
                                       opts.out_dir + "/" + model::kTokenizerDir + ")"
                                 : "byte-level tokens (vocab " + std::to_string(model::kByteVocab) + ")";
  std::printf("strata data prepare: %zu input file%s%s, %s (%lld bytes), %s\n", r->inputs.size(),
              r->inputs.size() == 1 ? "" : "s",
              default_corpus ? (std::string(" from ") + model::kDefaultCorpusDir).c_str() : "",
              FormatBytes(static_cast<uint64_t>(r->input_bytes)).c_str(),
              static_cast<long long>(r->input_bytes), tokens.c_str());
  const int64_t all = r->train.tokens + r->val.tokens;
  Table t({"split", "file", "tokens", "share"});
  t.AddRow({"train", r->train.path, std::to_string(r->train.tokens), Percent(r->train.tokens, all)});
  t.AddRow({"val", r->val.path, std::to_string(r->val.tokens), Percent(r->val.tokens, all)});
  std::printf("%s", t.Render().c_str());
  if (bpe)
    std::printf("%.2f bytes per token\n", static_cast<double>(r->input_bytes) / static_cast<double>(all));
}

void RunInfo(const std::string& path) {
  Result<model::TokenFile> f = model::TokenFile::Open(path);
  ThrowIfError(f.status());
  const int64_t bytes = model::kTokenHeaderBytes + f->size() * f->token_width();
  Table t({"field", "value"});
  t.AddRow({"file", f->path()});
  t.AddRow({"format", "strata token file, version " + std::to_string(model::kTokenFileVersion)});
  t.AddRow({"vocab", std::to_string(f->vocab())});
  Result<std::optional<model::BpeTokenizer>> bpe = model::LoadDataTokenizer(path, f->vocab());
  ThrowIfError(bpe.status());
  t.AddRow({"tokenizer", bpe->has_value()
                             ? "GPT-2 BPE, " + (*bpe)->vocab_path() + " and " + (*bpe)->merges_path()
                             : std::string("byte-level")});
  t.AddRow({"token width", std::to_string(f->token_width()) + " bytes"});
  t.AddRow({"tokens", std::to_string(f->size())});
  t.AddRow(
      {"file size", std::to_string(bytes) + " bytes (" + FormatBytes(static_cast<uint64_t>(bytes)) + ")"});
  std::printf("%s", t.Render().c_str());
}

}  // namespace

void AddDataCommand(CLI::App& app) {
  CLI::App* data = app.add_subcommand("data", "token files for language-model training");
  data->require_subcommand(1);

  auto prep = std::make_shared<PrepareOptions>();
  CLI::App* p = data->add_subcommand(
      "prepare",
      "tokenise text files (byte-level, vocab 256, or GPT-2 BPE with --bpe) into DIR/train.tokens and "
      "DIR/val.tokens");
  p->add_option("files", prep->files,
                "text files, concatenated in this order (default: the fortunes corpus in " +
                    std::string(model::kDefaultCorpusDir) + ")");
  p->add_option("--out", prep->out_dir, "output directory (created if missing)")->required();
  p->add_option("--bpe", prep->bpe_dir,
                "GPT-2 byte-level BPE: a directory with vocab.json and merges.txt (as Hugging Face's gpt2 "
                "ships them); copied to DIR/tokenizer for training's prompt and samples");
  p->add_option("--validation", prep->validation,
                "fraction of the stream (its tail) kept for validation; at least " +
                    std::to_string(model::kMinValidationTokens) + " tokens")
      ->capture_default_str();
  p->callback([prep] { RunPrepare(*prep); });

  auto info_path = std::make_shared<std::string>();
  CLI::App* i = data->add_subcommand("info", "validate a token file and print its header and token count");
  i->add_option("file", *info_path, "token file")->required();
  i->callback([info_path] { RunInfo(*info_path); });
}

}  // namespace strata::cli
