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
        state and the parameters on NVMe (zero3-nvme), the same with each engine's one key
        that makes it keep everything on NVMe at this model size (zero3-nvme-all; the keys
        are in bench/torch_peers/step.py and in the JSON), and ZeRO-2 with the optimizer on
        the CPU; world size 1 (DeepSpeed: torch.distributed over gloo on its CPU
        accelerator). Each run is a child process; the figure is the median step after the
        warm-up steps, beside each step's disk bytes (/proc/self/io).

Every benchmark runs --rounds rounds with the runners in rotating order (the disk drifts)
and reports each runner's median and best over the rounds, and the ratio of the medians.

  bench/deepspeed-venv.sh                # once: /tmp/ds-venv with DeepSpeed and its ops
  /tmp/ds-venv/bin/python bench/torch-peers.py all --swap /work/strata-swap
  bench/deepspeed-torch2-venv.sh         # once: /tmp/ds2-venv, torch 2.11 and DeepSpeed 0.19.8
  /tmp/ds2-venv/bin/python bench/torch-peers.py step --swap /work/strata-swap

/tmp/ds-venv (Debian's torch 1.13, DeepSpeed 0.15.4) cannot run the ZeRO-3 NVMe rows
(DeepSpeed's swappers there want pinned CPU buffers); /tmp/ds2-venv can.

Run it with a Python that can import strata (this script puts build/python on the path)
and, for the DeepSpeed columns, deepspeed: the venv of bench/deepspeed-venv.sh. Without
DeepSpeed, the DeepSpeed rows say why they did not run and the script exits 2 at the end
(--no-deepspeed: leave them out and exit 0). Any other failure exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

from torch_peers.adam import bench_adam
from torch_peers.common import ROOT, deepspeed_or_reason, die, import_strata
from torch_peers.io import bench_io
from torch_peers.step import bench_step, step_child


def parser() -> argparse.ArgumentParser:
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
    ap.add_argument("--step-configs", default="zero3-nvme,zero3-nvme-all,zero2-cpu")
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
                    help="also run the DeepSpeed rows known not to work with this DeepSpeed "
                         "(ds_cannot in bench/torch_peers/step.py)")
    ap.add_argument("--framework", choices=["strata", "deepspeed"], default="strata")
    ap.add_argument("--config", default="zero2-cpu")
    return ap


def check_swap(swap: str) -> None:
    os.makedirs(swap, exist_ok=True)
    probe = os.path.join(swap, f".torch-peers-probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600))
        os.unlink(probe)
    except OSError as e:
        die(f"--swap {swap}: O_DIRECT does not work there ({e}); give a folder on a disk")


def report(a, out: dict, ds, ds_reason) -> None:
    """Print (and with --json write) the results; exit 2 when a DeepSpeed row did not run."""
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


def main() -> None:
    a = parser().parse_args()
    a.strata = a.strata or str(Path(a.build) / "src" / "strata")
    os.environ["OMP_NUM_THREADS"] = str(a.threads)
    # DeepSpeed's JIT ops where bench/deepspeed-venv.sh built them (else torch builds
    # them again, minutes, into ~/.cache).
    ext = Path(sys.prefix) / "torch_extensions"
    if "TORCH_EXTENSIONS_DIR" not in os.environ and ext.is_dir():
        os.environ["TORCH_EXTENSIONS_DIR"] = str(ext)
    import_strata(Path(a.build))
    check_swap(a.swap)
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
    report(a, out, ds, ds_reason)


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        die("see the traceback above")
