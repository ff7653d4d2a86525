#include "strata/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/json_reader.h"

namespace strata {
namespace {

// Parses `text`, expects InvalidArgument whose message contains every fragment.
void ExpectError(const std::string& text, std::initializer_list<std::string> fragments) {
  auto r = ParseConfigText(text);
  ASSERT_FALSE(r.ok()) << "accepted: " << text;
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  for (const auto& f : fragments) {
    EXPECT_NE(r.status().message().find(f), std::string::npos)
        << "message \"" << r.status().message() << "\" lacks \"" << f << "\"";
  }
}

TEST(Config, ZeroSubGroupSizeIsRefusedByName) {
  ExpectError(R"({"zero_optimization": {"sub_group_size": 0}})",
              {"zero_optimization.sub_group_size", "at least 1"});
}

TEST(Config, DefaultsFromEmptyObject) {
  auto c = ParseConfigText("{}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->zero.stage, 0);
  EXPECT_EQ(c->zero.offload_optimizer.device, OffloadDevice::kNone);
  EXPECT_EQ(c->aio.block_size, 1u << 20);
  EXPECT_EQ(c->aio.queue_depth, 32);
  EXPECT_EQ(c->strata.chunk_size, 64u << 20);
  EXPECT_EQ(c->optimizer.type, OptimizerType::kAdamW);
  EXPECT_TRUE(c->strata.checksum);
  EXPECT_TRUE(c->strata.overlap);
  EXPECT_EQ(c->strata.gradients, "auto");
}

// Parameter counts take DeepSpeed's numbers, decimal suffixes, and binary sizes (read
// as that many parameters, as when these keys were parsed as bytes).
TEST(Config, ParameterCountsTakeNumbersSuffixesAndSizes) {
  auto c = ParseConfigText(R"({"zero_optimization": {"stage3_max_live_parameters": 1e9,
      "stage3_max_reuse_distance": "100M", "stage3_prefetch_bucket_size": "64MiB"}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->zero.stage3_max_live_parameters, 1'000'000'000u);
  EXPECT_EQ(c->zero.stage3_max_reuse_distance, 100'000'000u);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 64u << 20);
}

TEST(Config, DeepSpeedInfinityConfigMeansTheSame) {
  const char* text = R"({
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "zero_optimization": {
      "stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "pin_memory": true,
                            "buffer_count": 4, "pipeline_read": false, "pipeline_write": true},
      "offload_param": {"device": "nvme", "nvme_path": ["/nvme0", "/nvme1"], "buffer_count": 5,
                        "buffer_size": 1e8},
      "overlap_comm": true, "contiguous_gradients": true,
      "reduce_bucket_size": 5e8, "stage3_prefetch_bucket_size": "64MiB",
      "stage3_max_live_parameters": 1e9, "stage3_param_persistence_threshold": 1e6,
      "sub_group_size": 1e9
    },
    "aio": {"block_size": 1048576, "queue_depth": 8, "intra_op_parallelism": 1,
            "single_submit": false, "overlap_events": true},
    "strata": {"device": "sim", "device_budget": "2GiB", "host_budget": "4GiB", "chunk_size": "16MiB",
               "io_backend": "psync", "trace_file": "trace.json"}
  })";
  auto c = ParseConfigText(text);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->zero.stage, 3);
  EXPECT_EQ(c->zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_EQ(c->zero.offload_optimizer.nvme_path, std::vector<std::string>{"/local_nvme"});
  EXPECT_FALSE(c->zero.offload_optimizer.pipeline_read);
  EXPECT_EQ(c->zero.offload_param.nvme_path.size(), 2u);
  EXPECT_EQ(c->zero.offload_param.buffer_size, 100'000'000u);
  EXPECT_EQ(c->zero.stage3_prefetch_bucket_size, 64u << 20);
  EXPECT_EQ(c->zero.reduce_bucket_size, 500'000'000u);
  EXPECT_EQ(c->aio.queue_depth, 8);
  EXPECT_TRUE(c->bf16);
  EXPECT_DOUBLE_EQ(c->optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c->gradient_clipping, 1.0);
  EXPECT_EQ(c->gradient_accumulation_steps, 2);
  EXPECT_EQ(c->strata.device, DeviceKind::kSim);
  EXPECT_EQ(c->strata.device_budget, 2ull << 30);
  EXPECT_EQ(c->strata.chunk_size, 16u << 20);
  EXPECT_EQ(c->strata.io_backend, IoBackendKind::kPsync);
}

