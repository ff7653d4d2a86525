"""scripts/gpt_torch_peer.py replicates strata's GPT run: the hashes of the init and of the
batches bit for bit, and the losses of a tiny run to fp32 rounding.

The expected values were printed by strata's C++ (model::SampleStart, model::InitGptTensor,
and model::Gpt + model::FillBatch + AdamStep on the token files written here); when the
C++ changes on purpose, regenerate them the same way and update the peer with it.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
peer = pytest.importorskip("gpt_torch_peer")  # needs torch (python/.venv has Debian's)


def test_sample_start_matches_the_cpp():
    # model::SampleStart(seed, i, file_size, seq) for i = 0, 1, 2, ...
    cases = [
        (1, 1000, 16, [952, 630, 661]),
        (42, 1000, 16, [648, 821, 644, 892]),
        (2**64 - 1, 2447840, 128, [1229580, 1851763, 1786142]),
        (2**64 - 1, 123457, 1024, [3024, 47560, 16619]),
    ]
    for seed, size, seq, want in cases:
        assert peer.sample_starts(seed, 0, len(want), size, seq).tolist() == want
        assert [peer.sample_start(seed, i, size, seq) for i in range(len(want))] == want


def test_init_matches_the_cpp_bit_for_bit():
    # GptSpec{vocab 64, block 16, 2 layers, 2 heads, n_embd 32, untied, seed 42}.
    specs = peer.tensor_specs(64, 16, 2, 32, tied=False)
    tensors = [peer.init_tensor(42, t, kind, shape, 2) for t, (_, shape, kind) in enumerate(specs)]
    flat = np.concatenate([t.ravel() for t in tensors])
    assert flat.size == 30080
    assert [float(x).hex() for x in tensors[0].ravel()[:3]] == [
        "0x1.cfe3340000000p-8", "-0x1.baddc60000000p-9", "0x1.210b860000000p-9"]
    assert specs[6][0] == "h0.attn.proj.weight"  # N(0, 0.02 / sqrt(2 n_layer))
    assert [float(x).hex() for x in tensors[6].ravel()[:3]] == [
        "-0x1.0e7c600000000p-8", "-0x1.1b1fc60000000p-8", "-0x1.2e86f80000000p-7"]
    assert specs[-1][0] == "lm_head.weight"
    assert [float(x).hex() for x in flat[-3:]] == [
        "0x1.2bdb320000000p-6", "-0x1.e2a12e0000000p-11", "-0x1.79eb0e0000000p-7"]
    assert (tensors[2] == 1).all() and (tensors[3] == 0).all()  # h0.ln1 weight, bias


def fnv1a64(b: bytes) -> int:
    h = 0xCBF29CE484222325
    for x in b:
        h = ((h ^ x) * 0x100000001B3) & ((1 << 64) - 1)
    return h


def write_tokens(path: Path, tokens) -> None:
    head = b"STRTOKN\0" + struct.pack("<IIQQ", 1, 2, 256, len(tokens)) + bytes(24)
    path.write_bytes(head + struct.pack("<Q", fnv1a64(head)) + struct.pack(f"<{len(tokens)}H", *tokens))


def test_a_tiny_run_matches_strata_losses(tmp_path):
    text = b"".join(b"%d little pigs went to market, %d stayed home. " % (i % 10, i * 7 % 10) for i in range(200))
    write_tokens(tmp_path / "train.tokens", list(text[:8000]))
    write_tokens(tmp_path / "val.tokens", list(text[8000:]))
    log = tmp_path / "peer.jsonl"
    cmd = [sys.executable, str(SCRIPTS / "gpt_torch_peer.py"), "--train", "--data", str(tmp_path),
           "--n-layer", "2", "--n-head", "2", "--n-embd", "32", "--seq", "16", "--micro-batch", "3",
           "--steps", "3", "--lr", "1e-2", "--seed", "7", "--eval-every", "0", "--eval-batches", "2",
           "--threads", "1", "--log", str(log)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    # strata (model::Gpt, FillBatch, AdamW step) with init seed 7 and data seed 8.
    want = [(0, "val_loss", 5.53904736), (1, "loss", 5.50814875), (2, "loss", 5.11930191),
            (3, "loss", 4.68866592), (3, "val_loss", 4.21954168)]
    got = [(x["step"], k, x[k]) for x in lines for k in ("loss", "val_loss") if k in x]
    assert [g[:2] for g in got] == [w[:2] for w in want]
    for (_, _, g), (_, _, w) in zip(got, want):
        assert g == pytest.approx(w, rel=1e-5)
    step = lines[1]
    assert set(step) >= {"step", "loss", "lr", "tokens_per_s", "seconds"} and step["lr"] == 1e-2


# Each schedule's rates for 12 steps, warmups of 4 (log and linear) and totals of 9, so
# that the warmup, the decay or cosine and the hold after the total all show.
SCHEDULES = [
    {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001, "warmup_max_lr": 0.01, "warmup_num_steps": 4}},
    {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}},
    {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.02, "warmup_num_steps": 4,
                                         "total_num_steps": 9, "warmup_type": "linear"}},
    {"type": "WarmupCosineLR", "params": {"total_num_steps": 9, "warmup_num_steps": 4,
                                          "warmup_min_ratio": 0.1, "cos_min_ratio": 0.05}},
]


def strata_binary() -> Path:
    path = Path(os.environ.get("STRATA_BINARY") or SCRIPTS.parent / "build/src/strata")
    if not path.exists():
        pytest.skip(f"no strata binary at {path}: build it (ctest sets STRATA_BINARY)")
    return path


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s["type"] + "-" + s["params"].get("warmup_type", "log"))
def test_the_peer_follows_strata_schedules_to_the_bit(tmp_path, schedule):
    text = bytes(range(32, 127)) * 60
    write_tokens(tmp_path / "train.tokens", list(text[:4500]))
    write_tokens(tmp_path / "val.tokens", list(text[4500:]))
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"scheduler": schedule}))
    log = tmp_path / "strata.jsonl"
    subprocess.run([str(strata_binary()), "train", "--data", str(tmp_path), "--config", str(config), "--n-layer", "1",
                    "--n-head", "2", "--n-embd", "16", "--seq", "16", "--micro-batch", "2", "--steps", "12",
                    "--lr", "0.005", "--eval-every", "0", "--eval-batches", "1", "--sample", "0",
                    "--nvme-path", str(tmp_path / "swap"), "--log", str(log)],
                   check=True, capture_output=True, timeout=300)
    want = [x["lr"] for x in map(json.loads, log.read_text().splitlines()) if "lr" in x]
    assert len(want) == 12
    got = [peer.ds_lr_schedule.rate_at(schedule, s, 0.005) for s in range(12)]
    assert got == want
    assert len(set(want)) >= 4, "the schedule must move"


def test_the_peer_refuses_a_schedule_it_cannot_follow(tmp_path):
    for bad, says in [({"type": "OneCycle", "params": {}}, "the peer follows WarmupLR"),
                      ({"type": "WarmupLR", "params": {"warmup_steps": 3}}, "unknown key(s) ['warmup_steps']"),
                      ({"type": "WarmupDecayLR", "params": {}}, "needs scheduler.params.total_num_steps")]:
        with pytest.raises(ValueError, match=re.escape(says)):
            peer.ds_lr_schedule.check(bad)
