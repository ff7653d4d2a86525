// The bodies of the export tests, run at world size 1 (checkpoint_export_test) and under
// mpirun -np 2 and -np 4 (checkpoint_export_mpi_test): a chain model whose last module
// reads the first one's weight (a tied weight: one tensor) trained two steps and saved;
// its export, read back strictly (safetensors_reader.h), holds every tensor once, equal
// to Engine::GatherMaster bit for bit (fp32) or to half.h's rounding of it (bf16, fp16).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint_checks.h"
#include "safetensors_reader.h"

namespace strata::testing {

struct ExportSubject {
  std::string dir;
  ModelDecl model;
  std::vector<std::vector<float>> masters;  // by tensor id, as saved
};

// Trains the tied chain two steps with `combo`, saves into CheckpointRoot(name)/ckpt and
// gathers every master (collective).
// With `runs`, the chain of ChainWithRuns instead: two tensors of three chunks each.
inline ExportSubject SaveForExport(Communicator& world, const std::string& name, const Combo& combo,
                                   bool runs = false) {
  ModelDecl model = PlainChain(4);
  AddSharedLinear(&model, /*weight=*/0, /*bias=*/-1);
  if (runs) model = ChainWithRuns(world.size());
  const ChainProgram program = Sequential(runs ? 12 : 5);
  const ResumeSubject subject = ChainSubject(world, ChainSetup{model, Always(program)});
  ExportSubject s{CheckpointRoot(name) + "/ckpt", model, {}};
  const Config config = MakeConfig(combo, runs ? kRunChunks : "");
  auto box = subject.make(config, /*other_init=*/false);
  EXPECT_TRUE(box.ok()) << box.status().ToString();
  if (!box.ok()) return s;
  std::vector<double> losses;
  Status st = subject.train(*box->engine, config, 0, 2, &losses);
  if (st.ok()) st = box->engine->SaveCheckpoint(s.dir, CheckpointMeta{.json = R"({"next_step": 2})"});
  EXPECT_TRUE(st.ok()) << st.ToString();
  auto masters = Masters(*box->engine, subject.tensors);
  EXPECT_TRUE(masters.ok()) << masters.status().ToString();
  if (masters.ok()) s.masters = std::move(*masters);
  return s;
}

inline const char* SafetensorsName(DType d) {
  return d == DType::kF32 ? "F32" : d == DType::kBf16 ? "BF16" : "F16";
}

// Exports `s` to `out` as `dtype` and compares every tensor with its master.
inline void CheckExport(const ExportSubject& s, DType dtype, const std::string& out) {
  SCOPED_TRACE(std::string(DTypeName(dtype)) + " export of " + s.dir);
  std::vector<std::string> lines;
  Status st = ExportSafetensors(s.dir, out, dtype, [&](const std::string& l) { lines.push_back(l); });
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  EXPECT_FALSE(lines.empty());
  auto file = ReadSafetensors(out);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  ASSERT_EQ(s.masters.size(), s.model.tensors.size());
  EXPECT_EQ(file->tensors.size(), s.model.tensors.size()) << "every tensor once, the tied weight too";
  for (size_t t = 0; t < s.model.tensors.size(); ++t) {
    const TensorDecl& decl = s.model.tensors[t];
    auto it = file->tensors.find(decl.name);
    ASSERT_NE(it, file->tensors.end()) << decl.name;
    EXPECT_EQ(it->second.dtype, SafetensorsName(dtype)) << decl.name;
    EXPECT_EQ(it->second.shape, decl.shape) << decl.name;
    EXPECT_EQ(it->second.bytes,
              dtype == DType::kF32 ? Bytes(s.masters[t]) : Expected16(s.masters[t], dtype == DType::kBf16))
        << decl.name;
  }
  EXPECT_EQ(file->metadata.value("format", ""), "pt");
  EXPECT_EQ(file->metadata.value("source", ""), s.dir);
  EXPECT_EQ(file->metadata.value("step_calls", ""), "2");
  EXPECT_EQ(file->metadata.value("meta", ""), R"({"next_step":2})");
}

}  // namespace strata::testing
