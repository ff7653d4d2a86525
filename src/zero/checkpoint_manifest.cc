// The checkpoint manifest as JSON: written by rank 0 as the last file of a save, read by
// every rank on load, by `strata ckpt` and by the directory helpers.
#include "zero/checkpoint_manifest.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "strata/checksum.h"

namespace strata::ckpt {
namespace {

using nlohmann::json;

json FileJson(const CheckpointFileInfo& f) {
  json chunks = json::array();
  for (uint64_t c : f.chunk_xxh3) chunks.push_back(ChecksumHex(c));
  return {{"path", f.path},
          {"rank", f.rank},
          {"kind", f.kind},
          {"bytes", f.bytes},
          {"xxh3", ChecksumHex(f.xxh3)},
          {"chunk_xxh3", chunks}};
}

uint64_t HexField(const json& j, const char* key) {
  uint64_t v = 0;
  if (!ParseChecksumHex(j.at(key).get<std::string>(), &v)) {
    throw std::runtime_error(std::string("\"") + key + "\" is not 16 hex digits");
  }
  return v;
}

CheckpointFileInfo ParseFile(const json& j) {
  CheckpointFileInfo f;
  f.path = j.at("path").get<std::string>();
  f.rank = j.at("rank").get<int>();
  f.kind = j.at("kind").get<std::string>();
  f.bytes = j.at("bytes").get<uint64_t>();
  f.xxh3 = HexField(j, "xxh3");
  for (const json& c : j.at("chunk_xxh3")) {
    uint64_t v = 0;
    if (!ParseChecksumHex(c.get<std::string>(), &v))
      throw std::runtime_error("a chunk_xxh3 entry is not hex");
    f.chunk_xxh3.push_back(v);
  }
  return f;
}

// The parts a loader relies on, checked against each other: a manifest that passes
// cannot send the loader out of its files' bounds.
Status CheckConsistent(const Manifest& m, const std::string& where) {
  const CheckpointInfo& i = m.info;
  auto bad = [&](const std::string& what) { return CorruptionError(where + ": " + what); };
  if (i.world_size < 1 || i.stage < 0 || i.stage > 3 || i.num_chunks < 1 || i.chunk_elems < 1 ||
      i.shard_elems < 1 || i.chunk_bytes % 4096 != 0 ||
      i.chunk_bytes < static_cast<uint64_t>(i.shard_elems) * 4)
    return bad("world_size, stage or layout sizes out of range");
  if (i.state_ranks != (i.stage == 0 ? 1 : i.world_size)) return bad("state_ranks does not fit the stage");
  for (size_t t = 0; t < m.tensors.size(); ++t) {
    const TensorEntry& e = m.tensors[t];
    // A tensor larger than a chunk runs on into the chunks after its first.
    if (e.chunk < 0 || e.chunk >= i.num_chunks || e.offset < 0 || e.offset >= i.chunk_elems || e.numel < 0 ||
        e.chunk * i.chunk_elems + e.offset + e.numel > i.num_chunks * i.chunk_elems)
      return bad("tensor \"" + e.name + "\" lies outside the layout");
  }
  for (int r = 0; r < i.state_ranks; ++r) {
    for (int k = 0; k < kStateKinds; ++k) {
      const CheckpointFileInfo* f = FindFile(i, r, k);
      if (f == nullptr)
        return bad("no " + std::string(kKindNames[k]) + " file for rank " + std::to_string(r));
      if (f->bytes != i.chunk_bytes * i.num_chunks ||
          f->chunk_xxh3.size() != static_cast<size_t>(i.num_chunks))
        return bad(f->path + ": size or chunk count does not fit the layout");
    }
  }
  return OkStatus();
}

Manifest FromJson(const json& j) {
  Manifest m;
  CheckpointInfo& i = m.info;
  i.version = j.at("version").get<int>();
  i.world_size = j.at("world_size").get<int>();
  i.stage = j.at("stage").get<int>();
  i.state_ranks = j.at("state_ranks").get<int>();
  i.compute_dtype = j.at("compute_dtype").get<std::string>();
  i.offload_optimizer = j.at("offload_optimizer").get<std::string>();
  i.offload_param = j.at("offload_param").get<std::string>();
  const json& l = j.at("layout");
  i.num_params = l.at("num_params").get<int64_t>();
  i.num_chunks = l.at("num_chunks").get<int>();
  i.chunk_elems = l.at("chunk_elems").get<int64_t>();
  i.shard_elems = l.at("shard_elems").get<int64_t>();
  i.chunk_bytes = l.at("chunk_bytes").get<uint64_t>();
  for (const json& t : l.at("tensors")) {
    m.tensors.push_back({t.at("name").get<std::string>(), t.at("shape").get<std::vector<int64_t>>(),
                         t.at("chunk").get<int>(), t.at("offset").get<int64_t>(),
                         t.at("numel").get<int64_t>()});
  }
  i.num_tensors = static_cast<int64_t>(m.tensors.size());
  const json& s = j.at("state");
  i.step_calls = s.at("step_calls").get<int64_t>();
  i.optimizer_steps = s.at("optimizer_steps").get<int64_t>();
  i.lr = s.at("lr").get<double>();
  const json& sc = s.at("loss_scaler");
  m.scaler = {sc.at("scale").get<double>(), sc.at("iter").get<int64_t>(),
              sc.at("last_overflow_iter").get<int64_t>(), sc.at("hysteresis").get<int>()};
  m.scaler_dynamic = sc.at("dynamic").get<bool>();
  i.loss_scale = m.scaler.scale;
  for (const json& u : s.at("call_order")) m.call_order.emplace_back(u.at(0).get<int>(), u.at(1).get<int>());
  for (const json& f : j.at("files")) i.files.push_back(ParseFile(f));
  m.config_json = j.at("config").dump();
  i.meta_json = j.at("meta").dump();
  return m;
}

}  // namespace

std::string StateFileName(int kind, int rank) {
  char name[64];
  std::snprintf(name, sizeof name, "%s-r%05d.bin", kKindNames[kind], rank);
  return name;
}

std::string ManifestJson(const Manifest& m) {
  const CheckpointInfo& i = m.info;
  json tensors = json::array();
  for (const TensorEntry& t : m.tensors) {
    tensors.push_back(
        {{"name", t.name}, {"shape", t.shape}, {"chunk", t.chunk}, {"offset", t.offset}, {"numel", t.numel}});
  }
  json order = json::array();
  for (const auto& [kind, module] : m.call_order) order.push_back({kind, module});
  json files = json::array();
  for (const CheckpointFileInfo& f : i.files) files.push_back(FileJson(f));
  json j = {
      {"format", kFormat},
      {"version", kFormatVersion},
      {"world_size", i.world_size},
      {"stage", i.stage},
      {"state_ranks", i.state_ranks},
      {"compute_dtype", i.compute_dtype},
      {"offload_optimizer", i.offload_optimizer},
      {"offload_param", i.offload_param},
      {"layout",
       {{"num_params", i.num_params},
        {"num_chunks", i.num_chunks},
        {"chunk_elems", i.chunk_elems},
        {"shard_elems", i.shard_elems},
        {"chunk_bytes", i.chunk_bytes},
        {"tensors", tensors}}},
      {"state",
       {{"step_calls", i.step_calls},
        {"optimizer_steps", i.optimizer_steps},
        {"lr", i.lr},
        {"loss_scaler",
         {{"dynamic", m.scaler_dynamic},
          {"scale", m.scaler.scale},
          {"iter", m.scaler.iter},
          {"last_overflow_iter", m.scaler.last_overflow_iter},
          {"hysteresis", m.scaler.hysteresis}}},
        {"call_order", order}}},
      {"files", files},
      {"config", json::parse(m.config_json)},
      {"meta", json::parse(i.meta_json)},
  };
  return j.dump(1) + "\n";
}

Result<Manifest> ParseManifest(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    return CorruptionError(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) {
    return InvalidArgumentError(where + ": not a strata checkpoint manifest (no \"format\": \"" + kFormat +
                                "\")");
  }
  if (!j.contains("version") || !j["version"].is_number_integer()) {
    return CorruptionError(where + ": no integer \"version\"");
  }
  if (j["version"].get<int>() != kFormatVersion) {
    return InvalidArgumentError(where + ": checkpoint format version " +
                                std::to_string(j["version"].get<int>()) + "; this build reads version " +
                                std::to_string(kFormatVersion));
  }
  Manifest m;
  try {
    m = FromJson(j);
  } catch (const std::exception& e) {
    return CorruptionError(where + ": a field is missing or has the wrong type (" + e.what() + ")");
  }
  STRATA_RETURN_IF_ERROR(CheckConsistent(m, where));
  return m;
}

Result<Manifest> ReadManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestName;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError("checkpoint " + dir + ": no " + kManifestName +
                         " (not a checkpoint, or one whose save never completed: a save writes its manifest "
                         "last and renames the directory into place only then)");
  }
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError("reading " + path);
  return ParseManifest(text.str(), path);
}

