"""adam: strata.optim.CPUAdam against torch AdamW and DeepSpeedCPUAdam, beside the
memory-bandwidth limit of `strata bench adam`."""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from .common import count, die, rotate, summary

def adam_limit(strata_bin: str, params: int, threads: int) -> float:
    """The limit pass of `strata bench adam` (fp32 grads, no bf16 copy): params/s."""
    out = subprocess.run(
        [strata_bin, "bench", "adam", "--params", str(params), "--threads", str(threads),
         "--repeats", "3", "--json"],
        check=True, capture_output=True, text=True).stdout
    rows = [r for r in json.loads(out)["rows"]
            if r["kernel"] == "limit" and r["grad"] == "f32" and not r["bf16_copy"] and r["threads"] == threads]
    if len(rows) != 1:
        die(f"strata bench adam --json: expected one fp32 no-copy limit row, got {rows}")
    if rows[0]["bytes_per_param"] != 28:
        die(f"strata bench adam's limit row moves {rows[0]['bytes_per_param']} bytes/param, not 28")
    return rows[0]["params_per_s"]


def bench_adam(a, ds, ds_reason) -> dict:
    import torch

    import strata.optim

    torch.set_num_threads(a.threads)
    n, k = count(a.adam_params), a.adam_tensors
    sizes = [n // k + (1 if i < n % k else 0) for i in range(k)]
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.1) for s in sizes]
    for p in params:
        p.grad = torch.randn(p.shape) * 1e-3
    hyper = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    factories = {
        "strata CPUAdam": lambda: strata.optim.CPUAdam(params, **hyper),
        "torch AdamW foreach=False": lambda: torch.optim.AdamW(params, foreach=False, **hyper),
        "torch AdamW foreach=True": lambda: torch.optim.AdamW(params, foreach=True, **hyper),
        "torch AdamW fused=True": lambda: torch.optim.AdamW(params, fused=True, **hyper),
    }
    if ds is not None:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        factories["DeepSpeedCPUAdam"] = lambda: DeepSpeedCPUAdam(params, adamw_mode=True, **hyper)
    skipped = {}
    if ds is None:
        skipped["DeepSpeedCPUAdam"] = ds_reason
    opts = {}
    for name, make in factories.items():
        try:
            opt = make()
            opt.step()  # state allocated, kernels built and warm
        except Exception as e:  # noqa: BLE001
            if name == "torch AdamW fused=True":
                skipped[name] = f"torch {torch.__version__}: {type(e).__name__}: {str(e).splitlines()[0]}"
                continue
            raise
        opts[name] = opt
    names = list(opts)
    per = {name: [] for name in names}
    limits = []
    for r in range(a.rounds):
        for name in rotate(names + ["limit"], r):
            if name == "limit":
                limits.append(adam_limit(a.strata, n, a.threads))
                continue
            opt, times = opts[name], []
            for _ in range(a.adam_steps):
                t0 = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - t0)
            per[name].append(n / statistics.median(times))
        print(f"adam round {r + 1}/{a.rounds}: " + ", ".join(
            f"{x}={per[x][-1] / 1e9:.3f}" for x in names) + f", limit={limits[-1] / 1e9:.3f} Gparams/s",
            file=sys.stderr)
    return {"params": n, "tensors": k, "threads": a.threads, "rounds": a.rounds, "steps_per_round": a.adam_steps,
            "torch": torch.__version__, "params_per_s": {x: summary(v) for x, v in per.items()},
            "limit_params_per_s": summary(limits), "skipped": skipped}
