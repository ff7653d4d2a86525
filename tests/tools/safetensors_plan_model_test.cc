// `strata plan --model-file`'s model: a safetensors header becomes the declaration the
// same model declared by hand is, so its plan's memory is the same to the byte; its
// compute is 6 flops per parameter per token at the rates' compute rate; its
// activations are reported as not counted; every broken file is refused by name.
#include "tools/safetensors_plan_model.h"

#include <gmock/gmock.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "strata/device.h"
#include "strata/model.h"
#include "tools/engine_calibration.h"
#include "tools/mirror_world.h"
#include "tools/plan_test_model.h"
#include "tools/planner.h"
#include "zero/safetensors_writer.h"

namespace strata::tools {
namespace {

using ::testing::HasSubstr;
using testing::HeaderTensor;
namespace fs = std::filesystem;

class SafetensorsPlanModelTest : public ::testing::Test {
 protected:
  SafetensorsPlanModelTest()
      : dir_(fs::temp_directory_path() / ("strata-st-plan-" + std::to_string(getpid()))) {
    fs::create_directories(dir_);
  }
  ~SafetensorsPlanModelTest() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// A small GPT-2-like checkpoint's tensors in the order its file stores them (not the
// names' order), three dtypes and a scalar.
std::vector<HeaderTensor> GptLike() {
  return {{"wte.weight", "F32", {64, 32}},
          {"wpe.weight", "F32", {16, 32}},
          {"h.0.ln_1.weight", "F32", {32}},
          {"h.0.ln_1.bias", "F32", {32}},
          {"h.0.attn.c_attn.weight", "BF16", {32, 96}},
          {"h.0.attn.c_attn.bias", "BF16", {96}},
          {"h.0.mlp.c_fc.weight", "F16", {32, 128}},
          {"h.0.mlp.c_fc.bias", "F16", {128}},
          {"ln_f.weight", "F32", {32}},
          {"ln_f.bias", "F32", {32}},
          {"logit_scale", "F32", {}}};
}

// The same model declared directly.
ModelDecl GptLikeByHand() {
  ModelDecl d;
  for (const HeaderTensor& t : GptLike())
    d.tensors.push_back({t.name, t.shape.empty() ? std::vector<int64_t>{1} : t.shape, std::nullopt});
  d.modules = {{"wte", {0}},
               {"wpe", {1}},
               {"h.0.ln_1", {2, 3}},
               {"h.0.attn.c_attn", {4, 5}},
               {"h.0.mlp.c_fc", {6, 7}},
               {"ln_f", {8, 9}},
               {"logit_scale", {10}}};
  return d;
}

Config MakeConfig(int stage, const std::string& opt, const std::string& param, const std::string& swap) {
  nlohmann::json j = {{"zero_optimization", {{"stage", stage}}},
                      {"strata", {{"device", "sim"}, {"chunk_size", "16KiB"}, {"swap_paths", {swap}}}}};
  if (opt != "none") j["zero_optimization"]["offload_optimizer"] = {{"device", opt}, {"nvme_path", swap}};
  if (param != "none") j["zero_optimization"]["offload_param"] = {{"device", param}, {"nvme_path", swap}};
  Result<Config> c = ParseConfig(j);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? *c : Config{};
}

Result<EngineLayoutInfo> Plan(const Config& c, const ModelDecl& decl, int world_size) {
  STRATA_ASSIGN_OR_RETURN(auto world, CreateMirrorWorld(world_size));
  DeviceOptions d;
  d.kind = DeviceKind::kSim;
  STRATA_ASSIGN_OR_RETURN(auto device, CreateDevice(d));
  return Engine::Plan(c, decl, EngineResources{world.get(), device.get()});
}

void ExpectSameDecl(const ModelDecl& a, const ModelDecl& b) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    EXPECT_EQ(a.tensors[i].name, b.tensors[i].name) << i;
    EXPECT_EQ(a.tensors[i].shape, b.tensors[i].shape) << a.tensors[i].name;
    EXPECT_FALSE(a.tensors[i].dtype.has_value()) << "the config's dtype, not the file's";
  }
  ASSERT_EQ(a.modules.size(), b.modules.size());
  for (size_t m = 0; m < a.modules.size(); ++m) {
    EXPECT_EQ(a.modules[m].name, b.modules[m].name) << m;
    EXPECT_EQ(a.modules[m].tensors, b.modules[m].tensors) << a.modules[m].name;
  }
}

// Every tier's need and its named parts, at one rank and at four.
void ExpectSamePlans(const ModelDecl& file, const ModelDecl& by_hand, const std::string& swap) {
  struct Combo {
    int stage;
    const char *opt, *param;
  };
  for (Combo k : {Combo{0, "none", "none"}, Combo{2, "cpu", "none"}, Combo{3, "cpu", "cpu"},
                  Combo{3, "nvme", "nvme"}}) {
    for (int world : {1, 4}) {
      const Config c = MakeConfig(k.stage, k.opt, k.param, swap);
      Result<EngineLayoutInfo> a = Plan(c, file, world), b = Plan(c, by_hand, world);
      ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString() << " / " << b.status().ToString();
      const std::string what = std::to_string(k.stage) + k.opt + k.param + " x" + std::to_string(world);
      EXPECT_EQ(a->num_params, b->num_params) << what;
      EXPECT_EQ(a->num_chunks, b->num_chunks) << what;
      EXPECT_EQ(a->device_need, b->device_need) << what;
      EXPECT_EQ(a->host_need, b->host_need) << what;
      EXPECT_EQ(a->nvme_need, b->nvme_need) << what;
      ASSERT_EQ(a->need_parts.size(), b->need_parts.size()) << what;
      for (size_t i = 0; i < a->need_parts.size(); ++i) {
        EXPECT_EQ(a->need_parts[i].tier, b->need_parts[i].tier) << what;
        EXPECT_EQ(a->need_parts[i].bytes, b->need_parts[i].bytes) << what << " " << a->need_parts[i].what;
      }
    }
  }
}

TEST_F(SafetensorsPlanModelTest, AHeaderPlansAsTheModelDeclaredByHand) {
  testing::WriteSafetensors(Path("gpt.safetensors"), GptLike());
  Result<PlanModel> m = SafetensorsPlanModel(Path("gpt.safetensors"), 16);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameDecl(m->decl, GptLikeByHand());
  int64_t params = 0;
  for (const TensorDecl& t : GptLikeByHand().tensors) params += t.numel();
  EXPECT_EQ(m->params, params);
  EXPECT_THAT(m->description, HasSubstr("11 tensors in 7 modules, BF16/F16/F32"));
  ExpectSamePlans(m->decl, GptLikeByHand(), Path("swap"));
}

// The reference MLP's own declaration (model::MlpModules), written as a header: the
// plan's memory is the MLP's.
TEST_F(SafetensorsPlanModelTest, TheReferenceMlpsHeaderPlansAsTheMlp) {
  const ModelDecl mlp = model::MlpModules(testing::PlanTestModel());
  std::vector<HeaderTensor> tensors;
  for (const ModuleDecl& mod : mlp.modules) {
    for (TensorId t : mod.tensors) tensors.push_back({mlp.tensors[t].name, "F32", mlp.tensors[t].shape});
  }
  testing::WriteSafetensors(Path("mlp.safetensors"), tensors);
  Result<PlanModel> m = SafetensorsPlanModel(Path("mlp.safetensors"), 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ExpectSameDecl(m->decl, mlp);
  ExpectSamePlans(m->decl, mlp, Path("swap"));
}

// GPT-2's vocabulary beside four blocks of width 64: the token embedding is an outlier
// (zero/layout.h) and takes a run of chunks of the blocks' size, with buffers of its own
// that the plan names, instead of making every chunk 12.9 MB.
TEST_F(SafetensorsPlanModelTest, ALargeVocabularyPlansARunOfChunks) {
  std::vector<HeaderTensor> tensors = {{"wte.weight", "F32", {50257, 64}}, {"wpe.weight", "F32", {128, 64}}};
  for (int b = 0; b < 4; ++b) {
    const std::string h = "h." + std::to_string(b) + ".";
    for (const HeaderTensor& t : std::vector<HeaderTensor>{{h + "ln_1.weight", "F32", {64}},
                                                           {h + "ln_1.bias", "F32", {64}},
                                                           {h + "attn.c_attn.weight", "F32", {64, 192}},
                                                           {h + "attn.c_attn.bias", "F32", {192}},
                                                           {h + "mlp.c_fc.weight", "F32", {64, 256}},
                                                           {h + "mlp.c_fc.bias", "F32", {256}}})
      tensors.push_back(t);
  }
  testing::WriteSafetensors(Path("vocab.safetensors"), tensors);
  Result<PlanModel> m = SafetensorsPlanModel(Path("vocab.safetensors"), 16);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  Result<EngineLayoutInfo> l = Plan(MakeConfig(3, "nvme", "nvme", Path("swap")), m->decl, 1);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  // The chunk: 16 KiB asked for, raised to the largest block module (c_fc: 16,640
  // values) and rounded to 2,048s: 18,432. The embedding's 3,216,448 values take 175.
  EXPECT_EQ(l->chunk_elems, 18432);
  EXPECT_EQ(l->run_chunks, 175);
  bool named = false;
  for (const EngineNeedPart& p : l->need_parts) {
    if (p.what.find("tensors larger than a chunk") == std::string::npos) continue;
    named = true;
    EXPECT_EQ(p.tier, "device") << p.what;
  }
  EXPECT_TRUE(named) << "the runs' own buffers are a named device need";
}

TEST_F(SafetensorsPlanModelTest, ModulesFollowTheDataOffsetsNotTheKeys) {
  // Stored b, then a: the JSON's keys are sorted (a first), the modules are not.
  testing::WriteSafetensors(Path("order.safetensors"),
                            {{"b.weight", "F32", {4, 4}}, {"a.weight", "F32", {4}}, {"b.bias", "F32", {4}}});
  Result<PlanModel> m = SafetensorsPlanModel(Path("order.safetensors"), 1);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(m->decl.modules.size(), 2u);
  EXPECT_EQ(m->decl.modules[0].name, "b");
  EXPECT_EQ(m->decl.modules[0].tensors, (std::vector<TensorId>{0, 2}));
  EXPECT_EQ(m->decl.modules[1].name, "a");
  EXPECT_EQ(m->decl.tensors[1].name, "a.weight");
}

TEST_F(SafetensorsPlanModelTest, ComputeIsSixFlopsAParameterATokenAndActivationsAreNotCounted) {
  testing::WriteSafetensors(Path("gpt.safetensors"), GptLike());
  Result<PlanModel> m = SafetensorsPlanModel(Path("gpt.safetensors"), 16);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->flops_per_sample, 6.0 * m->params * 16);
  EXPECT_FALSE(m->activations_counted);
  EXPECT_THAT(m->compute_basis, HasSubstr("estimated, not measured: 6 flops per parameter per token"));
  PlanRequest r;
  r.base = MakeConfig(0, "none", "none", Path("swap"));
  r.base.gradient_accumulation_steps = 2;
  r.model = *m;
  r.micro_batch = 3;
  r.rates.adam_params_per_s = 2e9;
  r.rates.copy_bytes_per_s = 10e9;
  r.rates.compute_flops_per_s = 1e9;
  Result<std::vector<PlanCandidate>> all = PlanConfigurations(r);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_TRUE(all->front().fits);
  const PlanCandidate& c = all->front();
  EXPECT_DOUBLE_EQ(c.work.compute_s, 6.0 * m->params * 16 * 3 * 2 / 1e9);
  EXPECT_EQ(c.process.activations, 0u);
  EXPECT_FALSE(c.process.activations_counted);
  EXPECT_TRUE(ToJson(c)["memory"]["process"]["activations"].is_null()) << "not counted, not zero";
}

// --measure calibrates on a stand-in MLP at the header's width, one row per token.
TEST_F(SafetensorsPlanModelTest, TheCalibrationTimesAStandIn) {
  testing::WriteSafetensors(Path("gpt.safetensors"), GptLike());
  Result<PlanModel> m = SafetensorsPlanModel(Path("gpt.safetensors"), 4);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_THAT(m->compute_basis, HasSubstr("stand-in MLP of width 64"));
  LaneRates rates;
  Status s = CalibrateEngine(MakeConfig(0, "none", "none", Path("swap")), *m, 2, &rates, 1);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_GT(rates.compute_flops_per_s, 0);
  EXPECT_GT(rates.host_optimizer.optimizer_params_per_s, 0);
}

// The header alone is read: a file that says it holds 1 GiB of data, all of it a hole.
TEST_F(SafetensorsPlanModelTest, ReadsTheHeaderOnly) {
  testing::WriteSafetensors(Path("big.safetensors"), {{"w.weight", "F32", {16384, 16384}}}, /*sparse=*/true);
  ASSERT_EQ(fs::file_size(Path("big.safetensors")) >> 30, 1u);
  Result<PlanModel> m = SafetensorsPlanModel(Path("big.safetensors"), 8);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->params, 16384ll * 16384);
}