TEST(Config, UnknownKeysNameTheirPath) {
  ExpectError(R"({"zero_optimisation": {}})", {"zero_optimisation", "unknown key"});
  ExpectError(R"({"zero_optimization": {"stagee": 2}})", {"zero_optimization.stagee", "unknown key"});
  ExpectError(R"({"zero_optimization": {"offload_optimizer": {"devic": "cpu"}}})",
              {"zero_optimization.offload_optimizer.devic"});
  ExpectError(R"({"strata": {"budget": 1}})", {"strata.budget"});
  ExpectError(R"({"optimizer": {"params": {"learning_rate": 1}}})", {"optimizer.params.learning_rate"});
}

TEST(Config, NearMissKeysGetASuggestion) {
  ExpectError(R"({"zero_optimisation": {}})", {"did you mean \"zero_optimization\"?"});
  ExpectError(R"({"zero_optimization": {"stagee": 2}})", {"did you mean \"zero_optimization.stage\"?"});
  ExpectError(R"({"zero_optimization": {"offload_optimizer": {"devic": "cpu"}}})",
              {"did you mean \"zero_optimization.offload_optimizer.device\"?"});
  ExpectError(R"({"train_micro_batch_size_per_gpu_": 4})",
              {"did you mean \"train_micro_batch_size_per_gpu\"?"});
  ExpectError(R"({"gradient_accumulation_step": 4})", {"did you mean \"gradient_accumulation_steps\"?"});
  // Far from every known key: no guess.
  auto c = ParseConfig(nlohmann::json::parse(R"({"strata": {"budget": 1}})"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().find("did you mean"), std::string::npos) << c.status().ToString();
}

TEST(Config, EditDistance) {
  EXPECT_EQ(core::EditDistance("stage", "stage"), 0u);
  EXPECT_EQ(core::EditDistance("stagee", "stage"), 1u);
  EXPECT_EQ(core::EditDistance("stgae", "stage"), 1u);  // a transposition is one edit
  EXPECT_EQ(core::EditDistance("Stage", "stage"), 0u);
  EXPECT_EQ(core::EditDistance("", "abc"), 3u);
  EXPECT_EQ(core::EditDistance("kitten", "sitting"), 3u);
}

TEST(Config, WrongTypesAndValues) {
  ExpectError(R"({"zero_optimization": {"offload_optimizer": {"device": "gpu"}}})",
              {"zero_optimization.offload_optimizer.device: expected one of none|cpu|nvme, got \"gpu\""});
  ExpectError(R"({"zero_optimization": {"stage": 4}})", {"zero_optimization.stage", "[0, 3]", "4"});
  ExpectError(R"({"zero_optimization": {"stage": "3"}})", {"zero_optimization.stage", "integer"});
  ExpectError(R"({"zero_optimization": {"stage": 2.5}})", {"zero_optimization.stage"});
  ExpectError(R"({"zero_optimization": {"overlap_comm": 1}})", {"overlap_comm", "true or false"});
  ExpectError(R"({"zero_optimization": {"reduce_bucket_size": -1}})", {"reduce_bucket_size"});
  ExpectError(R"({"zero_optimization": {"reduce_bucket_size": "lots"}})", {"reduce_bucket_size", "lots"});
  ExpectError(R"({"zero_optimization": []})", {"zero_optimization", "an object"});
  // The stage-3 bounds count parameters, not bytes.
  ExpectError(R"({"zero_optimization": {"stage3_max_reuse_distance": -1}})",
              {"zero_optimization.stage3_max_reuse_distance", "whole number of parameters"});
  ExpectError(R"({"zero_optimization": {"stage3_max_live_parameters": true}})",
              {"stage3_max_live_parameters", "number of parameters", "100M"});
  ExpectError(R"({"zero_optimization": {"stage3_param_persistence_threshold": "many"}})",
              {"stage3_param_persistence_threshold", "many"});
  ExpectError(R"({"aio": {"block_size": 1000}})", {"aio.block_size", "4096"});
  ExpectError(R"({"aio": {"queue_depth": 0}})", {"aio.queue_depth"});
  ExpectError(R"({"optimizer": {"type": "SGD"}})", {"optimizer.type", "AdamW|Adam", "SGD"});
  ExpectError(R"({"optimizer": {"params": {"betas": [0.9]}}})", {"optimizer.params.betas", "two numbers"});
  ExpectError(R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}})", {"optimizer.params.betas", "[0, 1)"});
  ExpectError(R"({"optimizer": {"params": {"lr": -1}}})", {"optimizer.params.lr"});
  ExpectError(R"({"fp16": {"enabled": true, "hysteresis": 0}})", {"fp16.hysteresis"});
  ExpectError(R"({"gradient_accumulation_steps": 0})", {"gradient_accumulation_steps"});
  ExpectError(R"({"gradient_clipping": "1"})", {"gradient_clipping", "a number"});
  ExpectError(R"({"strata": {"device": "tpu"}})", {"strata.device", "auto|sim|cuda", "tpu"});
  ExpectError(R"({"strata": {"chunk_size": "1000"}})", {"strata.chunk_size", "4 KiB"});
  ExpectError(R"({"strata": {"swap_paths": [1]}})", {"strata.swap_paths", "paths"});
  ExpectError(R"({"strata": {"io_backend": "libaio"}})", {"strata.io_backend", "io_uring|psync"});
  ExpectError(R"({"strata": {"gradients": "cpu"}})", {"strata.gradients", "host|nvme"});
  ExpectError(R"([1, 2])", {"JSON object"});
}

