// `strata data prepare` and `strata data info`: token files for language-model training
// (format and errors in include/strata/token_data.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
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
  Result<model::PrepareReport> r = model::PrepareTokens(files, opts.out_dir, opts.validation);
  ThrowIfError(r.status());
  std::printf("strata data prepare: %zu input file%s%s, %s (%lld bytes), byte-level tokens (vocab %lld)\n",
              r->inputs.size(), r->inputs.size() == 1 ? "" : "s",
              default_corpus ? (std::string(" from ") + model::kDefaultCorpusDir).c_str() : "",
              FormatBytes(static_cast<uint64_t>(r->input_bytes)).c_str(),
              static_cast<long long>(r->input_bytes), static_cast<long long>(model::kByteVocab));
  Table t({"split", "file", "tokens", "share"});
  t.AddRow(
      {"train", r->train.path, std::to_string(r->train.tokens), Percent(r->train.tokens, r->input_bytes)});
  t.AddRow({"val", r->val.path, std::to_string(r->val.tokens), Percent(r->val.tokens, r->input_bytes)});
  std::printf("%s", t.Render().c_str());
}

void RunInfo(const std::string& path) {
  Result<model::TokenFile> f = model::TokenFile::Open(path);
  ThrowIfError(f.status());
  const int64_t bytes = model::kTokenHeaderBytes + f->size() * f->token_width();
  Table t({"field", "value"});
  t.AddRow({"file", f->path()});
  t.AddRow({"format", "strata token file, version " + std::to_string(model::kTokenFileVersion)});
  t.AddRow({"vocab", std::to_string(f->vocab())});
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
      "prepare", "tokenise text files (byte-level, vocab 256) into DIR/train.tokens and DIR/val.tokens");
  p->add_option("files", prep->files,
                "text files, concatenated in this order (default: the fortunes corpus in " +
                    std::string(model::kDefaultCorpusDir) + ")");
  p->add_option("--out", prep->out_dir, "output directory (created if missing)")->required();
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
