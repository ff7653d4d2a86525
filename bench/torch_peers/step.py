"""step: one small GPT-style model's step time under strata.torch and under DeepSpeed
ZeRO with the same config, each run in a child process."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import ENTRY, die, gloo_shims, rotate

# Rows DeepSpeed cannot run here, and why (docs/benchmarks.md has the details); they are
# reported as not run, and the script exits 2, unless --try-all-deepspeed. Which rows
# depends on the DeepSpeed in use: ds_cannot() below.
DS_OLD_SWAPPERS = (
    "DeepSpeed {v}'s ZeRO-3 NVMe swappers on its CPU accelerator assert that their buffers are "
    "pinned by asking the accelerator (AsyncTensorSwapper.add_buffers: get_accelerator().is_pinned), "
    "and no CPU tensor is pinned without CUDA; telling it that CPU tensors count as pinned made the "
    "run hang under torch 1.13 (no step in 6 minutes). DeepSpeed 0.19 asks its aio handle instead, "
    "which counts its own locked buffers: bench/deepspeed-torch2-venv.sh")

STEP_CONFIGS = {
    "zero3-nvme": {"zero_optimization": {"stage": 3,
                                         "offload_optimizer": {"device": "nvme", "nvme_path": None},
                                         "offload_param": {"device": "nvme", "nvme_path": None}}},
    "zero2-cpu": {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
}
STEP_CONFIGS["zero3-nvme-all"] = STEP_CONFIGS["zero3-nvme"]

# DeepSpeed-only keys merged into a row's config for DeepSpeed alone (strata refuses them
# by name, docs/config.md). "zero3-nvme-all": DeepSpeed's offload_param.max_in_cpu
# (default 1e9 elements) keeps every parameter of a model this size in host memory for the
# whole run even with offload_param on NVMe ("Swapping in ... permanently to CPU"); at 0 the
# parameters its swapper can take (>= aio block_size bytes) stay on NVMe and are read in
# for each use, as strata's stage 3 reads its shards from NVMe. Its swap-in buffer pool
# (offload_param.buffer_count 5 of buffer_size 1e8 elements by default) then runs dry under
# its prefetcher ("AssertionError: Not enough buffers 0 for swapping 1" in the first
# forward), so the pool is sized by ds_extra() to the model: one buffer per swappable
# tensor, each as large as the largest.
DS_EXTRA = {"zero3-nvme-all": {"offload_param": {"max_in_cpu": 0}}}
# strata-only keys (the "strata" section, which DeepSpeed does not read) for strata alone.
# "zero3-nvme-all": strata.optimizer_resident (auto by default) keeps as many chunks' master,
# m and v in pinned host memory as its host budget holds, which at this model size is all of
# them, so its step reads and writes no disk (bytes_nvme_read/written 0); at 0 every chunk's
# optimizer state is on NVMe, and stage 3 reads the parameter shards from that master.
STRATA_EXTRA = {"zero3-nvme-all": {"strata": {"optimizer_resident": 0}}}


def ds_extra(a, name: str, model) -> dict:
    """DS_EXTRA[name] with the swap-in pool sized to the model (see above)."""
    extra = json.loads(json.dumps(DS_EXTRA.get(name, {})))
    if "offload_param" in extra:
        big = [p.numel() for p in model.parameters() if p.numel() * p.element_size() >= a.bs]
        extra["offload_param"].update({"buffer_count": max(len(big), 1), "buffer_size": max(big, default=1)})
    return extra


def ds_cannot(deepspeed) -> dict:
    """{config: why DeepSpeed cannot run it here} for this DeepSpeed."""
    import inspect

    from deepspeed.runtime.swap_tensor.async_swapper import AsyncTensorSwapper

    if "get_accelerator().is_pinned" in inspect.getsource(AsyncTensorSwapper.add_buffers):
        why = DS_OLD_SWAPPERS.format(v=deepspeed.__version__)
        return {c: why for c in STEP_CONFIGS if c.startswith("zero3-nvme")}
    return {}


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


def proc_io() -> dict:
    with open("/proc/self/io") as f:
        kv = dict(line.split(": ") for line in f.read().splitlines())
    return {"read_bytes": int(kv["read_bytes"]), "write_bytes": int(kv["write_bytes"])}


def ds_placement(engine, model, shims) -> dict:
    """What DeepSpeed did with the config: where each parameter's partition lives after
    initialize, and the parameter swapper's dtype, which must be the model's (fp32)."""
    import torch

    out = {"gloo_shims": shims}
    params = list(engine.module.parameters())
    if not hasattr(params[0], "ds_tensor"):
        return out
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum

    nvme = [p for p in params if getattr(p.ds_tensor, "final_location", None) == OffloadDeviceEnum.nvme]
    out["ds_params_on_nvme"] = {"tensors": len(nvme), "elements": sum(p.ds_numel for p in nvme),
                                "of_tensors": len(params), "of_elements": sum(p.ds_numel for p in params)}
    swapper = next((p.nvme_swapper for p in params if getattr(p, "nvme_swapper", None) is not None), None)
    if swapper is not None:
        out["ds_param_swapper_dtype"] = str(swapper.dtype)
        if swapper.dtype != torch.float32:
            # DeepSpeed's Init._set_dtype picks bf16 on its CPU accelerator for an fp32
            # model (an operator-precedence slip: bench/deepspeed-torch2-venv.sh patches it);
            # unpatched, parameters >= 512K elements are rounded to bf16 once at init.
            die(f"DeepSpeed's parameter swapper is {swapper.dtype}, not the model's float32: "
                "its Init._set_dtype is not patched (run bench/deepspeed-torch2-venv.sh)")
    return out


def step_child(a) -> None:
    """One run: prints {"step_s": [...], "loss": [...], "params": N} as JSON on stdout."""
    import torch

    torch.set_num_threads(a.threads)
    model = make_model(a)
    nparams = sum(p.numel() for p in model.parameters())
    nvme = tempfile.mkdtemp(prefix=f"torch-peers-{a.framework}-", dir=a.swap)
    cfg = step_config(a, a.config, nvme)
    extra = {}
    if a.framework == "strata":
        import strata.torch as st

        cfg.update(json.loads(json.dumps(STRATA_EXTRA.get(a.config, {}))))
        engine = st.initialize(model, cfg)
    else:
        import deepspeed

        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(a.port), "RANK": "0",
                           "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        deepspeed.init_distributed(dist_backend="gloo")
        shims = gloo_shims(deepspeed)
        for k, v in ds_extra(a, a.config, model).items():
            cfg["zero_optimization"][k].update(v)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        extra.update(ds_placement(engine, model, shims))
    g = torch.Generator().manual_seed(1)
    times, losses, disk, reports = [], [], [], []
    for _ in range(a.steps):
        x = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        y = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        io0 = proc_io()
        t0 = time.perf_counter()
        logits = engine(x)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, a.vocab).float(), y.reshape(-1))
        engine.backward(loss)
        report = engine.step()
        times.append(time.perf_counter() - t0)
        io1 = proc_io()
        disk.append({k: io1[k] - io0[k] for k in io0})
        if isinstance(report, dict):
            reports.append({k: v for k, v in report.items() if k.startswith("bytes_nvme")})
        losses.append(float(loss))
    # Bytes this process moved to and from the block layer in each step (/proc/self/io,
    # which counts O_DIRECT reads and writes of every thread, io_uring's workers included):
    # what each engine did on the disk, whatever its config says.
    extra["disk_bytes_per_step"] = disk
    if reports:
        extra["strata_step_reports"] = reports
    print(json.dumps({"step_s": times, "loss": losses, "params": nparams, **extra}))
    sys.stdout.flush()
    os._exit(0)  # skip both engines' teardown (their NVMe files are removed by the parent)


def bench_step(a, ds, ds_reason) -> dict:
    frameworks = ["strata"] + (["deepspeed"] if ds is not None else [])
    rows, skipped, nparams = {}, {}, None
    if ds is None:
        skipped["deepspeed"] = ds_reason
    cannot = ds_cannot(ds) if ds is not None else {}
    for cfg in a.step_configs.split(","):
        if cfg not in STEP_CONFIGS:
            die(f"unknown step config {cfg} ({', '.join(STEP_CONFIGS)})")
        fws = list(frameworks)
        if "deepspeed" in fws and cfg in cannot and not a.try_all_deepspeed:
            fws.remove("deepspeed")
            skipped[f"deepspeed {cfg}"] = cannot[cfg]
            print(f"torch-peers: deepspeed {cfg} not run: {cannot[cfg]}", file=sys.stderr)
        per = {f: [] for f in fws}
        losses, placement, disk = {}, {}, {f: [] for f in fws}
        for r in range(a.rounds):
            for fw in rotate(fws, r):
                cmd = [sys.executable, ENTRY, "step-child", "--framework", fw, "--config", cfg]
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
                placement[fw] = {k: v for k, v in j.items() if k not in ("step_s", "loss", "params")}
                d = j["disk_bytes_per_step"][a.warmup:]
                io_mib = {k: statistics.median(x[k] for x in d) / 2**20 for k in d[0]}
                disk[fw].append(io_mib)
                print(f"step {cfg} round {r + 1}/{a.rounds} {fw}: median {per[fw][-1]:.3f} s/step "
                      f"(steps {a.warmup + 1}-{a.steps}), disk MiB/step read {io_mib['read_bytes']:.1f} write "
                      f"{io_mib['write_bytes']:.1f}, losses {['%.4f' % x for x in j['loss'][:3]]}...",
                      file=sys.stderr)
        rows[cfg] = {"config": step_config(a, cfg, "<nvme_path>"), "deepspeed_only": ds_extra(a, cfg, make_model(a)),
                     "strata_only": STRATA_EXTRA.get(cfg, {}),
                     "step_s": {f: {"median": statistics.median(v), "best": min(v), "all": v}
                                for f, v in per.items()},
                     "disk_mib_per_step": disk, "losses": losses, "placement": placement}
    return {"params": nparams, "rounds": a.rounds, "rows": rows, "skipped": skipped}


STEP_ARGS = {"threads", "vocab", "width", "layers", "heads", "seq", "batch", "steps", "bs", "qd", "io_threads",
             "swap", "build", "port"}


def child_env(a) -> dict:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(a.threads)
    env["PYTHONPATH"] = str(Path(a.build) / "python") + os.pathsep + env.get("PYTHONPATH", "")
    return env