TEST(Config, CrossKeyRules) {
  ExpectError(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
              {"offload_param.device", "stage 3", "got stage 2"});
  ExpectError(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
              {"offload_optimizer.nvme_path", "required"});
  ExpectError(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})", {"bf16", "fp16"});
}

TEST(Config, OverlapIsAutoUnlessSet) {
  auto dflt = ParseConfigText("{}");
  ASSERT_TRUE(dflt.ok());
  EXPECT_TRUE(dflt->strata.overlap_auto);
  EXPECT_TRUE(dflt->strata.overlap) << "auto starts overlapped";
  EXPECT_EQ(ConfigToJson(*dflt)["strata"]["overlap"], "auto");
  for (bool v : {true, false}) {
    auto c = ParseConfigText(std::string(R"({"strata": {"overlap": )") + (v ? "true" : "false") + "}}");
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->strata.overlap_auto);
    EXPECT_EQ(c->strata.overlap, v);
    EXPECT_EQ(ConfigToJson(*c)["strata"]["overlap"], v);
    auto again = ParseConfig(ConfigToJson(*c));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->strata.overlap, v);
    EXPECT_FALSE(again->strata.overlap_auto);
  }
  ExpectError(R"({"strata": {"overlap": "sometimes"}})", {"strata.overlap", "\"auto\""});
}

TEST(Config, OffloadOptimizerRatioNeedsTheCpuOptimizer) {
  auto c = ParseConfigText(
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->zero.offload_optimizer.ratio, 0.3);
  EXPECT_EQ(ConfigToJson(*c)["zero_optimization"]["offload_optimizer"]["ratio"], 0.3);
  auto defaults = ParseConfigText("{}");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->zero.offload_optimizer.ratio, 1.0);
  ExpectError(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
              {"zero_optimization.offload_optimizer.ratio"});
  ExpectError(
      R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/tmp",
              "ratio": 0.5}}})",
      {"zero_optimization.offload_optimizer.ratio", "needs device \"cpu\"", "strata.optimizer_resident"});
  ExpectError(R"({"zero_optimization": {"stage": 1, "offload_optimizer": {"ratio": 0.5}}})",
              {"zero_optimization.offload_optimizer.ratio", "got \"none\""});
}

TEST(Config, NotYetSupportedKeysAreRejectedNotIgnored) {
  ExpectError(R"({"scheduler": {"type": "OneCycle", "params": {}}})",
              {"scheduler.type", "not supported yet"});
  ExpectError(R"({"activation_checkpointing": {"cpu_checkpointing": true}})",
              {"activation_checkpointing.cpu_checkpointing", "not supported yet"});
  ExpectError(R"({"zero_optimization": {"zero_quantized_weights": true}})",
              {"zero_quantized_weights", "not supported yet"});
  ExpectError(R"({"zero_optimization": {"reduce_scatter": false}})", {"reduce_scatter", "not supported yet"});
  ExpectError(R"({"aio": {"use_gds": true}})", {"aio.use_gds", "not supported yet"});
  ExpectError(R"({"optimizer": {"params": {"amsgrad": true}}})", {"amsgrad", "not supported yet"});
}

