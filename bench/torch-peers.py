#!/usr/bin/env python3
"""strata's Python package against its PyTorch and DeepSpeed peers, in the same run.

  adam  strata.optim.CPUAdam against torch.optim.AdamW (foreach off and on, fused where
        this torch has it for CPU tensors) and DeepSpeedCPUAdam: one set of fp32
        parameters and gradients, stepped by each optimizer in turn (each keeps its own
        state), every optimizer on the same threads; beside them the memory-bandwidth
        limit pass of `strata bench adam` (Adam's traffic without its arithmetic, 28 bytes
        a parameter for fp32 gradients without the bf16 copy) at the same size and threads.
  io    strata.io.aio_handle against DeepNVMe's aio_handle (AsyncIOBuilder().load()), each
        reading a whole file into one tensor and writing it back (O_DIRECT), at the same
        block size, queue depth and I/O threads, into the same tensor (strata's pinned
        arena; DeepNVMe also into its own new_cpu_locked_tensor); beside them fio through
        `strata bench io` (its fio command, buffers and median) at the same block size,
        queue depth and file size on the same disk.
  step  the step time of one small GPT-style torch model under strata.torch.initialize and
        under deepspeed.initialize with the same config dict: ZeRO-3 with the optimizer
        state and the parameters on NVMe, and ZeRO-2 with the optimizer on the CPU; world
        size 1 (DeepSpeed: torch.distributed over gloo on its CPU accelerator). Each run is
        a child process; the figure is the median step after the warm-up steps.

Every benchmark runs --rounds rounds with the runners in rotating order (the disk drifts)
and reports each runner's median and best over the rounds, and the ratio of the medians.

  bench/deepspeed-venv.sh                # once: /tmp/ds-venv with DeepSpeed and its ops
  /tmp/ds-venv/bin/python bench/torch-peers.py all --swap /work/strata-swap

Run it with a Python that can import strata (this script puts build/python on the path)
and, for the DeepSpeed columns, deepspeed: the venv of bench/deepspeed-venv.sh. Without
DeepSpeed, the DeepSpeed rows say why they did not run and the script exits 2 at the end
(--no-deepspeed: leave them out and exit 0). Any other failure exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def die(msg: str) -> None:
    print(f"torch-peers: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def count(text: str) -> int:
    mult = {"K": 10**3, "M": 10**6, "G": 10**9}
    t = text.strip().upper()
    return int(float(t[:-1]) * mult[t[-1]]) if t[-1] in mult else int(t)


def nbytes(text: str) -> int:
    mult = {"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    t = text.strip().upper()
    for k, v in mult.items():
        if t.endswith(k):
            return int(float(t[: -len(k)]) * v)
    return int(t)


def import_strata(build: Path):
    sys.path.insert(0, str(build / "python"))
    try:
        import strata  # noqa: F401
        import strata.io  # noqa: F401
        import strata.optim  # noqa: F401
    except Exception as e:  # noqa: BLE001
        die(f"cannot import strata from {build / 'python'}: {e} (build it: scripts/build.sh)")


def deepspeed_or_reason():
    """(deepspeed module, None) or (None, why it is not available)."""
    try:
        import deepspeed  # noqa: F401

        return deepspeed, None
    except Exception as e:  # noqa: BLE001
        return None, f"import deepspeed failed ({type(e).__name__}: {e}); run bench/deepspeed-venv.sh and use its python"


def rotate(items, r):
    r %= len(items)
    return items[r:] + items[:r]


def summary(values):
    return {"median": statistics.median(values), "best": max(values), "all": values}


# ----------------------------------------------------------------------------- adam


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


# ----------------------------------------------------------------------------- io


def fio_point(a, size: int) -> dict:
    """`strata bench io` at one point: strata's engine and fio (its command and buffers)."""
    out = subprocess.run(
        [a.strata, "bench", "io", "--path", a.swap, "--size", str(size), "--mode", "seqread,seqwrite",
         "--bs", str(a.bs), "--qd", str(a.qd), "--threads", str(a.io_threads), "--repeat", "1", "--vs-fio",
         "--json"], check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    res = {}
    for p in j["points"] if "points" in j else j["rows"]:
        if "fio" not in p:
            die(f"strata bench io: fio did not run: {p.get('fio_error')}")
        res[p["mode"]] = {"fio": p["fio"]["bytes_per_s"], "strata bench io": p["bytes_per_s"]}
    res["fio_buffers"] = j.get("fio_buffers")
    return res


def bench_io(a, ds, ds_reason) -> dict:
    import torch

    import strata.io

    size = nbytes(a.io_size) // a.bs * a.bs
    folder = Path(tempfile.mkdtemp(prefix="torch-peers-io-", dir=a.swap))
    path = str(folder / "file.dat")
    try:
        buf = strata.io.pinned_empty((size,), torch.uint8)
        buf.copy_(torch.randint(0, 256, (size,), dtype=torch.uint8))
        sh = strata.io.aio_handle(a.bs, a.qd, False, False, a.io_threads)
        sh.sync_pwrite(buf, path)
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        runners = {"strata.io": (sh, buf)}
        skipped = {}
        if ds is not None:
            from deepspeed.ops.op_builder import AsyncIOBuilder

            aio = AsyncIOBuilder().load(verbose=False)
            dh = aio.aio_handle(a.bs, a.qd, False, False, a.io_threads)
            runners["DeepNVMe (strata's buffer)"] = (dh, buf)
            own = dh.new_cpu_locked_tensor(size, torch.empty(0, dtype=torch.uint8))
            runners["DeepNVMe (its locked buffer)"] = (dh, own)
        else:
            skipped["DeepNVMe"] = ds_reason
        names = list(runners)
        per = {(x, m): [] for x in names + ["fio", "strata bench io"] for m in ("seqread", "seqwrite")}
        fio_buffers = None
        for r in range(a.rounds):
            for name in rotate(names + ["fio"], r):
                if name == "fio":
                    pt = fio_point(a, size)
                    fio_buffers = pt.pop("fio_buffers")
                    for m in ("seqread", "seqwrite"):
                        per[("fio", m)].append(pt[m]["fio"])
                        per[("strata bench io", m)].append(pt[m]["strata bench io"])
                    continue
                h, t = runners[name]
                t0 = time.perf_counter()
                rc = h.sync_pread(t, path)
                dt = time.perf_counter() - t0
                if rc < 0:
                    die(f"{name}: sync_pread returned {rc}")
                per[(name, "seqread")].append(size / dt)
                t0 = time.perf_counter()
                rc = h.sync_pwrite(t, path)
                dt = time.perf_counter() - t0
                if rc < 0:
                    die(f"{name}: sync_pwrite returned {rc}")
                per[(name, "seqwrite")].append(size / dt)
                fd = os.open(path, os.O_RDONLY)  # untimed, as strata bench io after its writes
                os.fsync(fd)
                os.close(fd)
            print(f"io round {r + 1}/{a.rounds}: " + ", ".join(
                f"{x} {m}={v[-1] / 1e9:.2f}" for (x, m), v in per.items() if v) + " GB/s", file=sys.stderr)
        return {"bytes": size, "block_size": a.bs, "queue_depth": a.qd, "io_threads": a.io_threads,
                "rounds": a.rounds, "fio_buffers": fio_buffers,
                "bytes_per_s": {f"{x} {m}": summary(v) for (x, m), v in per.items() if v}, "skipped": skipped}
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


# ----------------------------------------------------------------------------- step

# Rows DeepSpeed cannot run here, and why (docs/benchmarks.md has the details); they are
# reported as not run, and the script exits 2, unless --try-all-deepspeed.
DS_CANNOT = {
    "zero3-nvme": "DeepSpeed 0.15.4's ZeRO-3 NVMe swappers on its CPU accelerator with torch 1.13 "
                  "assert that their buffers are pinned (AsyncTensorSwapper.add_buffers), and no CPU "
                  "tensor is pinned without CUDA; telling it that CPU tensors count as pinned made "
                  "the run hang (no step in 6 minutes)",
}

STEP_CONFIGS = {
    "zero3-nvme": {"zero_optimization": {"stage": 3,
                                         "offload_optimizer": {"device": "nvme", "nvme_path": None},
                                         "offload_param": {"device": "nvme", "nvme_path": None}}},
    "zero2-cpu": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
}


def make_model(a):
    import torch

    class Block(torch.nn.Module):
        def __init__(self, w: int, heads: int) -> None:
            super().__init__()
            self.ln1 = torch.nn.LayerNorm(w)
            self.qkv = torch.nn.Linear(w, 3 * w)
            self.proj = torch.nn.Linear(w, w)
            self.ln2 = torch.nn.LayerNorm(w)
            self.fc = torch.nn.Linear(w, 4 * w)
            self.fc2 = torch.nn.Linear(4 * w, w)
            self.heads = heads

        def forward(self, x):
            b, t, w = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(w, dim=2)
            q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / (w // self.heads) ** 0.5
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, w))
            return x + self.fc2(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    class GPT(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = torch.nn.Embedding(a.vocab, a.width)
            self.wpe = torch.nn.Embedding(a.seq, a.width)
            self.blocks = torch.nn.ModuleList(Block(a.width, a.heads) for _ in range(a.layers))
            self.ln = torch.nn.LayerNorm(a.width)
            self.head = torch.nn.Linear(a.width, a.vocab, bias=False)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    torch.manual_seed(0)
    return GPT()


def step_config(a, name: str, nvme: str) -> dict:
    c = json.loads(json.dumps(STEP_CONFIGS[name]))
    for k in ("offload_optimizer", "offload_param"):
        if k in c["zero_optimization"] and c["zero_optimization"][k]["device"] == "nvme":
            c["zero_optimization"][k]["nvme_path"] = nvme
    c.update({"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
              "aio": {"block_size": a.bs, "queue_depth": a.qd, "intra_op_parallelism": a.io_threads,
                      "single_submit": False, "overlap_events": True}})
    return c


def gloo_shims(deepspeed) -> None:
    """torch 1.13's gloo has no _allgather_base (DeepSpeed's all_gather_into_tensor, which
    ZeRO-3 calls without a fallback) nor reduce_scatter. At world size 1 (the only size
    this benchmark runs) both are a copy: DeepSpeed's torch backend gets those."""
    import torch

    if torch.distributed.get_world_size() != 1:
        die("the gloo shims are for world size 1 only")
    cdb = deepspeed.comm.comm.cdb

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        if async_op:
            die("gloo shim: async all_gather_into_tensor")
        output_tensor.copy_(input_tensor.reshape(output_tensor.shape))

    def reduce_scatter_tensor(output_tensor, input_tensor, op=None, group=None, async_op=False):
        if async_op:
            die("gloo shim: async reduce_scatter_tensor")
        output_tensor.copy_(input_tensor.reshape(output_tensor.shape))

    cdb.all_gather_function = all_gather_into_tensor
    cdb.reduce_scatter_function = reduce_scatter_tensor


def step_child(a) -> None:
    """One run: prints {"step_s": [...], "loss": [...], "params": N} as JSON on stdout."""
    import torch

    torch.set_num_threads(a.threads)
    model = make_model(a)
    nparams = sum(p.numel() for p in model.parameters())
    nvme = tempfile.mkdtemp(prefix=f"torch-peers-{a.framework}-", dir=a.swap)
    cfg = step_config(a, a.config, nvme)
    if a.framework == "strata":
        import strata.torch as st

        engine = st.initialize(model, cfg)
    else:
        import deepspeed

        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(a.port), "RANK": "0",
                           "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        deepspeed.init_distributed(dist_backend="gloo")
        gloo_shims(deepspeed)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    g = torch.Generator().manual_seed(1)
    times, losses = [], []
    for _ in range(a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        t0 = time.perf_counter()
        logits = engine(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab).float(), y.reshape(-1))
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t0)
        losses.append(float(loss))
    print(json.dumps({"step_s": times, "loss": losses, "params": nparams}))
    sys.stdout.flush()
    os._exit(0)  # skip both engines' teardown (their NVMe files are removed by the parent)


def bench_step(a, ds, ds_reason) -> dict:
    frameworks = ["strata"] + (["deepspeed"] if ds is not None else [])
    rows, skipped, nparams = {}, {}, None
    if ds is None:
        skipped["deepspeed"] = ds_reason
    for cfg in a.step_configs.split(","):
        if cfg not in STEP_CONFIGS:
            die(f"unknown step config {cfg} ({', '.join(STEP_CONFIGS)})")
        fws = list(frameworks)
        if "deepspeed" in fws and cfg in DS_CANNOT and not a.try_all_deepspeed:
            fws.remove("deepspeed")
            skipped[f"deepspeed {cfg}"] = DS_CANNOT[cfg]
            print(f"torch-peers: deepspeed {cfg} not run: {DS_CANNOT[cfg]}", file=sys.stderr)
        per = {f: [] for f in fws}
        losses = {}
        for r in range(a.rounds):
            for fw in rotate(fws, r):
                cmd = [sys.executable, __file__, "step-child", "--framework", fw, "--config", cfg]
                cmd += [f"--{k.replace('_', '-')}={v}" for k, v in vars(a).items()
                        if k in STEP_ARGS]
                with tempfile.TemporaryDirectory(dir=a.swap):
                    try:
                        p = subprocess.run(cmd, capture_output=True, text=True, env=child_env(a),
                                           timeout=a.child_timeout)
                    except subprocess.TimeoutExpired:
                        die(f"step {fw} {cfg}: no result in {a.child_timeout} s (--child-timeout)")
                for d in Path(a.swap).glob(f"torch-peers-{fw}-*"):
                    subprocess.run(["rm", "-rf", str(d)], check=True)
                if p.returncode != 0:
                    log = Path(tempfile.gettempdir()) / f"torch-peers-step-{fw}-{cfg}.log"
                    log.write_text(p.stdout + p.stderr)
                    tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-8:])
                    die(f"step {fw} {cfg} exited {p.returncode} (log {log}):\n{tail}")
                j = json.loads(p.stdout.strip().splitlines()[-1])
                nparams = j["params"]
                timed = j["step_s"][a.warmup:]
                per[fw].append(statistics.median(timed))
                losses[fw] = j["loss"]
                print(f"step {cfg} round {r + 1}/{a.rounds} {fw}: median {per[fw][-1]:.3f} s/step "
                      f"(steps {a.warmup + 1}-{a.steps}), losses {['%.4f' % x for x in j['loss'][:3]]}...",
                      file=sys.stderr)
        rows[cfg] = {"config": step_config(a, cfg, "<nvme_path>"), "step_s": {
            f: {"median": statistics.median(v), "best": min(v), "all": v} for f, v in per.items()},
            "losses": losses}
    return {"params": nparams, "rounds": a.rounds, "rows": rows, "skipped": skipped}


