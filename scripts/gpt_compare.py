#!/usr/bin/python3
"""Runs `strata train --model gpt` and its PyTorch peer (scripts/gpt_torch_peer.py) on the
same model, data and hyper-parameters, then compares their losses step by step and their
speed, and plots both (scripts/plot).

Usage:
  scripts/gpt_compare.py --data DIR [--strata build/src/strata] [--n-layer 4 --n-head 4
      --n-embd 128 --seq 128 --micro-batch 8 --steps 20 --lr 1e-3 --seed 1234
      --eval-every 10 --eval-batches 4 --gradient-accumulation-steps 1] [--untied]
      [--clip C] [--weight-decay W] [--threads N] [--torch-threads M] [--out-dir DIR] [--json]
      [-- EXTRA STRATA FLAGS, e.g. --stage 3 --offload-optimizer cpu]

  --threads N runs both on N cores: strata under `taskset` (oneTBB follows the affinity
  mask), PyTorch with torch.set_num_threads(M) (--torch-threads, default N) under the
  same `taskset`. Default: every core of the machine for both. Run it under
  `flock /tmp/build.lock` when the speed matters.
  The seed, clipping and weight decay reach strata through a config file written to
  OUT_DIR/config.json ({"seed", "gradient_clipping", "optimizer"}); flags after "--" go
  to strata only (ZeRO stage, offload: they must not change the math).

Writes OUT_DIR/strata.jsonl, OUT_DIR/torch.jsonl and OUT_DIR/loss.png (default
OUT_DIR: a new folder under $TMPDIR), and prints: the largest relative difference of
the training losses over the first --check-steps steps (and of every validation loss),
and each side's tokens/s: the median of the per-step rates after --skip warm-up steps.
Exit status 1 when the early losses differ by more than --tolerance (default 1e-5),
2 when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ["n-layer", "n-head", "n-embd", "seq", "micro-batch", "gradient-accumulation-steps", "steps", "lr",
          "eval-every", "eval-batches"]


def read(path: Path):
    steps, vals = {}, {}
    for line in path.read_text().splitlines():
        o = json.loads(line)
        if "loss" in o:
            steps[o["step"]] = o
        if "val_loss" in o:
            vals[o["step"]] = o["val_loss"]
    return steps, vals


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def run(cmd, what: str, env=None) -> None:
    print("+ " + " ".join(cmd), flush=True)
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout[-4000:], file=sys.stderr)
        print(f"gpt_compare: the {what} run failed (exit status {r.returncode})", file=sys.stderr)
        sys.exit(2)


def main() -> int:
    argv = sys.argv[1:]
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="folder with train.tokens and val.tokens")
    ap.add_argument("--strata", default=str(ROOT / "build/src/strata"))
    ap.add_argument("--python", default=sys.executable, help="python with torch for the peer")
    defaults = {"n-layer": 4, "n-head": 4, "n-embd": 128, "seq": 128, "micro-batch": 8,
                "gradient-accumulation-steps": 1, "steps": 20, "lr": 1e-3, "eval-every": 10, "eval-batches": 4}
    for k in SHARED:
        ap.add_argument("--" + k, type=type(defaults[k]), default=defaults[k])
    ap.add_argument("--seed", type=int, default=1234, help="strata config's seed (init; data uses seed + 1)")
    ap.add_argument("--untied", action="store_true", help="an LM head of its own")
    ap.add_argument("--clip", type=float, default=0.0, help="gradient_clipping (0: off)")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's weight decay")
    ap.add_argument("--threads", type=int, default=0, help="cores for each run (0: all)")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch.set_num_threads for the peer (default: the cores); OpenBLAS keeps its own "
                         "pool of OPENBLAS_NUM_THREADS (default: every core it may run on)")
    ap.add_argument("--scheduler", default="",
                    help="a DeepSpeed config whose \"scheduler\" block both sides follow (the peer: "
                         "scripts/ds_lr_schedule.py); the logged rates must agree exactly")
    ap.add_argument("--out-dir", default="")
    ap.add_argument("--check-steps", type=int, default=5, help="early steps whose losses must agree")
    ap.add_argument("--tolerance", type=float, default=1e-5, help="relative, for the early losses")
    ap.add_argument("--skip", type=int, default=2, help="warm-up steps left out of the speed")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)

    out = Path(args.out_dir or tempfile.mkdtemp(prefix="gpt-compare-"))
    out.mkdir(parents=True, exist_ok=True)
    shared = []
    for k in SHARED:
        shared += ["--" + k, str(getattr(args, k.replace("-", "_")))]
    if args.untied:
        shared.append("--untied")
    pin = []
    if args.threads > 0:
        pin = ["taskset", "-c", ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[: args.threads])]
    config = out / "config.json"
    settings = {"seed": args.seed, "gradient_clipping": args.clip,
                "optimizer": {"type": "AdamW", "params": {"weight_decay": args.weight_decay}}}
    if args.scheduler:
        settings["scheduler"] = json.loads(Path(args.scheduler).read_text())["scheduler"]
    config.write_text(json.dumps(settings) + "\n")
    s_log, t_log = out / "strata.jsonl", out / "torch.jsonl"
    run(pin + [args.strata, "train", "--model", "gpt", "--config", str(config), "--data", args.data, *shared,
               "--sample", "0", "--log", str(s_log), *extra], "strata")
    threads = args.threads or len(os.sched_getaffinity(0))
    torch_threads = args.torch_threads or threads
    run(pin + [args.python, str(ROOT / "scripts/gpt_torch_peer.py"), "--train", "--data", args.data, *shared,
               "--seed", str(args.seed), "--clip", str(args.clip), "--weight-decay", str(args.weight_decay),
               "--threads", str(torch_threads), "--config", str(config), "--log", str(t_log)], "PyTorch")
    subprocess.run([args.python, str(ROOT / "scripts/plot"), str(s_log), str(t_log), "--out", str(out / "loss.png")],
                   check=False)

    s_steps, s_vals = read(s_log)
    t_steps, t_vals = read(t_log)
    early = [i for i in sorted(s_steps) if i in t_steps and i <= args.check_steps]
    all_steps = [i for i in sorted(s_steps) if i in t_steps]
    worst_early = max((rel(s_steps[i]["loss"], t_steps[i]["loss"]) for i in early), default=float("nan"))
    worst_all = max((rel(s_steps[i]["loss"], t_steps[i]["loss"]) for i in all_steps), default=float("nan"))
    worst_val = max((rel(s_vals[i], t_vals[i]) for i in s_vals if i in t_vals), default=float("nan"))
    lr_diff = max((abs(s_steps[i]["lr"] - t_steps[i]["lr"]) for i in all_steps), default=0.0)

    def speed(steps):
        rates = [steps[i]["tokens_per_s"] for i in sorted(steps) if i > args.skip]
        return statistics.median(rates) if rates else float("nan")

    summary = {
        "out_dir": str(out),
        "threads": threads,
        "torch_threads": torch_threads,
        "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
        "load_average": os.getloadavg()[0],
        "steps_compared": len(all_steps),
        "max_rel_loss_diff_first_steps": worst_early,
        "max_rel_loss_diff_all_steps": worst_all,
        "max_rel_val_loss_diff": worst_val,
        "max_lr_diff": lr_diff,
        "strata_tokens_per_s": speed(s_steps),
        "torch_tokens_per_s": speed(t_steps),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"losses: first {len(early)} steps max rel diff {worst_early:.2e}; all {len(all_steps)} steps "
              f"{worst_all:.2e}; validation {worst_val:.2e}")
        print(f"tokens/s (median after {args.skip} steps, {threads} cores, torch threads {torch_threads}): strata "
              f"{summary['strata_tokens_per_s']:.0f}, PyTorch {summary['torch_tokens_per_s']:.0f}")
        print(f"learning rates: largest difference {lr_diff:.3g} over {len(all_steps)} steps")
        print(f"logs and plot in {out}")
    return 0 if worst_early <= args.tolerance and lr_diff == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
