// `strata ckpt info DIR`, `strata ckpt verify DIR` and `strata ckpt export DIR --out F`:
// what a checkpoint holds (its manifest, summarised), whether every file still matches
// its checksums, and its weights as a safetensors file (include/strata/checkpoint.h has
// the format).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/table.h"
#include "strata/checkpoint.h"
#include "strata/units.h"

namespace strata::cli {
namespace {

struct InfoOptions {
  std::string dir;
  bool json = false;
};

nlohmann::json InfoJson(const std::string& dir, const CheckpointInfo& i) {
  nlohmann::json files = nlohmann::json::array();
  uint64_t total = 0;
  for (const CheckpointFileInfo& f : i.files) {
    files.push_back({{"path", f.path}, {"rank", f.rank}, {"kind", f.kind}, {"bytes", f.bytes}});
    total += f.bytes;
  }
  return {{"dir", dir},
          {"version", i.version},
          {"world_size", i.world_size},
          {"stage", i.stage},
          {"compute_dtype", i.compute_dtype},
          {"offload_optimizer", i.offload_optimizer},
          {"offload_param", i.offload_param},
          {"num_params", i.num_params},
          {"num_tensors", i.num_tensors},
          {"num_chunks", i.num_chunks},
          {"chunk_elems", i.chunk_elems},
          {"step_calls", i.step_calls},
          {"optimizer_steps", i.optimizer_steps},
          {"loss_scale", i.loss_scale},
          {"lr", i.lr},
          {"bytes", total},
          {"files", files},
          {"meta", nlohmann::json::parse(i.meta_json)}};
}

void RunInfo(const InfoOptions& o) {
  Result<CheckpointInfo> info = ReadCheckpointInfo(o.dir);
  ThrowIfError(info.status());
  const CheckpointInfo& i = *info;
  if (o.json) {
    std::printf("%s\n", InfoJson(o.dir, i).dump(2).c_str());
    return;
  }
  uint64_t total = 0;
  for (const CheckpointFileInfo& f : i.files) total += f.bytes;
  Table t({"field", "value"});
  t.AddRow({"checkpoint", o.dir});
  t.AddRow({"format", "strata checkpoint, version " + std::to_string(i.version)});
  t.AddRow({"saved by", std::to_string(i.world_size) + " rank(s), ZeRO stage " + std::to_string(i.stage) +
                            ", " + i.compute_dtype + " compute"});
  t.AddRow(
      {"saved from", "optimizer state on " + i.offload_optimizer + ", parameters on " + i.offload_param});
  t.AddRow({"model", std::to_string(i.num_params) + " parameters in " + std::to_string(i.num_tensors) +
                         " tensors, " + std::to_string(i.num_chunks) + " chunks of " +
                         std::to_string(i.chunk_elems) + " elements"});
  t.AddRow({"steps", std::to_string(i.step_calls) + " (" + std::to_string(i.optimizer_steps) +
                         " optimizer steps taken)"});
  char scalars[64];
  std::snprintf(scalars, sizeof scalars, "lr %g, loss scale %g", i.lr, i.loss_scale);
  t.AddRow({"optimizer", scalars});
  t.AddRow({"files", std::to_string(i.files.size()) + " state files, " + FormatBytes(total)});
  t.AddRow({"meta", i.meta_json});
  std::printf("%s", t.Render().c_str());
}

void RunVerify(const std::string& dir) {
  Status st = VerifyCheckpoint(dir, [](const std::string& line) { std::printf("%s\n", line.c_str()); });
  ThrowIfError(st);
  std::printf("%s: every file matches the manifest\n", dir.c_str());
}

struct ExportOptions {
  std::string dir, out;
  std::string dtype = "fp32";
};

void RunExport(const ExportOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  Result<CheckpointInfo> info = ReadCheckpointInfo(o.dir);
  ThrowIfError(info.status());
  const DType dtype = o.dtype == "bf16" ? DType::kBf16 : o.dtype == "fp16" ? DType::kFp16 : DType::kF32;
  Status st = ExportSafetensors(o.dir, o.out, dtype,
                                [](const std::string& line) { std::printf("%s\n", line.c_str()); });
  ThrowIfError(st);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(o.out, ec);
  std::printf("%s: %lld tensors, %s (%s), in %.2f s\n", o.out.c_str(),
              static_cast<long long>(info->num_tensors), ec ? "?" : FormatBytes(bytes).c_str(),
              o.dtype.c_str(), seconds);
}

}  // namespace

void AddCkptCommand(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand(
      "ckpt", "training checkpoints: what they hold, whether they are intact, their weights exported");
  ckpt->require_subcommand(1);

  auto info = std::make_shared<InfoOptions>();
  CLI::App* i = ckpt->add_subcommand("info", "summarise a checkpoint's manifest (reads no state file)");
  i->add_option("dir", info->dir, "the checkpoint directory")->required();
  i->add_flag("--json", info->json, "print the summary as JSON");
  i->callback([info] { RunInfo(*info); });

  auto dir = std::make_shared<std::string>();
  CLI::App* v = ckpt->add_subcommand(
      "verify",
      "read every state file and check its size and checksums (per chunk and whole) against the manifest");
  v->add_option("dir", *dir, "the checkpoint directory")->required();
  v->callback([dir] { RunVerify(*dir); });

  auto exp = std::make_shared<ExportOptions>();
  CLI::App* e = ckpt->add_subcommand(
      "export",
      "write the checkpoint's weights (its fp32 master) to a safetensors file, streamed through a fixed "
      "buffer; every chunk's checksum is checked on the way, and a corrupt checkpoint writes nothing");
  e->add_option("dir", exp->dir, "the checkpoint directory")->required();
  e->add_option("--out", exp->out, "the safetensors file to write (replaced atomically)")->required();
  e->add_option("--dtype", exp->dtype, "fp32 (the master's bits), bf16 or fp16 (rounded to nearest even)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  e->callback([exp] { RunExport(*exp); });
}

}  // namespace strata::cli