TEST(Config, BadJsonReportsPosition) {
  auto r = ParseConfigText(R"({"zero_optimization": {"stage": 3,}})");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not valid JSON"), std::string::npos);
  EXPECT_NE(r.status().message().find("line 1"), std::string::npos);
}

TEST(Config, LoadFile) {
  EXPECT_EQ(LoadConfigFile("/nonexistent/strata.json").status().code(), StatusCode::kNotFound);
  std::string path = ::testing::TempDir() + "/strata_config_test.json";
  { std::ofstream(path) << R"({"zero_optimization": {"stage": 2}})"; }
  auto c = LoadConfigFile(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->zero.stage, 2);
  { std::ofstream(path) << R"({"zero_optimization": {"stage": 9}})"; }
  auto bad = LoadConfigFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(path), std::string::npos) << "error names the file";
  std::remove(path.c_str());
}

// DeepSpeed's rule: train_batch_size = micro batch x accumulation x world size.
struct BatchCase {
  const char* json;
  int world;
  int micro, accum, total;  // expected after resolving; 0: an error is expected
  const char* error = "";
};

TEST(Config, BatchSizesFollowDeepSpeedsRule) {
  const BatchCase cases[] = {
      {R"({})", 2, 32, 1, 64},  // neither batch size: the tool's default micro batch
      {R"({"train_micro_batch_size_per_gpu": 4})", 2, 4, 1, 8},
      {R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})", 2, 4, 3, 24},
      {R"({"train_batch_size": 64})", 4, 16, 1, 64},  // alone: accumulation 1
      {R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4})", 4, 4, 4, 64},
      {R"({"train_batch_size": 64, "gradient_accumulation_steps": 2})", 4, 8, 2, 64},
      {R"({"train_batch_size": 24, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})",
       2, 4, 3, 24},
      {R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 3})",
       2, 0, 0, 0, "train_batch_size = micro batch x accumulation x world size (24)"},
      {R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4})", 1, 0, 0, 0,
       "multiple of micro batch"},
      {R"({"train_batch_size": 10, "gradient_accumulation_steps": 4})", 1, 0, 0, 0,
       "multiple of accumulation"},
      {R"({"train_batch_size": 3})", 4, 0, 0, 0, "multiple of accumulation x world size (4)"},
  };
  for (const BatchCase& t : cases) {
    SCOPED_TRACE(std::string(t.json) + " world " + std::to_string(t.world));
    auto c = ParseConfigText(t.json);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    Status s = ResolveBatchSizes(&*c, t.world, 32);
    if (t.micro == 0) {
      ASSERT_FALSE(s.ok());
      EXPECT_NE(s.message().find(t.error), std::string::npos) << s.ToString();
      EXPECT_NE(s.message().find("world size " + std::to_string(t.world)), std::string::npos) << s.ToString();
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(c->train_micro_batch_size_per_gpu, t.micro);
    EXPECT_EQ(c->gradient_accumulation_steps, t.accum);
    EXPECT_EQ(c->train_batch_size, t.total);
    Config again = *c;  // resolving twice changes nothing
    ASSERT_TRUE(ResolveBatchSizes(&again, t.world, 32).ok());
    EXPECT_EQ(ConfigToJson(again), ConfigToJson(*c));
  }
  ExpectError(R"({"train_batch_size": 0})", {"train_batch_size"});
  ExpectError(R"({"train_micro_batch_size_per_gpu": 0})", {"train_micro_batch_size_per_gpu"});
}

TEST(Config, RoundTripsThroughCanonicalJson) {
  auto c = ParseConfigText(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
                                "fp16": {"enabled": true, "initial_scale_power": 12},
                                "strata": {"swap_paths": ["/a", "/b"], "overlap": false, "gradients": "nvme"}})");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  nlohmann::json j = ConfigToJson(*c);
  auto again = ParseConfig(j);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ConfigToJson(*again), j);
  EXPECT_EQ(again->fp16.initial_scale_power, 12);
  EXPECT_FALSE(again->strata.overlap);
  EXPECT_EQ(again->strata.gradients, "nvme");
  EXPECT_EQ(again->zero.offload_param.device, OffloadDevice::kCpu);
}

