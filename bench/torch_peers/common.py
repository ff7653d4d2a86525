"""Helpers shared by the torch-peers benchmarks: sizes, rounds, medians, DeepSpeed."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
# The step benchmark runs each step in a child process of the entry script.
ENTRY = str(ROOT / "bench" / "torch-peers.py")


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


def gloo_shims(deepspeed) -> list:
    """torch 1.13's gloo has no _allgather_base (DeepSpeed's all_gather_into_tensor, which
    ZeRO-3 calls without a fallback) nor reduce_scatter; torch 2's (2.11 checked) has both.
    Each collective is tried once on the process group DeepSpeed made; only one that
    raises is replaced, by a copy, which is exact at world size 1 (the only size this
    benchmark runs). Returns the names replaced (empty under torch 2)."""
    import torch
    import torch.distributed as dist

    if dist.get_world_size() != 1:
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

    replaced = []
    x, out = torch.arange(4.0), torch.empty(4)
    for attr, probe, shim in (
            ("all_gather_function", lambda: dist.all_gather_into_tensor(out, x), all_gather_into_tensor),
            ("reduce_scatter_function", lambda: dist.reduce_scatter_tensor(out, x), reduce_scatter_tensor)):
        try:
            probe()
            if not torch.equal(out, x):
                die(f"gloo {attr} probe at world size 1 gave {out.tolist()}, not {x.tolist()}")
        except (RuntimeError, AttributeError):
            setattr(cdb, attr, shim)
            replaced.append(attr)
    return replaced
