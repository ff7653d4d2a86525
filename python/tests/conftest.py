"""Shared fixtures: a scratch folder where O_DIRECT works."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterator

import pytest


def _supports_o_direct(folder: Path) -> bool:
    probe = folder / f".o_direct_probe_{uuid.uuid4().hex}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


@pytest.fixture
def io_dir() -> Iterator[Path]:
    """A fresh folder on a file system with O_DIRECT (STRATA_TEST_IO_DIR, else the temp dir)."""
    base = Path(os.environ.get("STRATA_TEST_IO_DIR") or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    if not _supports_o_direct(base):
        pytest.skip(
            f"{base} does not support O_DIRECT (tmpfs?): set STRATA_TEST_IO_DIR to a disk folder"
        )
    with tempfile.TemporaryDirectory(dir=base, prefix="strata-io-") as d:
        yield Path(d)
