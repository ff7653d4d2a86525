#!/usr/bin/python3
"""How well `strata plan` predicts: every configuration it says fits, run by `strata bench step`.

For each model (two MLP sizes by default) the plan is made once (rates measured and saved
as a profile), then each configuration that fits is run with `strata bench step --json`
under the same budgets, which measures its overlapped and its serial step
(strata.overlap false): the one the plan chose against the plan's prediction, and the
other way too, the planned host and device needs against the
measured high-water marks, and the planned NVMe bytes against the counted ones.

Usage: bench/plan-accuracy.py [--models 20M,100M,100M-acc4,gpt] [--swap DIR] [--steps N] [--repeat N] [--passes N]
                              [--out DIR] [--png FILE] [--from DIR] [--confirm N]
Prints a Markdown table and the summary (median and largest absolute error, the first
choice against the fastest measured); --out keeps the JSON reports, --png draws predicted
against measured (needs python3-matplotlib). --repeat N runs each configuration's rounds N
times (`bench step --repeat`) and compares the median steps: separate processes of one
configuration differ by about 10% on two shared cores, more than the 10% target allows.
--passes N runs the whole grid N times over, one pass after another, and compares each
configuration's median over the passes; it also prints how far each pass lies from that
median, the measurement's own spread beside the plan's error. --models picks the models
(default: the two MLPs). --from DIR reports (and draws) the rows.json an earlier --out kept,
running nothing. --confirm N times, for each model whose first choice is not the grid's
fastest, the two again in N interleaved rounds (the grid's fastest is the least of many
noisy figures, biased low by the noise that picked it); with --from, the same --models.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

# name: (the model and its budgets, as flags of both `strata plan` and `strata bench step`).
MODELS = {
    "20M": ["--model", "mlp", "--params", "20M", "--depth", "4", "--micro-batch", "32", "--device-budget", "1GiB",
            "--host-budget", "2GiB"],
    "100M": ["--model", "mlp", "--params", "100M", "--depth", "8", "--micro-batch", "16", "--device-budget", "2GiB",
             "--host-budget", "3GiB"],
    # Accumulation over 4 micro-batches under a host budget that holds none of the
    # optimizer state: its gradient shards go to disk and back between micro-batches.
    "100M-acc4": ["--model", "mlp", "--params", "100M", "--depth", "8", "--micro-batch", "8",
                  "--gradient-accumulation-steps", "4", "--device-budget", "2GiB", "--host-budget", "600MiB"],
    # The GPT of `strata train` (10.7M parameters, vocabulary 256), on the fortunes text.
    "gpt": ["--model", "gpt", "--n-layer", "6", "--n-head", "6", "--n-embd", "384", "--seq", "128", "--micro-batch",
            "4", "--device-budget", "192MiB", "--host-budget", "256MiB"],
}


def run_json(cmd: list[str]) -> dict:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def flags_of(c: dict) -> list[str]:
    f = ["--stage", str(c["stage"])]
    if c["stage"] > 0:
        f += ["--offload-optimizer", c["offload_optimizer"]]
    if c["stage"] == 3:
        f += ["--offload-param", c["offload_param"]]
    if c.get("offload_optimizer_ratio", 1) != 1:
        f += ["--offload-optimizer-ratio", repr(c["offload_optimizer_ratio"])]
    return f


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", default=os.environ.get("STRATA", "build/src/strata"))
    ap.add_argument("--swap", default=os.path.join(tempfile.gettempdir(), "strata-swap"))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--png", default="")
    ap.add_argument("--models", default="20M,100M")
    ap.add_argument("--from", dest="from_dir", default="")
    ap.add_argument("--confirm", type=int, default=0)
    a = ap.parse_args()
    if a.confirm < 0:
        ap.error(f"--confirm takes a number of rounds, 0 or more (got {a.confirm})")
    if a.from_dir:
        rows = json.load(open(os.path.join(a.from_dir, "rows.json")))
        report(rows)
        if a.confirm:
            confirm(a, rows, a.from_dir)
        if a.png:
            draw(rows, a.png)
        return 0
    names = a.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"plan-accuracy: unknown model {unknown[0]!r}; the models are {', '.join(MODELS)}", file=sys.stderr)
        return 2
    models = [(n, MODELS[n]) for n in names]
    out = a.out or tempfile.mkdtemp()
    os.makedirs(out, exist_ok=True)
    plans = []
    for mi, (_, model) in enumerate(models):
        profile = os.path.join(out, f"profile{mi}.json")
        plan = run_json([a.strata, "plan", *model, "--nvme-path", a.swap, "--json", "--save-profile", profile])
        json.dump(plan, open(os.path.join(out, f"plan{mi}.json"), "w"), indent=1)
        plans.append([c for c in plan["candidates"] if c["fits"]])
    # Pass after pass over the whole grid: a slow spell of the shared machine then lands
    # in one pass of a configuration, not in all of its runs.
    runs = {}
    for p in range(a.passes):
        for mi, (name, model) in enumerate(models):
            for ci, c in enumerate(plans[mi]):
                cmd = [a.strata, "bench", "step", *model, *flags_of(c), "--nvme-path", a.swap,
                       "--steps", str(a.steps), "--repeat", str(a.repeat), "--no-probes", "--json"]
                r = run_json(cmd)
                json.dump(r, open(os.path.join(out, f"run{mi}-{ci}-p{p}.json"), "w"), indent=1)
                runs.setdefault((mi, ci), []).append(median_runs(r["rounds"] if "rounds" in r else [r]))
                print(f"pass {p + 1}: {name} {c['name']}: {runs[(mi, ci)][-1][0]['step_s']*1e3:.0f} / "
                      f"{runs[(mi, ci)][-1][1]['step_s']*1e3:.0f} ms (overlap on / off)", file=sys.stderr, flush=True)
    rows = []
    for mi, (name, model) in enumerate(models):
        for ci, c in enumerate(plans[mi]):
            passes = runs[(mi, ci)]
            run, serial = passes[0]
            run, serial = dict(run), dict(serial)
            run["step_s"] = statistics.median(x[0]["step_s"] for x in passes)
            serial["step_s"] = statistics.median(x[1]["step_s"] for x in passes)
            t = c["time"]
            on = c["overlap"]  # the plan's choice; bench step measures both ways
            chosen = run if on else serial  # its own engine, whose plan is the one predicted
            rows.append({
                "model": name, "name": c["name"], "rank": ci + 1, "overlap": on,
                "pred": c["predicted_step_s"], "meas": run["step_s"] if on else serial["step_s"],
                "meas_passes": [x[0 if on else 1]["step_s"] for x in passes],
                "pred_other": t["serial_s"] if on else t["overlapped_s"],
                "meas_other": serial["step_s"] if on else run["step_s"],
                "host_plan": c["memory"]["host"], "host_meas": chosen["high_water"]["host"],
                "dev_plan": c["memory"]["device"], "dev_meas": chosen["high_water"]["device"],
                "rss": chosen.get("peak_rss_bytes", 0),
                # On the sim device every tier and the process itself are the machine's RAM.
                "rss_plan": c["memory"]["device"] + c["memory"]["host"] + c["memory"]["process"]["total"],
                "nvme_plan": c["work"]["nvme_read_bytes"] + c["work"]["nvme_write_bytes"],
                "nvme_meas": chosen["bytes"]["nvme_read"] + chosen["bytes"]["nvme_write"],
                "copy_plan": c["work"]["copy_bytes"], "copy_meas": chosen["bytes"]["h2d"] + chosen["bytes"]["d2h"],
                "comm_plan": c["work"]["comm_bytes"], "comm_meas": chosen["bytes"]["collectives"],
            })
            x = rows[-1]
            print(f"{x['model']} {x['name']}: overlap {'on' if on else 'off'}: predicted {x['pred']*1e3:.0f} ms, "
                  f"measured {x['meas']*1e3:.0f} ms; the other way {x['pred_other']*1e3:.0f} / "
                  f"{x['meas_other']*1e3:.0f} ms", file=sys.stderr, flush=True)
    report(rows)
    json.dump(rows, open(os.path.join(out, "rows.json"), "w"), indent=1)
    if a.confirm:
        confirm(a, rows, out)
    if a.png:
        draw(rows, a.png)
    return 0


def median_runs(rounds: list[dict]) -> tuple[dict, dict]:
    """The first round's runs with each way's median step and its highest tier peaks over the rounds."""
    run, serial = dict(rounds[0]["run"]), dict(rounds[0].get("serial_run", {}))
    run["step_s"] = statistics.median(r["run"]["step_s"] for r in rounds)
    if serial:
        serial["step_s"] = statistics.median(r["serial_run"]["step_s"] for r in rounds)
    for way, mine in (("run", run), ("serial_run", serial)):
        if mine:
            mine["high_water"] = {k: max(r[way]["high_water"][k] for r in rounds) for k in mine["high_water"]}
    # The process's peak over the first round only (its overlapped and serial engines):
    # later rounds run more engines in the same process, whose heap only grows.
    return run, serial


def err(p: float, m: float) -> float:
    return (p - m) / m


def mib(b: float) -> str:
    return f"{b / 2**20:.0f}"


def report(rows: list[dict]) -> None:
    print("| model | configuration | plan rank | overlap | predicted | measured | error | other way pred / meas | "
          "host plan / peak MiB | device plan / peak MiB | NVMe plan / counted MiB | copies plan / counted MiB | "
          "collectives plan / counted MiB | RSS plan / peak MiB |")
    print("|" + "---|" * 14)
    for x in rows:
        print(f"| {x['model']} | {x['name']} | {x['rank']} | {'on' if x['overlap'] else 'off'} | "
              f"{x['pred']*1e3:.0f} ms | {x['meas']*1e3:.0f} ms | {err(x['pred'], x['meas']):+.0%} | "
              f"{x['pred_other']*1e3:.0f} / {x['meas_other']*1e3:.0f} ms | "
              f"{mib(x['host_plan'])} / {mib(x['host_meas'])} | {mib(x['dev_plan'])} / {mib(x['dev_meas'])} | "
              f"{mib(x['nvme_plan'])} / {mib(x['nvme_meas'])} | {mib(x['copy_plan'])} / {mib(x['copy_meas'])} | "
              f"{mib(x['comm_plan'])} / {mib(x['comm_meas'])} | {mib(x['rss_plan'])} / {mib(x['rss'])} |")
    errs = [abs(err(x["pred"], x["meas"])) for x in rows]
    oerr = [abs(err(x["pred_other"], x["meas_other"])) for x in rows]
    print(f"\npoints: {len(rows)}; the plan's choice of overlap: median |error| {statistics.median(errs):.0%}, "
          f"largest {max(errs):.0%}; the other way: median {statistics.median(oerr):.0%}, largest {max(oerr):.0%}")
    spread = [abs(m / x["meas"] - 1) for x in rows for m in x["meas_passes"]] if rows[0]["meas_passes"][1:] else []
    if spread:
        print(f"the measurement's own spread (each pass against the median of the passes): median "
              f"{statistics.median(spread):.0%}, largest {max(spread):.0%}")
    under = [x for x in rows if x["host_plan"] < x["host_meas"] or x["dev_plan"] < x["dev_meas"]]
    print(f"plans below a measured peak (host or device): {len(under)}"
          + "".join(f"\n  {x['model']} {x['name']}" for x in under))
    rss_under = [x for x in rows if x["rss_plan"] < x["rss"]]
    print(f"plans (device + pinned host + process) below the process's peak RSS: {len(rss_under)}"
          + "".join(f"\n  {x['model']} {x['name']}: {mib(x['rss_plan'])} / {mib(x['rss'])} MiB" for x in rss_under))
    for model in sorted({x["model"] for x in rows}):
        mine = [x for x in rows if x["model"] == model]
        first = min(mine, key=lambda x: x["rank"])
        fastest = min(mine, key=lambda x: x["meas"])
        print(f"{model}: first choice {first['name']} measured {first['meas']*1e3:.0f} ms; fastest measured "
              f"{fastest['name']} {fastest['meas']*1e3:.0f} ms ({first['meas']/fastest['meas']-1:+.0%})")


def confirm(a: argparse.Namespace, rows: list[dict], out: str) -> None:
    """The first choice against the grid's fastest, timed again head to head.

    The fastest of many noisy measurements is biased low (its own noise chose it), so the
    grid's "first choice within 5% of the fastest" compares an unbiased figure with a
    biased one. Here the two run again in `--confirm` interleaved rounds (A B, then B A),
    each way the plan chose, and their medians are compared.
    """
    for mi, name in enumerate(a.models.split(",")):
        mine = [x for x in rows if x["model"] == name]
        if not mine:
            continue
        first = min(mine, key=lambda x: x["rank"])
        fastest = min(mine, key=lambda x: x["meas"])
        if first is fastest:
            print(f"{name}: the first choice is the grid's fastest; nothing to confirm")
            continue
        plan_path = os.path.join(out, f"plan{mi}.json")
        if not os.path.exists(plan_path):
            sys.exit(f"plan-accuracy: --confirm needs {plan_path}, the plan the grid of {name!r} kept; "
                     f"give --models in the order that run used")
        plan = json.load(open(plan_path))
        by_name = {c["name"]: c for c in plan["candidates"] if c["fits"]}
        if first["name"] not in by_name or fastest["name"] not in by_name:
            sys.exit(f"plan-accuracy: {plan_path} is not the plan of {name!r}'s rows "
                     f"(no {first['name']!r} or {fastest['name']!r}); give --models in the order that run used")
        steps = {first["name"]: [], fastest["name"]: []}
        for k in range(a.confirm):
            pair = [first, fastest] if k % 2 == 0 else [fastest, first]
            for x in pair:
                c = by_name[x["name"]]
                cmd = [a.strata, "bench", "step", *MODELS[name], *flags_of(c), "--nvme-path", a.swap, "--steps",
                       str(a.steps), "--repeat", str(a.repeat), "--no-probes", "--json"]
                report_json = run_json(cmd)
                run, serial = median_runs(report_json.get("rounds", [report_json]))
                steps[x["name"]].append((run if c["overlap"] else serial)["step_s"])
                print(f"confirm {k + 1}: {name} {x['name']}: {steps[x['name']][-1]*1e3:.0f} ms", file=sys.stderr,
                      flush=True)
        f = statistics.median(steps[first["name"]])
        g = statistics.median(steps[fastest["name"]])
        print(f"{name}: head to head over {a.confirm} interleaved rounds: first choice {first['name']} {f*1e3:.0f} ms "
              f"({', '.join(f'{v*1e3:.0f}' for v in steps[first['name']])}); the grid's fastest {fastest['name']} "
              f"{g*1e3:.0f} ms ({', '.join(f'{v*1e3:.0f}' for v in steps[fastest['name']])}): {f / g - 1:+.0%}")


def draw(rows: list[dict], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 6))
    models = sorted({x["model"] for x in rows})
    marks = "os^Dv<>p"
    if len(models) > len(marks):
        raise SystemExit(f"plan-accuracy: {len(models)} models to draw, marks for {len(marks)}")
    for model, mark in zip(models, marks):
        mine = [x for x in rows if x["model"] == model]
        ax.scatter([x["meas"] * 1e3 for x in mine], [x["pred"] * 1e3 for x in mine], marker=mark,
                   label=f"{model}, the plan's overlap choice")
        ax.scatter([x["meas_other"] * 1e3 for x in mine], [x["pred_other"] * 1e3 for x in mine], marker=mark,
                   facecolors="none", edgecolors="grey", label=f"{model}, the other way")
    # Log axes: the models' steps span 80 ms to 2 s, and the ±25% lines stay parallel.
    values = [v for x in rows for v in (x["meas"], x["pred"], x["meas_other"], x["pred_other"])]
    low, top = min(values) * 1e3 * 0.8, max(values) * 1e3 * 1.3
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.plot([low, top], [low, top], "k-", lw=0.8)
    ax.plot([low, top], [low * 1.25, top * 1.25], "k:", lw=0.6)
    ax.plot([low, top], [low * 0.75, top * 0.75], "k:", lw=0.6)
    ax.set_xlim(low, top)
    ax.set_ylim(low, top)
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.set_title("strata plan: predicted against measured (dotted: ±25%)")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120, bbox_inches="tight")


if __name__ == "__main__":
    sys.exit(main())
