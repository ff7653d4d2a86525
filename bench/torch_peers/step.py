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
