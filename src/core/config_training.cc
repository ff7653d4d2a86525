#include "core/config_training.h"

#include <climits>
#include <cmath>
#include <string>
#include <vector>

namespace strata::core {
namespace {

constexpr const char* kSupportedTypes = "WarmupLR|WarmupDecayLR|WarmupCosineLR";

// The params each type takes: DeepSpeed's constructor arguments after the optimizer.
std::string ParamsTaken(LrScheduleType t) {
  switch (t) {
    case LrScheduleType::kWarmupLR:
      return "warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, last_batch_iteration";
    case LrScheduleType::kWarmupDecayLR:
      return "total_num_steps, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type, "
             "last_batch_iteration";
    case LrScheduleType::kWarmupCosineLR:
      return "total_num_steps, warmup_min_ratio, warmup_num_steps, cos_min_ratio, warmup_type, "
             "last_batch_iteration";
    case LrScheduleType::kConstant: break;
  }
  return "";
}

Status ReadType(JsonReader& r, const nlohmann::json& block, LrScheduleType* out) {
  std::string type;
  STRATA_RETURN_IF_ERROR(r.String("type", &type));
  if (!block.contains("type")) {
    return InvalidArgumentError(r.Path("type") + ": required; one of " + kSupportedTypes);
  }
  for (LrScheduleType t :
       {LrScheduleType::kWarmupLR, LrScheduleType::kWarmupDecayLR, LrScheduleType::kWarmupCosineLR}) {
    if (type == LrScheduleTypeName(t)) {
      *out = t;
      return OkStatus();
    }
  }
  if (type == "OneCycle" || type == "LRRangeTest") {
    return InvalidArgumentError(r.Path("type") + ": \"" + type +
                                "\" is not supported yet by strata; supported: " + kSupportedTypes +
                                " (see docs/config.md)");
  }
  return InvalidArgumentError(r.Path("type") + ": expected one of " + kSupportedTypes + ", got \"" + type +
                              "\" (DeepSpeed's OneCycle and LRRangeTest and torch.optim's schedulers are "
                              "not supported)");
}

// The keys every type shares: the warmup's length and shape, and DeepSpeed's resume point.
Status ReadWarmup(JsonReader& p, LrSchedule* s) {
  int steps = static_cast<int>(s->warmup_num_steps);
  STRATA_RETURN_IF_ERROR(p.Int("warmup_num_steps", 1, INT_MAX, &steps));
  s->warmup_num_steps = steps;
  std::string warmup_type(WarmupTypeName(s->warmup_type));
  STRATA_RETURN_IF_ERROR(p.Enum("warmup_type", {"log", "linear"}, &warmup_type));
  s->warmup_type = warmup_type == "linear" ? WarmupType::kLinear : WarmupType::kLog;
  int last = -1;
  STRATA_RETURN_IF_ERROR(p.Int("last_batch_iteration", INT_MIN, INT_MAX, &last));
  if (last != -1) {
    return InvalidArgumentError(p.Path("last_batch_iteration") +
                                ": only -1 (start at the beginning) is "
                                "supported: strata computes each step's rate from the number of steps "
                                "taken, got " +
                                std::to_string(last));
  }
  return OkStatus();
}

Status ReadParams(JsonReader& p, LrSchedule* s) {
  STRATA_RETURN_IF_ERROR(ReadWarmup(p, s));
  const std::string type(LrScheduleTypeName(s->type));
  if (s->type != LrScheduleType::kWarmupCosineLR) {
    STRATA_RETURN_IF_ERROR(p.Double("warmup_min_lr", 0, 1e6, &s->warmup_min_lr));
    double max_lr = NAN;
    STRATA_RETURN_IF_ERROR(p.Double("warmup_max_lr", 0, 1e6, &max_lr));
    if (!std::isnan(max_lr)) s->warmup_max_lr = max_lr;
  }
  if (s->type != LrScheduleType::kWarmupLR) {
    int total = 0;
    STRATA_RETURN_IF_ERROR(p.Int("total_num_steps", 1, INT_MAX, &total));
    if (total == 0) {
      return InvalidArgumentError(
          p.Path("total_num_steps") + ": required by " + type +
          " (the step where its decay ends); give the run's number of optimizer steps");
    }
    s->total_num_steps = total;
  }
  if (s->type == LrScheduleType::kWarmupCosineLR) {
    STRATA_RETURN_IF_ERROR(p.Double("warmup_min_ratio", 0, 1, &s->warmup_min_ratio));
    STRATA_RETURN_IF_ERROR(p.Double("cos_min_ratio", 0, 1, &s->cos_min_ratio));
  }
  Status unknown = p.Finish();
  if (!unknown.ok())
    return InvalidArgumentError(unknown.message() + "; " + type + " takes " + ParamsTaken(s->type));
  return OkStatus();
}

}  // namespace

Status ReadScheduler(JsonReader& r, const nlohmann::json& block, LrSchedule* out) {
  LrSchedule s;
  STRATA_RETURN_IF_ERROR(ReadType(r, block, &s.type));
  {
    STRATA_ASSIGN_OR_RETURN(JsonReader params, r.ObjectOrEmpty("params"));
    STRATA_RETURN_IF_ERROR(ReadParams(params, &s));
  }
  STRATA_RETURN_IF_ERROR(r.Finish());
  *out = s;
  return OkStatus();
}

nlohmann::json SchedulerToJson(const LrSchedule& s) {
  if (s.type == LrScheduleType::kConstant) return nullptr;
  nlohmann::json p = {{"warmup_num_steps", s.warmup_num_steps},
                      {"warmup_type", WarmupTypeName(s.warmup_type)}};
  if (s.type != LrScheduleType::kWarmupCosineLR) {
    p["warmup_min_lr"] = s.warmup_min_lr;
    // Left out when unset: WarmupLR then follows optimizer.params.lr.
    if (s.warmup_max_lr) p["warmup_max_lr"] = *s.warmup_max_lr;
  }
  if (s.type != LrScheduleType::kWarmupLR) p["total_num_steps"] = s.total_num_steps;
  if (s.type == LrScheduleType::kWarmupCosineLR) {
    p["warmup_min_ratio"] = s.warmup_min_ratio;
    p["cos_min_ratio"] = s.cos_min_ratio;
  }
  return {{"type", LrScheduleTypeName(s.type)}, {"params", p}};
}

Status ReadActivationCheckpointing(JsonReader& r, const nlohmann::json& block) {
  struct Refused {
    const char* key;
    const char* why;
  };
  const Refused refused[] = {
      {"partition_activations",
       "it splits checkpoints across model-parallel ranks; strata has no model parallelism"},
      {"cpu_checkpointing", "it moves checkpoints to host memory; strata keeps them on the device"},
      {"contiguous_memory_optimization", "it copies checkpoints into preallocated contiguous buffers"},
      {"synchronize_checkpoint_boundary", "it synchronizes the device at every checkpoint boundary"},
      {"profile", "per-checkpoint timing; strata.trace_file records a timeline of every module"},
  };
  for (const Refused& k : refused) {
    bool on = false;
    STRATA_RETURN_IF_ERROR(r.Bool(k.key, &on));
    if (on) {
      return InvalidArgumentError(r.Path(k.key) + ": true is not supported yet by strata (" + k.why +
                                  "); set it to false or remove it (see docs/config.md)");
    }
  }
  // DeepSpeed reads it only to size contiguous_memory_optimization's buffers, which are
  // refused above: any count (or null) means nothing here, as in DeepSpeed.
  const auto n = block.find("number_checkpoints");
  if (n != block.end() && n->is_null()) {
    STRATA_RETURN_IF_ERROR(r.Ignore("number_checkpoints"));
  } else {
    int count = 1;
    STRATA_RETURN_IF_ERROR(r.Int("number_checkpoints", 1, INT_MAX, &count));
  }
  return r.Finish();
}

nlohmann::json ActivationCheckpointingToJson() {
  return {{"partition_activations", false},
          {"cpu_checkpointing", false},
          {"contiguous_memory_optimization", false},
          {"synchronize_checkpoint_boundary", false},
          {"profile", false}};
}

}  // namespace strata::core
