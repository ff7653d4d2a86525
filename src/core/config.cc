#include "strata/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/config_training.h"
#include "core/json_reader.h"
#include "strata/units.h"

namespace strata {

using core::JsonReader;

std::string_view OffloadDeviceName(OffloadDevice d) {
  switch (d) {
    case OffloadDevice::kNone: return "none";
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
  }
  return "?";
}
const std::vector<std::string>& SwapPaths(const Config& config, const OffloadConfig& offload) {
  return !offload.nvme_path.empty() ? offload.nvme_path : config.strata.swap_paths;
}

std::string_view DeviceKindName(DeviceKind k) {
  switch (k) {
    case DeviceKind::kAuto: return "auto";
    case DeviceKind::kSim: return "sim";
    case DeviceKind::kCuda: return "cuda";
  }
  return "?";
}
std::string_view IoBackendKindName(IoBackendKind k) {
  switch (k) {
    case IoBackendKind::kAuto: return "auto";
    case IoBackendKind::kIoUring: return "io_uring";
    case IoBackendKind::kPsync: return "psync";
  }
  return "?";
}

namespace {

Status ReadOffload(JsonReader& r, bool is_param, OffloadConfig* out) {
  std::string device = std::string(OffloadDeviceName(out->device));
  STRATA_RETURN_IF_ERROR(r.Enum("device", {"none", "cpu", "nvme"}, &device));
  out->device = device == "cpu" ? OffloadDevice::kCpu
                                : (device == "nvme" ? OffloadDevice::kNvme : OffloadDevice::kNone);
  STRATA_RETURN_IF_ERROR(r.StringOrList("nvme_path", &out->nvme_path));
  STRATA_RETURN_IF_ERROR(r.Bool("pin_memory", &out->pin_memory));
  STRATA_RETURN_IF_ERROR(r.Int("buffer_count", 0, 1 << 20, &out->buffer_count));
  if (is_param) {
    STRATA_RETURN_IF_ERROR(r.Bytes("buffer_size", &out->buffer_size));
  } else {
    STRATA_RETURN_IF_ERROR(r.Bool("pipeline_read", &out->pipeline_read));
    STRATA_RETURN_IF_ERROR(r.Bool("pipeline_write", &out->pipeline_write));
    STRATA_RETURN_IF_ERROR(r.Unsupported("fast_init", "strata initialises swap files itself"));
    STRATA_RETURN_IF_ERROR(r.Double("ratio", 0, 1, &out->ratio));
  }
  STRATA_RETURN_IF_ERROR(r.Unsupported("max_in_cpu", "strata sizes the host tier with strata.host_budget"));
  if (out->device == OffloadDevice::kNvme && out->nvme_path.empty()) {
    return InvalidArgumentError(r.Path("nvme_path") +
                                ": required when device is \"nvme\"; give a directory on an NVMe "
                                "drive (or a list, one per drive)");
  }
  if (out->ratio != 1 && out->device != OffloadDevice::kCpu) {
    return InvalidArgumentError(
        r.Path("ratio") +
        ": splits the optimizer state between the device and the CPU Adam; it needs device "
        "\"cpu\" (got \"" +
        std::string(OffloadDeviceName(out->device)) +
        "\"). For an NVMe optimizer, strata.optimizer_resident keeps part of the state in host memory");
  }
  return r.Finish();
}

Status ReadZero(JsonReader& r, ZeroConfig* z) {
  STRATA_RETURN_IF_ERROR(r.Int("stage", 0, 3, &z->stage));
  {
    STRATA_ASSIGN_OR_RETURN(JsonReader sub, r.ObjectOrEmpty("offload_optimizer"));
    STRATA_RETURN_IF_ERROR(ReadOffload(sub, false, &z->offload_optimizer));
  }
  {
    STRATA_ASSIGN_OR_RETURN(JsonReader sub, r.ObjectOrEmpty("offload_param"));
    STRATA_RETURN_IF_ERROR(ReadOffload(sub, true, &z->offload_param));
  }
  STRATA_RETURN_IF_ERROR(r.Bytes("reduce_bucket_size", &z->reduce_bucket_size));
  STRATA_RETURN_IF_ERROR(r.Bytes("allgather_bucket_size", &z->allgather_bucket_size));
  STRATA_RETURN_IF_ERROR(r.Bool("overlap_comm", &z->overlap_comm));
  STRATA_RETURN_IF_ERROR(r.Count("stage3_prefetch_bucket_size", &z->stage3_prefetch_bucket_size));
  STRATA_RETURN_IF_ERROR(r.Count("stage3_max_live_parameters", &z->stage3_max_live_parameters));
  STRATA_RETURN_IF_ERROR(r.Count("stage3_max_reuse_distance", &z->stage3_max_reuse_distance));
  STRATA_RETURN_IF_ERROR(
      r.Count("stage3_param_persistence_threshold", &z->stage3_param_persistence_threshold));
  STRATA_RETURN_IF_ERROR(r.Count("sub_group_size", &z->sub_group_size));
  if (z->sub_group_size == 0) {
    return InvalidArgumentError(
        r.Path("sub_group_size") +
        ": must be at least 1 parameter (it bounds an NVMe optimizer piece; the default 1e9 "
        "leaves the size to strata)");
  }
  // DeepSpeed keys that strata accepts only in their harmless form.
  bool flag = true;
  STRATA_RETURN_IF_ERROR(r.Bool("contiguous_gradients", &flag));
  STRATA_RETURN_IF_ERROR(r.Bool("reduce_scatter", &flag));
  if (!flag) {
    return InvalidArgumentError(r.Path("reduce_scatter") +
                                ": false is not supported yet (strata always reduce-scatters in stages 2-3)");
  }
  flag = true;
  STRATA_RETURN_IF_ERROR(r.Bool("allgather_partitions", &flag));
  if (!flag) {
    return InvalidArgumentError(r.Path("allgather_partitions") + ": false is not supported yet");
  }
  for (const char* k :
       {"round_robin_gradients", "zero_hpz_partition_size", "zero_quantized_weights",
        "zero_quantized_gradients", "mics_shard_size", "elastic_checkpoint", "offload_optimizer_states",
        "cpu_offload", "stage3_gather_16bit_weights_on_model_save", "memory_efficient_linear",
        "ignore_unused_parameters", "load_from_fp32_weights", "use_multi_rank_bucket_allreduce",
        "prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters", "max_reuse_distance",
        "module_granularity_threshold"}) {
    STRATA_RETURN_IF_ERROR(r.Unsupported(k, ""));
  }
  if (z->offload_param.device != OffloadDevice::kNone && z->stage != 3) {
    return InvalidArgumentError(
        "zero_optimization.offload_param.device: \"" +
        std::string(OffloadDeviceName(z->offload_param.device)) +
        "\" needs zero_optimization.stage 3 (parameters are only partitioned in stage 3), got stage " +
        std::to_string(z->stage));
  }
  return r.Finish();
}

Status ReadAio(JsonReader& r, AioConfig* a) {
  STRATA_RETURN_IF_ERROR(r.Bytes("block_size", &a->block_size));
  if (a->block_size < 4096 || a->block_size % 4096 != 0) {
    return InvalidArgumentError(r.Path("block_size") + ": must be a multiple of 4096 (O_DIRECT), got " +
                                std::to_string(a->block_size));
  }
  STRATA_RETURN_IF_ERROR(r.Int("queue_depth", 1, 4096, &a->queue_depth));
  STRATA_RETURN_IF_ERROR(r.Int("intra_op_parallelism", 1, 64, &a->intra_op_parallelism));
  STRATA_RETURN_IF_ERROR(r.Bool("single_submit", &a->single_submit));
  STRATA_RETURN_IF_ERROR(r.Bool("overlap_events", &a->overlap_events));
  STRATA_RETURN_IF_ERROR(r.Unsupported("thread_count", "use aio.intra_op_parallelism"));
  STRATA_RETURN_IF_ERROR(r.Unsupported("use_gds", "GPUDirect Storage is not built"));
  return r.Finish();
}

Status ReadFp16(JsonReader& r, Fp16Config* f) {
  STRATA_RETURN_IF_ERROR(r.Bool("enabled", &f->enabled));
  STRATA_RETURN_IF_ERROR(r.Double("loss_scale", 0, 1e30, &f->loss_scale));
  STRATA_RETURN_IF_ERROR(r.Int("initial_scale_power", 0, 64, &f->initial_scale_power));
  STRATA_RETURN_IF_ERROR(r.Int("loss_scale_window", 1, 1 << 30, &f->loss_scale_window));
  STRATA_RETURN_IF_ERROR(r.Int("hysteresis", 1, 1 << 20, &f->hysteresis));
  STRATA_RETURN_IF_ERROR(r.Double("min_loss_scale", 1e-30, 1e30, &f->min_loss_scale));
  STRATA_RETURN_IF_ERROR(r.Unsupported("auto_cast", "strata's model casts itself"));
  STRATA_RETURN_IF_ERROR(r.Unsupported("consecutive_hysteresis", ""));
  return r.Finish();
}

Status ReadOptimizer(JsonReader& r, OptimizerConfig* o) {
  std::string type = "AdamW";
  STRATA_RETURN_IF_ERROR(r.Enum("type", {"AdamW", "Adam", "adamw", "adam"}, &type));
  o->type = (type == "Adam" || type == "adam") ? OptimizerType::kAdam : OptimizerType::kAdamW;
  {
    STRATA_ASSIGN_OR_RETURN(JsonReader params, r.ObjectOrEmpty("params"));
    JsonReader* p = &params;
    STRATA_RETURN_IF_ERROR(p->Double("lr", 0, 1e6, &o->lr));
    std::vector<double> betas{o->beta1, o->beta2};
    STRATA_RETURN_IF_ERROR(p->DoublePair("betas", 0, 1, &betas));
    if (betas[0] >= 1 || betas[1] >= 1) {
      return InvalidArgumentError(p->Path("betas") + ": each beta must be in [0, 1), got [" +
                                  std::to_string(betas[0]) + ", " + std::to_string(betas[1]) + "]");
    }
    o->beta1 = betas[0];
    o->beta2 = betas[1];
    STRATA_RETURN_IF_ERROR(p->Double("eps", 1e-30, 1, &o->eps));
    STRATA_RETURN_IF_ERROR(p->Double("weight_decay", 0, 1e6, &o->weight_decay));
    bool flag = false;
    STRATA_RETURN_IF_ERROR(p->Bool("amsgrad", &flag));
    if (flag) return InvalidArgumentError(p->Path("amsgrad") + ": true is not supported yet");
    flag = true;
    STRATA_RETURN_IF_ERROR(p->Bool("bias_correction", &flag));
    if (!flag) return InvalidArgumentError(p->Path("bias_correction") + ": false is not supported yet");
    STRATA_RETURN_IF_ERROR(p->Unsupported("torch_adam", "strata has its own Adam"));
    STRATA_RETURN_IF_ERROR(p->Unsupported("adam_w_mode", "use optimizer.type Adam or AdamW"));
    STRATA_RETURN_IF_ERROR(p->Finish());
  }
  return r.Finish();
}

Status ReadStrata(JsonReader& r, StrataConfig* s) {
  std::string device(DeviceKindName(s->device));
  STRATA_RETURN_IF_ERROR(r.Enum("device", {"auto", "sim", "cuda"}, &device));
  s->device = device == "sim" ? DeviceKind::kSim : (device == "cuda" ? DeviceKind::kCuda : DeviceKind::kAuto);
  STRATA_RETURN_IF_ERROR(r.Int("device_index", 0, 1024, &s->device_index));
  STRATA_RETURN_IF_ERROR(r.Bytes("device_budget", &s->device_budget));
  STRATA_RETURN_IF_ERROR(r.Bytes("host_budget", &s->host_budget));
  STRATA_RETURN_IF_ERROR(r.Bytes("nvme_budget", &s->nvme_budget));
  STRATA_RETURN_IF_ERROR(r.Bytes("chunk_size", &s->chunk_size));
  if (s->chunk_size < 4096 || s->chunk_size % 4096 != 0) {
    return InvalidArgumentError(r.Path("chunk_size") + ": must be a positive multiple of 4 KiB, got " +
                                std::to_string(s->chunk_size));
  }
  STRATA_RETURN_IF_ERROR(r.StringOrList("swap_paths", &s->swap_paths));
  STRATA_RETURN_IF_ERROR(r.String("trace_file", &s->trace_file));
  std::string io(IoBackendKindName(s->io_backend));
  STRATA_RETURN_IF_ERROR(r.Enum("io_backend", {"auto", "io_uring", "psync"}, &io));
  s->io_backend = io == "io_uring" ? IoBackendKind::kIoUring
                                   : (io == "psync" ? IoBackendKind::kPsync : IoBackendKind::kAuto);
  STRATA_RETURN_IF_ERROR(r.Bool("io_sqpoll", &s->io_sqpoll));
  STRATA_RETURN_IF_ERROR(r.Bool("checksum", &s->checksum));
  STRATA_RETURN_IF_ERROR(r.BoolOrAuto("overlap", &s->overlap, &s->overlap_auto));
  if (s->overlap_auto) s->overlap = true;
  double threads = s->optimizer_threads > 0 ? s->optimizer_threads : -1;
  STRATA_RETURN_IF_ERROR(r.DoubleOrAuto("optimizer_threads", 1, 4096, &threads));
  if (threads >= 0 && threads != std::floor(threads)) {
    return InvalidArgumentError(r.Path("optimizer_threads") +
                                ": expected a whole number of threads or \"auto\", got " +
                                FormatDouble("%g", threads));
  }
  s->optimizer_threads = threads < 0 ? 0 : static_cast<int>(threads);
  STRATA_RETURN_IF_ERROR(r.Enum("gradients", {"auto", "host", "nvme"}, &s->gradients));
  STRATA_RETURN_IF_ERROR(r.Enum("plan", {"off", "auto"}, &s->plan));
  STRATA_RETURN_IF_ERROR(r.DoubleOrAuto("optimizer_resident", 0, 1, &s->optimizer_resident));
  STRATA_RETURN_IF_ERROR(r.DoubleOrAuto("gradient_resident", 0, 1, &s->gradient_resident));
  STRATA_RETURN_IF_ERROR(r.DoubleOrAuto("param_resident", 0, 1, &s->param_resident));
  STRATA_RETURN_IF_ERROR(r.DoubleOrAuto("param_on_device", 0, 1, &s->param_on_device));
  STRATA_RETURN_IF_ERROR(r.Double("collective_timeout_s", 0.001, 1e7, &s->collective_timeout_s));
  return r.Finish();
}

}  // namespace

Status ResolveBatchSizes(Config* c, int world_size, int default_micro_batch) {
  if (world_size < 1) return InvalidArgumentError("ResolveBatchSizes: world size must be >= 1");
  const int64_t world = world_size;
  int64_t micro = c->train_micro_batch_size_per_gpu, total = c->train_batch_size;
  int64_t accum = c->gradient_accumulation_given ? c->gradient_accumulation_steps : 0;
  auto values = [&] {
    return "train_batch_size " + (total ? std::to_string(total) : std::string("(not set)")) +
           ", train_micro_batch_size_per_gpu " + (micro ? std::to_string(micro) : std::string("(not set)")) +
           ", gradient_accumulation_steps " + (accum ? std::to_string(accum) : std::string("(not set)")) +
           ", world size " + std::to_string(world);
  };
  if (total > 0) {
    if (micro == 0 && accum == 0) accum = 1;
    if (micro == 0) {
      if (total % (accum * world) != 0) {
        return InvalidArgumentError(values() +
                                    ": train_batch_size must be a multiple of accumulation x world size (" +
                                    std::to_string(accum * world) + ")");
      }
      micro = total / (accum * world);
    } else if (accum == 0) {
      if (total % (micro * world) != 0) {
        return InvalidArgumentError(values() +
                                    ": train_batch_size must be a multiple of micro batch x world size (" +
                                    std::to_string(micro * world) + ")");
      }
      accum = total / (micro * world);
    }
    if (micro * accum * world != total) {
      return InvalidArgumentError(values() +
                                  ": they must satisfy train_batch_size = micro batch x accumulation x "
                                  "world size (" +
                                  std::to_string(micro * accum * world) +
                                  "); set two of them and strata derives the third");
    }
  } else {
    if (micro == 0) micro = default_micro_batch;
    if (accum == 0) accum = 1;
  }
  if (micro < 1 || micro > (1 << 24) || accum > (1 << 20)) {
    return InvalidArgumentError(
        values() + ": the micro batch must be in [1, 16777216] and accumulation in [1, 1048576]");
  }
  c->train_micro_batch_size_per_gpu = static_cast<int>(micro);
  c->gradient_accumulation_steps = static_cast<int>(accum);
  c->gradient_accumulation_given = true;
  c->train_batch_size = static_cast<int>(micro * accum * world);
  return OkStatus();
}

Result<Config> ParseConfig(const nlohmann::json& doc) {
  Config c;
  JsonReader r(doc, "");
  if (!doc.is_object()) return InvalidArgumentError("config: expected a JSON object at the top level");
  auto sub_or = [](Result<JsonReader> sub, auto fn) -> Status {
    if (sub.ok()) return fn(*sub);
    return sub.status();
  };
  STRATA_RETURN_IF_ERROR(
      sub_or(r.ObjectOrEmpty("zero_optimization"), [&](JsonReader& s) { return ReadZero(s, &c.zero); }));
  STRATA_RETURN_IF_ERROR(sub_or(r.ObjectOrEmpty("aio"), [&](JsonReader& s) { return ReadAio(s, &c.aio); }));
  STRATA_RETURN_IF_ERROR(sub_or(r.ObjectOrEmpty("bf16"), [&](JsonReader& s) -> Status {
    STRATA_RETURN_IF_ERROR(s.Bool("enabled", &c.bf16));
    STRATA_RETURN_IF_ERROR(s.Unsupported("immediate_grad_update", ""));
    return s.Finish();
  }));
  STRATA_RETURN_IF_ERROR(
      sub_or(r.ObjectOrEmpty("fp16"), [&](JsonReader& s) { return ReadFp16(s, &c.fp16); }));
  STRATA_RETURN_IF_ERROR(
      sub_or(r.ObjectOrEmpty("optimizer"), [&](JsonReader& s) { return ReadOptimizer(s, &c.optimizer); }));
  STRATA_RETURN_IF_ERROR(
      sub_or(r.ObjectOrEmpty("strata"), [&](JsonReader& s) { return ReadStrata(s, &c.strata); }));
  STRATA_RETURN_IF_ERROR(r.Double("gradient_clipping", 0, 1e30, &c.gradient_clipping));
  int accum = 0;
  STRATA_RETURN_IF_ERROR(r.Int("gradient_accumulation_steps", 1, 1 << 20, &accum));
  c.gradient_accumulation_given = accum > 0;
  if (accum > 0) c.gradient_accumulation_steps = accum;
  STRATA_RETURN_IF_ERROR(
      r.Int("train_micro_batch_size_per_gpu", 1, 1 << 24, &c.train_micro_batch_size_per_gpu));
  STRATA_RETURN_IF_ERROR(r.Int("train_batch_size", 1, 1 << 30, &c.train_batch_size));
  STRATA_RETURN_IF_ERROR(r.UInt64("seed", &c.seed));
  {
    STRATA_ASSIGN_OR_RETURN(JsonReader s, r.ObjectOrEmpty("scheduler"));
    if (doc.contains("scheduler")) {
      STRATA_RETURN_IF_ERROR(core::ReadScheduler(s, doc.at("scheduler"), &c.scheduler));
    }
  }
  {
    STRATA_ASSIGN_OR_RETURN(JsonReader s, r.ObjectOrEmpty("activation_checkpointing"));
    c.activation_checkpointing = doc.contains("activation_checkpointing");
    if (c.activation_checkpointing) {
      STRATA_RETURN_IF_ERROR(core::ReadActivationCheckpointing(s, doc.at("activation_checkpointing")));
    }
  }
  for (const char* k : {"amp", "wall_clock_breakdown", "flops_profiler", "tensorboard", "wandb",
                        "compression_training", "data_efficiency", "pipeline", "gradient_predivide_factor",
                        "prescale_gradients", "communication_data_type", "sparse_attention", "elasticity",
                        "checkpoint", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"}) {
    STRATA_RETURN_IF_ERROR(r.Unsupported(k, ""));
  }
  STRATA_RETURN_IF_ERROR(r.Ignore("steps_per_print"));
  if (c.bf16 && c.fp16.enabled) {
    return InvalidArgumentError("bf16.enabled and fp16.enabled are both true; choose one 16-bit format");
  }
  STRATA_RETURN_IF_ERROR(r.Finish());
  return c;
}

nlohmann::json ConfigToJson(const Config& c) {
  auto offload = [](const OffloadConfig& o, bool is_param) {
    nlohmann::json j = {{"device", OffloadDeviceName(o.device)},
                        {"nvme_path", o.nvme_path},
                        {"pin_memory", o.pin_memory},
                        {"buffer_count", o.buffer_count}};
    if (is_param) {
      j["buffer_size"] = o.buffer_size;
    } else {
      j["pipeline_read"] = o.pipeline_read;
      j["pipeline_write"] = o.pipeline_write;
      j["ratio"] = o.ratio;
    }
    return j;
  };
  const ZeroConfig& z = c.zero;
  nlohmann::json j;
  j["zero_optimization"] = {{"stage", z.stage},
                            {"offload_optimizer", offload(z.offload_optimizer, false)},
                            {"offload_param", offload(z.offload_param, true)},
                            {"reduce_bucket_size", z.reduce_bucket_size},
                            {"allgather_bucket_size", z.allgather_bucket_size},
                            {"overlap_comm", z.overlap_comm},
                            {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
                            {"stage3_max_live_parameters", z.stage3_max_live_parameters},
                            {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
                            {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
                            {"sub_group_size", z.sub_group_size}};
  j["aio"] = {{"block_size", c.aio.block_size},
              {"queue_depth", c.aio.queue_depth},
              {"intra_op_parallelism", c.aio.intra_op_parallelism},
              {"single_submit", c.aio.single_submit},
              {"overlap_events", c.aio.overlap_events}};
  j["bf16"] = {{"enabled", c.bf16}};
  j["fp16"] = {{"enabled", c.fp16.enabled},
               {"loss_scale", c.fp16.loss_scale},
               {"initial_scale_power", c.fp16.initial_scale_power},
               {"loss_scale_window", c.fp16.loss_scale_window},
               {"hysteresis", c.fp16.hysteresis},
               {"min_loss_scale", c.fp16.min_loss_scale}};
  j["gradient_clipping"] = c.gradient_clipping;
  // The batch keys as given (before ResolveBatchSizes) or as resolved; unset ones are left
  // out, so the document parses back to the same config.
  if (c.gradient_accumulation_given) j["gradient_accumulation_steps"] = c.gradient_accumulation_steps;
  if (c.train_micro_batch_size_per_gpu > 0)
    j["train_micro_batch_size_per_gpu"] = c.train_micro_batch_size_per_gpu;
  if (c.train_batch_size > 0) j["train_batch_size"] = c.train_batch_size;
  j["seed"] = c.seed;
  j["optimizer"] = {{"type", c.optimizer.type == OptimizerType::kAdam ? "Adam" : "AdamW"},
                    {"params",
                     {{"lr", c.optimizer.lr},
                      {"betas", {c.optimizer.beta1, c.optimizer.beta2}},
                      {"eps", c.optimizer.eps},
                      {"weight_decay", c.optimizer.weight_decay}}}};
  // Absent blocks stay absent: their absence is what means "off".
  if (c.scheduler.type != LrScheduleType::kConstant) j["scheduler"] = core::SchedulerToJson(c.scheduler);
  if (c.activation_checkpointing) j["activation_checkpointing"] = core::ActivationCheckpointingToJson();
  const StrataConfig& s = c.strata;
  j["strata"] = {
      {"device", DeviceKindName(s.device)},
      {"device_index", s.device_index},
      {"device_budget", s.device_budget},
      {"host_budget", s.host_budget},
      {"nvme_budget", s.nvme_budget},
      {"chunk_size", s.chunk_size},
      {"swap_paths", s.swap_paths},
      {"trace_file", s.trace_file},
      {"io_backend", IoBackendKindName(s.io_backend)},
      {"io_sqpoll", s.io_sqpoll},
      {"checksum", s.checksum},
      {"overlap", s.overlap_auto ? nlohmann::json("auto") : nlohmann::json(s.overlap)},
      {"optimizer_threads",
       s.optimizer_threads > 0 ? nlohmann::json(s.optimizer_threads) : nlohmann::json("auto")},
      {"gradients", s.gradients},
      {"plan", s.plan},
      {"optimizer_resident",
       s.optimizer_resident < 0 ? nlohmann::json("auto") : nlohmann::json(s.optimizer_resident)},
      {"gradient_resident",
       s.gradient_resident < 0 ? nlohmann::json("auto") : nlohmann::json(s.gradient_resident)},
      {"param_resident", s.param_resident < 0 ? nlohmann::json("auto") : nlohmann::json(s.param_resident)},
      {"param_on_device", s.param_on_device < 0 ? nlohmann::json("auto") : nlohmann::json(s.param_on_device)},
      {"collective_timeout_s", s.collective_timeout_s}};
  return j;
}

Result<Config> ParseConfigText(std::string_view text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::parse_error& e) {
    return InvalidArgumentError(std::string("config is not valid JSON: ") + e.what());
  }
  return ParseConfig(doc);
}

Result<Config> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("config file \"" + path + "\" cannot be opened; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  auto c = ParseConfigText(ss.str());
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

}  // namespace strata