// Each broken file is refused with its path and what is wrong.
TEST_F(SafetensorsPlanModelTest, BrokenFilesAreRefusedByName) {
  struct Case {
    const char* name;
    std::string header;  // empty: fewer than 8 bytes
    uint64_t data;
    StatusCode code;
    const char* says;
  };
  uint64_t n = 0;
  const std::string good = testing::SafetensorsHeaderText({{"a.weight", "F32", {2, 2}}}, &n);
  auto entry = [](const std::string& dtype, const std::string& shape, int begin, int end) {
    return "{\"t.w\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape + ", \"data_offsets\": [" +
           std::to_string(begin) + ", " + std::to_string(end) + "]}}";
  };
  const std::vector<Case> cases = {
      {"invalid", "{\"a\": [1, 2", 0, StatusCode::kCorruption, "its header is not JSON"},
      {"array", "[1, 2]", 0, StatusCode::kCorruption, "its header is not a JSON object"},
      {"dtype", entry("I64", "[2]", 0, 16), 16, StatusCode::kInvalidArgument,
       "tensor \"t.w\" has dtype I64; a plan reads F32, BF16 and F16 tensors only"},
      {"negative", entry("F32", "[2, -1]", 0, 0), 0, StatusCode::kCorruption, "negative dimension"},
      {"zero", entry("F32", "[0, 4]", 0, 0), 0, StatusCode::kInvalidArgument,
       "has shape [0, 4], no elements"},
      {"shape", entry("F32", "\"big\"", 0, 4), 4, StatusCode::kCorruption, "no valid dtype, shape"},
      {"size", entry("F32", "[2, 2]", 0, 12), 12, StatusCode::kCorruption,
       "holds 12 bytes, its F32 [2, 2] needs 16"},
      {"range", entry("F32", "[2, 2]", 8, 24), 16, StatusCode::kCorruption,
       "lies outside the data (16 bytes)"},
      {"overlap",
       "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"b\": {\"dtype\": \"F32\", "
       "\"shape\": [2], \"data_offsets\": [4, 12]}}",
       12, StatusCode::kCorruption, "the data of tensors \"a\" [0, 8) and \"b\" [4, 12) overlap"},
      {"empty", "{\"__metadata__\": {\"format\": \"pt\"}}", 0, StatusCode::kInvalidArgument,
       "the header declares no tensors"},
  };
  for (const Case& c : cases) {
    const std::string path = Path(std::string(c.name) + ".safetensors");
    testing::WriteRawSafetensors(path, c.header, c.data);
    Result<PlanModel> m = SafetensorsPlanModel(path, 8);
    ASSERT_FALSE(m.ok()) << c.name;
    EXPECT_EQ(m.status().code(), c.code) << c.name << ": " << m.status().ToString();
    EXPECT_THAT(m.status().message(), HasSubstr(path)) << c.name;
    EXPECT_THAT(m.status().message(), HasSubstr(c.says)) << c.name;
  }
  // A missing file; one shorter than its length; a length past the end of the file.
  Result<PlanModel> missing = SafetensorsPlanModel(Path("nothing.safetensors"), 8);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("nothing.safetensors") + ": No such file"));
  std::ofstream(Path("short.safetensors")) << "abc";
  Result<PlanModel> short_file = SafetensorsPlanModel(Path("short.safetensors"), 8);
  EXPECT_EQ(short_file.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(
      short_file.status().message(),
      HasSubstr(Path("short.safetensors") + ": not a safetensors file: it has 3 bytes, shorter than"));
  testing::WriteRawSafetensors(Path("cut.safetensors"), good, n);
  fs::resize_file(Path("cut.safetensors"), 8 + good.size() / 2);
  Result<PlanModel> cut = SafetensorsPlanModel(Path("cut.safetensors"), 8);
  EXPECT_EQ(cut.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(cut.status().message(),
              HasSubstr("its header length (" + std::to_string(good.size()) + " bytes) runs past the end"));
  EXPECT_THAT(cut.status().message(), HasSubstr(Path("cut.safetensors")));
  Result<PlanModel> no_seq = SafetensorsPlanModel(Path("nothing.safetensors"), 0);
  EXPECT_EQ(no_seq.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::tools