// DeepSpeed's scheduler block: the type and its params, DeepSpeed's defaults where absent.
TEST(Config, SchedulerBlockReadsDeepSpeedsParams) {
  auto none = ParseConfigText("{}");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->scheduler.type, LrScheduleType::kConstant);
  auto warmup = ParseConfigText(R"({"scheduler": {"type": "WarmupLR"}})");
  ASSERT_TRUE(warmup.ok()) << warmup.status().ToString();
  EXPECT_EQ(warmup->scheduler.type, LrScheduleType::kWarmupLR);
  EXPECT_EQ(warmup->scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(warmup->scheduler.warmup_type, WarmupType::kLog);
  EXPECT_EQ(warmup->scheduler.warmup_min_lr, 0.0);
  EXPECT_FALSE(warmup->scheduler.warmup_max_lr.has_value()) << "absent: optimizer.params.lr";
  auto decay = ParseConfigText(R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 500,
      "warmup_min_lr": 1e-5, "warmup_max_lr": 3e-4, "warmup_num_steps": 50, "warmup_type": "linear",
      "last_batch_iteration": -1}}})");
  ASSERT_TRUE(decay.ok()) << decay.status().ToString();
  EXPECT_EQ(decay->scheduler.type, LrScheduleType::kWarmupDecayLR);
  EXPECT_EQ(decay->scheduler.total_num_steps, 500);
  EXPECT_EQ(decay->scheduler.warmup_num_steps, 50);
  EXPECT_EQ(decay->scheduler.warmup_type, WarmupType::kLinear);
  EXPECT_EQ(decay->scheduler.warmup_min_lr, 1e-5);
  EXPECT_EQ(decay->scheduler.warmup_max_lr, 3e-4);
  auto cosine = ParseConfigText(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 100,
      "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05, "warmup_num_steps": 10}}})");
  ASSERT_TRUE(cosine.ok()) << cosine.status().ToString();
  EXPECT_EQ(cosine->scheduler.type, LrScheduleType::kWarmupCosineLR);
  EXPECT_EQ(cosine->scheduler.warmup_min_ratio, 0.1);
  EXPECT_EQ(cosine->scheduler.cos_min_ratio, 0.05);
  auto cosine_defaults =
      ParseConfigText(R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9}}})");
  ASSERT_TRUE(cosine_defaults.ok()) << cosine_defaults.status().ToString();
  EXPECT_EQ(cosine_defaults->scheduler.warmup_min_ratio, 0.0);
  EXPECT_EQ(cosine_defaults->scheduler.cos_min_ratio, 1e-4);
}

TEST(Config, SchedulerRefusesWhatItCannotFollow) {
  ExpectError(R"({"scheduler": {"params": {}}})",
              {"scheduler.type", "required", "WarmupLR|WarmupDecayLR|WarmupCosineLR"});
  ExpectError(R"({"scheduler": {"type": "LRRangeTest"}})",
              {"scheduler.type", "LRRangeTest", "WarmupCosineLR"});
  ExpectError(
      R"({"scheduler": {"type": "CosineAnnealingLR"}})",
      {"scheduler.type", "expected one of WarmupLR|WarmupDecayLR|WarmupCosineLR", "CosineAnnealingLR"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_steps": 10}}})",
              {"scheduler.params.warmup_steps", "unknown key", "WarmupLR takes warmup_min_lr"});
  // A key of another type is refused, not ignored: WarmupCosineLR's rates are ratios.
  ExpectError(
      R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_max_lr": 1}}})",
      {"scheduler.params.warmup_max_lr", "WarmupCosineLR takes total_num_steps"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 9}}})",
              {"scheduler.params.total_num_steps", "unknown key"});
  ExpectError(R"({"scheduler": {"type": "WarmupDecayLR"}})",
              {"scheduler.params.total_num_steps", "required"});
  ExpectError(R"({"scheduler": {"type": "WarmupCosineLR", "params": {}}})",
              {"scheduler.params.total_num_steps", "required by WarmupCosineLR"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})",
              {"scheduler.params.warmup_num_steps"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})",
              {"scheduler.params.warmup_type", "log|linear", "exp"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 99}}})",
              {"scheduler.params.last_batch_iteration", "only -1"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": -1}}})",
              {"scheduler.params.warmup_min_lr"});
  ExpectError(
      R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "cos_min_ratio": 2}}})",
      {"scheduler.params.cos_min_ratio", "[0, 1]"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "params": []}})", {"scheduler.params", "an object"});
  ExpectError(R"({"scheduler": {"type": "WarmupLR", "param": {}}})", {"scheduler.param", "did you mean"});
  ExpectError(R"({"scheduler": "WarmupLR"})", {"scheduler", "an object"});
}

