"""io: strata.io.aio_handle against DeepNVMe's aio_handle, beside fio through
`strata bench io`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import die, nbytes, rotate, summary

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
