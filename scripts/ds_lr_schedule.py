"""DeepSpeed's learning-rate schedules (its `scheduler` config block: WarmupLR,
WarmupDecayLR, WarmupCosineLR) for scripts/gpt_torch_peer.py, the same formulas and
defaults as strata's include/strata/lr_schedule.h, so both sides of a comparison step at
the same rate.

rate_at(schedule, step, base_lr): the rate of the optimizer step taken after `step`
applied steps (0 for the first), which is DeepSpeed's get_lr() at last_batch_iteration =
step - 1 (the constructor's rate at step 0). `schedule` is the config's "scheduler" dict,
or None for a constant rate.
"""
import math

TYPES = ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR")
KEYS = {
    "WarmupLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "last_batch_iteration"},
    "WarmupDecayLR": {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type", "total_num_steps",
                      "last_batch_iteration"},
    "WarmupCosineLR": {"total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                       "warmup_type", "last_batch_iteration"},
}
WARMUP_DECAY_DEFAULT_MAX_LR = 0.001


def check(schedule) -> None:
    """Raises ValueError naming what the peer cannot follow (strata refuses the same)."""
    if schedule is None:
        return
    kind = schedule.get("type")
    if kind not in TYPES:
        raise ValueError(f"scheduler.type {kind!r}: the peer follows {', '.join(TYPES)}")
    params = schedule.get("params", {})
    unknown = set(params) - KEYS[kind]
    if unknown:
        raise ValueError(f"scheduler.params of {kind}: unknown key(s) {sorted(unknown)}")
    if params.get("warmup_type", "log") not in ("log", "linear"):
        raise ValueError(f"scheduler.params.warmup_type {params['warmup_type']!r}: log or linear")
    if kind != "WarmupLR" and int(params.get("total_num_steps", 0)) < 1:
        raise ValueError(f"{kind} needs scheduler.params.total_num_steps >= 1")


def _gamma(warmup_type: str, it: int, warmup: int) -> float:
    if warmup_type == "linear":
        return it / warmup
    return (1.0 / math.log(warmup)) * math.log(it + 1)


def rate_at(schedule, step: int, base_lr: float) -> float:
    if schedule is None:
        return base_lr
    kind, p = schedule["type"], schedule.get("params", {})
    it = step - 1
    warmup = max(2, int(p.get("warmup_num_steps", 1000)))
    warmup_type = p.get("warmup_type", "log")
    if kind == "WarmupCosineLR":
        if it < 0:
            return 0.0
        min_ratio = float(p.get("warmup_min_ratio", 0.0))
        if it < warmup:
            ratio = min_ratio + _gamma(warmup_type, it, warmup) * (1.0 - min_ratio)
        else:
            cos_min = float(p.get("cos_min_ratio", 1e-4))
            real_total = max(1, int(p["total_num_steps"]) - warmup)
            progress = min(1.0, (it - warmup + 1) / real_total)
            ratio = max(0.0, cos_min + (1.0 - cos_min) * (1.0 + math.cos(math.pi * progress)) / 2.0)
        return base_lr * ratio
    decay = kind == "WarmupDecayLR"
    min_lr = float(p.get("warmup_min_lr", 0.0))
    max_lr = p.get("warmup_max_lr")
    max_lr = float(max_lr) if max_lr is not None else (WARMUP_DECAY_DEFAULT_MAX_LR if decay else base_lr)
    if it < 0:
        return min_lr
    gamma = 1.0
    if it < warmup:
        gamma = _gamma(warmup_type, it, warmup)
    elif decay:
        total = int(p["total_num_steps"])
        gamma = max(0.0, (total - it) / max(1.0, float(total - warmup)))
    return min_lr + (max_lr - min_lr) * gamma
