"""scripts/plot: draws JSON-lines training logs, and refuses bad ones by file and line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

PLOT = Path(__file__).resolve().parents[2] / "scripts" / "plot"
pytest.importorskip("matplotlib", reason="Debian's python3-matplotlib (scripts/setup.sh installs it)")


def run(*args):
    return subprocess.run([sys.executable, str(PLOT), *map(str, args)], capture_output=True, text=True, timeout=120)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


GOOD = (
    '{"step": 0, "val_loss": 5.5}\n'
    '{"step": 1, "loss": 5.4, "lr": 0.001, "tokens_per_s": 1000.0, "seconds": 0.5, "grad_norm": 1.0}\n'
    '{"step": 2, "loss": 5.0, "lr": 0.001, "tokens_per_s": 1000.0, "seconds": 0.5}\n'
    '{"step": 2, "val_loss": 4.9}\n'
    '{"step": 2, "sample": "text"}\n'
)


def test_plots_several_logs(tmp_path):
    a = write(tmp_path / "strata.jsonl", GOOD)
    (tmp_path / "sub").mkdir()
    b = write(tmp_path / "sub" / "strata.jsonl", GOOD)  # same name: told apart by folder
    c = write(tmp_path / "train_only.jsonl", '{"step": 1, "loss": 3}\n')
    out = tmp_path / "loss.png"
    r = run(a, b, c, "--out", out)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty log"),
        ("\n\n", "empty log"),
        ('{"step": 1, "loss": 5}\n{"step": 2, "loss": \n', ":2: not JSON"),
        ('{"step": 1, "loss": 5}\n[1, 2]\n', ":2: a JSON list"),
        ('{"loss": 5}\n', ':1: "step" is null'),
        ('{"step": 1, "loss": "high"}\n', ':1: "loss" is "high"'),
        ('{"step": 1, "sample": "abc"}\n', 'no "loss" or "val_loss"'),
    ],
)
def test_refuses_a_bad_log_by_file_and_line(tmp_path, text, message):
    log = write(tmp_path / "bad.jsonl", text)
    good = write(tmp_path / "good.jsonl", GOOD)
    out = tmp_path / "loss.png"
    r = run(good, log, "--out", out)
    assert r.returncode == 1
    assert str(log) in r.stderr and message in r.stderr, r.stderr
    assert not out.exists()


def test_names_a_missing_log_and_needs_out(tmp_path):
    r = run(tmp_path / "none.jsonl", "--out", tmp_path / "x.png")
    assert r.returncode == 1 and f"{tmp_path / 'none.jsonl'}: no such file" in r.stderr
    assert run(tmp_path / "none.jsonl").returncode == 2  # argparse: --out is required