const CheckpointFileInfo* FindFile(const CheckpointInfo& info, int rank, int kind) {
  for (const CheckpointFileInfo& f : info.files) {
    if (f.rank == rank && f.kind == kKindNames[kind]) return &f;
  }
  return nullptr;
}

Status CheckChunkChecksum(const std::string& path, const CheckpointFileInfo& rec, int chunk,
                          uint64_t chunk_bytes, uint64_t sum) {
  if (sum == rec.chunk_xxh3[chunk]) return OkStatus();
  return CorruptionError("checkpoint file " + path + ": chunk " + std::to_string(chunk) + " (bytes " +
                         std::to_string(chunk * chunk_bytes) + " to " +
                         std::to_string((chunk + 1) * chunk_bytes) + ") has checksum " + ChecksumHex(sum) +
                         ", the manifest says " + ChecksumHex(rec.chunk_xxh3[chunk]) +
                         ": the file is corrupt (strata ckpt verify lists every bad chunk)");
}

Status CheckJson(const std::string& text, const std::string& what) {
  try {
    const json parsed = json::parse(text);
  } catch (const json::parse_error& e) {
    return InvalidArgumentError(what + " is not valid JSON (" + e.what() + ")");
  }
  return OkStatus();
}

}  // namespace strata::ckpt

namespace strata {

Result<CheckpointInfo> ReadCheckpointInfo(const std::string& dir) {
  STRATA_ASSIGN_OR_RETURN(ckpt::Manifest m, ckpt::ReadManifest(dir));
  return m.info;
}

}  // namespace strata