STEP_ARGS = {"threads", "vocab", "width", "layers", "heads", "seq", "batch", "steps", "bs", "qd", "io_threads",
             "swap", "build", "port"}


def child_env(a) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(a.threads)
    env["PYTHONPATH"] = str(Path(a.build) / "python") + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["adam", "io", "step", "all", "step-child"])
    ap.add_argument("--build", default=str(ROOT / "build"), help="strata build folder (default build/)")
    ap.add_argument("--strata", default="", help="strata binary (default BUILD/src/strata)")
    ap.add_argument("--swap", default="/work/strata-swap", help="folder on the NVMe disk (O_DIRECT)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="compute threads (default all)")
    ap.add_argument("--no-deepspeed", action="store_true", help="leave DeepSpeed out (exit 0 without it)")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--adam-params", default="64M")
    ap.add_argument("--adam-tensors", type=int, default=16)
    ap.add_argument("--adam-steps", type=int, default=3, help="steps per optimizer per round (median)")
    ap.add_argument("--io-size", default="1GiB")
    ap.add_argument("--bs", type=int, default=1 << 20)
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--io-threads", type=int, default=1)
    ap.add_argument("--step-configs", default="zero3-nvme,zero2-cpu")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the median")
    ap.add_argument("--port", type=int, default=29533)
    ap.add_argument("--child-timeout", type=int, default=900, help="seconds for one step run")
    ap.add_argument("--try-all-deepspeed", action="store_true",
                    help="also run the DeepSpeed rows known not to work here (DS_CANNOT)")
    ap.add_argument("--framework", choices=["strata", "deepspeed"], default="strata")
    ap.add_argument("--config", default="zero2-cpu")
    a = ap.parse_args()
    a.strata = a.strata or str(Path(a.build) / "src" / "strata")
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # DeepSpeed's JIT ops where bench/deepspeed-venv.sh built them (else torch builds
    # them again, minutes, into ~/.cache).
    ext = Path(sys.prefix) / "torch_extensions"
    if "TORCH_EXTENSIONS_DIR" not in os.environ and ext.is_dir():
        os.environ["TORCH_EXTENSIONS_DIR"] = str(ext)
    import_strata(Path(a.build))
    os.makedirs(a.swap, exist_ok=True)
    probe = os.path.join(a.swap, f".torch-peers-probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600))
        os.unlink(probe)
    except OSError as e:
        die(f"--swap {a.swap}: O_DIRECT does not work there ({e}); give a folder on a disk")
    if a.what == "step-child":
        step_child(a)
        return
    if not os.access(a.strata, os.X_OK):
        die(f"no strata binary at {a.strata} (build it: scripts/build.sh)")
    if a.no_deepspeed:
        ds, ds_reason = None, "left out (--no-deepspeed)"
    else:
        ds, ds_reason = deepspeed_or_reason()
        if ds is None:
            print(f"torch-peers: DeepSpeed is not available: {ds_reason}", file=sys.stderr)
    import torch

    out = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True).stdout.strip(),
           "torch": torch.__version__, "deepspeed": getattr(ds, "__version__", None), "threads": a.threads,
           "loadavg_before": os.getloadavg()}
    for what, fn in (("adam", bench_adam), ("io", bench_io), ("step", bench_step)):
        if a.what in (what, "all"):
            out[what] = fn(a, ds, ds_reason)
    out["loadavg_after"] = os.getloadavg()
    text = json.dumps(out, indent=1)
    print(text)
    if a.json:
        Path(a.json).write_text(text + "\n")
    if ds is None and not a.no_deepspeed:
        print(f"torch-peers: the DeepSpeed rows did not run: {ds_reason}", file=sys.stderr)
        sys.exit(2)
    missing = [k for k in out.get("step", {}).get("skipped", {}) if k.startswith("deepspeed ")]
    if missing and not a.no_deepspeed:
        print(f"torch-peers: DeepSpeed rows not run: {', '.join(missing)}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        die("see the traceback above")
