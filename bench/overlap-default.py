#!/usr/bin/env python3
"""The default (strata.overlap "auto") against both fixed settings, over a grid.

For each configuration, `strata train --model mlp` runs three ways: the default, overlap
fixed on, and overlap fixed off, in rotating order (the disk and the shared cores drift).
A run's figure is the median step time over the steps after the default's trial
(steps 7 to the end). The default should never be slower than the better fixed setting:
the table gives auto / min(on, off) for each configuration.

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


def run(strata, params, flags, mode, steps, swap, on_config):
    cmd = [strata, "train", "--model", "mlp", "--params", params, "--micro-batch", "16",
           "--steps", str(steps), "--nvme-path", swap, "--json"] + flags
    if mode == "on":
        cmd += ["--config", on_config]
    elif mode == "off":
        cmd += ["--no-overlap"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    report = json.loads(out)
    steps_run = report["steps"]
    timed = [s["seconds"] for s in steps_run if s["step"] >= FIRST_TIMED]
    modes = [s.get("overlapped") for s in steps_run if s["step"] >= FIRST_TIMED]
    return statistics.median(timed), modes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default="build/src/strata")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--swap", default=os.path.join(tempfile.gettempdir(), "strata-swap"))
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"strata": {"overlap": True}}, f)
        on_config = f.name
    rows = []
    for params, flags in GRID:
        times = {"auto": [], "on": [], "off": []}
        kept = None
        for r in range(a.rounds):
            order = ["auto", "on", "off"]
            order = order[r % 3:] + order[:r % 3]
            for mode in order:
                t, modes = run(a.strata, params, flags, mode, a.steps, a.swap, on_config)
                times[mode].append(t)
                if mode == "auto":
                    kept = "on" if all(modes) else ("off" if not any(modes) else "mixed")
        med = {m: statistics.median(v) for m, v in times.items()}
        best = min(med["on"], med["off"])
        row = {"params": params, "flags": " ".join(flags), "auto_s": med["auto"], "on_s": med["on"],
               "off_s": med["off"], "auto_kept": kept, "auto_over_best": med["auto"] / best}
        rows.append(row)
        print(f"{params:5} {row['flags']:70} on {med['on']*1e3:8.1f} ms  off {med['off']*1e3:8.1f} ms  "
              f"auto {med['auto']*1e3:8.1f} ms (kept {kept})  auto/best {row['auto_over_best']:.2f}",
              flush=True)
    os.unlink(on_config)
    worst = max(r["auto_over_best"] for r in rows)
    print(f"worst auto/best: {worst:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
