#!/usr/bin/env python3
"""The defaults (strata.overlap "auto", strata.optimizer_threads "auto") against fixed
settings of both knobs, over a grid.

For each configuration, `strata train --model mlp` runs each way: the defaults; overlap
on with the optimizer's speculative steps on 1 thread and on every core (where the
configuration has a CPU optimizer); and overlap off. The ways run in rotating order (the
disk and the shared cores drift). A run's figure is the median step time over the steps
after the default's trial (steps 7 to the end). The defaults should never be slower than
the best fixed setting: the table gives auto / min(fixed) for each configuration.

  bench/overlap-default.py [--strata build/src/strata] [--steps 16] [--rounds 1]
                           [--swap DIR] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

GRID = [
    # (params, flags)
    ("20M", ["--stage", "1", "--offload-optimizer", "cpu"]),
    ("20M", ["--stage", "2", "--offload-optimizer", "cpu"]),
    ("20M", ["--stage", "2", "--offload-optimizer", "none"]),
    ("20M", ["--stage", "3", "--offload-optimizer", "cpu", "--offload-param", "cpu"]),
    ("20M", ["--stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme"]),
    ("100M", ["--stage", "2", "--offload-optimizer", "cpu"]),
    ("100M", ["--stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme",
              "--host-budget", "2GiB"]),
]
FIRST_TIMED = 7  # steps 2-5 are the trial, 6 the first in the chosen mode


def run(strata, params, flags, config, steps, swap):
    cmd = [strata, "train", "--model", "mlp", "--params", params, "--micro-batch", "16",
           "--steps", str(steps), "--nvme-path", swap, "--json"] + flags
    if config is not None:
        cmd += ["--config", config]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    steps_run = report["steps"]
    timed = [s["seconds"] for s in steps_run if s["step"] >= FIRST_TIMED]
    modes = [s.get("overlapped") for s in steps_run if s["step"] >= FIRST_TIMED]
    return statistics.median(timed), modes


def write_config(tmp, name, strata):
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump({"strata": strata}, f)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/src/strata")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--swap", default=os.path.join(tempfile.gettempdir(), "strata-swap"))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    cores = os.cpu_count() or 1
    ways = {
        "auto": None,
        "on, 1 thread": write_config(tmp, "on1", {"overlap": True, "optimizer_threads": 1}),
        f"on, {cores} threads": write_config(tmp, "onall", {"overlap": True, "optimizer_threads": cores}),
        "off": write_config(tmp, "off", {"overlap": False}),
    }
    rows = []
    for params, flags in GRID:
        cpu_optimizer = "cpu" in flags[flags.index("--offload-optimizer") + 1]
        # The thread count is the CPU optimizer's: elsewhere the two "on" ways are one.
        names = [w for w in ways if cpu_optimizer or "thread" not in w or w.startswith("on, 1")]
        times = {w: [] for w in names}
        kept = None
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for way in order:
                t, modes = run(a.strata, params, flags, ways[way], a.steps, a.swap)
                times[way].append(t)
                if way == "auto":
                    kept = "on" if all(modes) else ("off" if not any(modes) else "mixed")
        med = {w: statistics.median(v) for w, v in times.items()}
        fixed = {w: t for w, t in med.items() if w != "auto"}
        best = min(fixed, key=fixed.get)
        row = {"params": params, "flags": " ".join(flags), "steps_s": med, "auto_kept": kept,
               "best_fixed": best, "auto_over_best": med["auto"] / fixed[best]}
        rows.append(row)
        cells = "  ".join(f"{w} {t*1e3:7.1f} ms" for w, t in med.items())
        print(f"{params:5} {row['flags']:62} {cells}  (auto kept {kept})  auto/best {row['auto_over_best']:.2f}",
              flush=True)
    for path in ways.values():
        if path:
            os.unlink(path)
    os.rmdir(tmp)
    worst = max(r["auto_over_best"] for r in rows)
    print(f"worst auto/best: {worst:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