// The block switches recompute on; keys whose meaning is not built are refused when set.
TEST(Config, ActivationCheckpointingBlock) {
  auto off = ParseConfigText("{}");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->activation_checkpointing);
  auto empty = ParseConfigText(R"({"activation_checkpointing": {}})");
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE(empty->activation_checkpointing);
  // The block as DeepSpeed's and Hugging Face's examples write it.
  auto ds = ParseConfigText(R"({"activation_checkpointing": {"partition_activations": false,
      "cpu_checkpointing": false, "contiguous_memory_optimization": false, "number_checkpoints": null,
      "synchronize_checkpoint_boundary": false, "profile": false}})");
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_TRUE(ds->activation_checkpointing);
  auto counted = ParseConfigText(R"({"activation_checkpointing": {"number_checkpoints": 4}})");
  EXPECT_TRUE(counted.ok()) << counted.status().ToString();
  for (const char* key : {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                          "synchronize_checkpoint_boundary", "profile"}) {
    ExpectError(std::string(R"({"activation_checkpointing": {")") + key + R"(": true}})",
                {std::string("activation_checkpointing.") + key, "true is not supported yet"});
  }
  ExpectError(R"({"activation_checkpointing": {"partition_activations": true}})", {"model parallelism"});
  ExpectError(R"({"activation_checkpointing": {"number_checkpoints": 0}})",
              {"activation_checkpointing.number_checkpoints"});
  ExpectError(R"({"activation_checkpointing": {"profile": "yes"}})",
              {"activation_checkpointing.profile", "true or false"});
  ExpectError(R"({"activation_checkpointing": {"partition_activation": false}})",
              {"activation_checkpointing.partition_activation", "did you mean"});
  ExpectError(R"({"activation_checkpointing": true})", {"activation_checkpointing", "an object"});
}

// Each schedule type, and checkpointing, come back from the canonical JSON as they were.
TEST(Config, SchedulerAndCheckpointingRoundTrip) {
  for (
      const char* text : {
          R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 7}}})",
          R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": 0.02, "warmup_type": "linear"}}})",
          R"({"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 30, "warmup_min_lr": 1e-4}}})",
          R"({"scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 30, "cos_min_ratio": 0.1,
               "warmup_min_ratio": 0.01}}, "activation_checkpointing": {"number_checkpoints": null}})",
      }) {
    SCOPED_TRACE(text);
    auto c = ParseConfigText(text);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    nlohmann::json j = ConfigToJson(*c);
    auto again = ParseConfig(j);
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << j.dump();
    EXPECT_EQ(ConfigToJson(*again), j);
    const LrSchedule &a = c->scheduler, &b = again->scheduler;
    EXPECT_EQ(a.type, b.type);
    EXPECT_EQ(a.warmup_type, b.warmup_type);
    EXPECT_EQ(a.warmup_num_steps, b.warmup_num_steps);
    EXPECT_EQ(a.warmup_min_lr, b.warmup_min_lr);
    EXPECT_EQ(a.warmup_max_lr, b.warmup_max_lr);
    EXPECT_EQ(a.total_num_steps, b.total_num_steps);
    EXPECT_EQ(a.warmup_min_ratio, b.warmup_min_ratio);
    EXPECT_EQ(a.cos_min_ratio, b.cos_min_ratio);
    EXPECT_EQ(c->activation_checkpointing, again->activation_checkpointing);
  }
  nlohmann::json plain = ConfigToJson(Config{});
  EXPECT_FALSE(plain.contains("scheduler")) << "no block: the constant rate";
  EXPECT_FALSE(plain.contains("activation_checkpointing")) << "no block: no recompute";
}

}  // namespace
}  // namespace strata
