"""strata.io: O_DIRECT round trips of pinned tensors, asynchronous ops, and errors."""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path

import pytest
import torch

import strata.io as sio


def _filled(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    t = sio.pinned_empty(shape, dtype)
    t.copy_(torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype))
    return t


def test_pinned_empty_is_aligned_and_returned_when_freed() -> None:
    before = sio.pinned_stats()["live_blocks"]
    t = sio.pinned_empty((3, 5), torch.bfloat16)
    assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.is_contiguous()
    assert t.data_ptr() % 4096 == 0
    assert sio.pinned_stats()["live_blocks"] == before + 1
    big = sio.pinned_empty(100 << 20 >> 2)  # 100 MiB: more than an arena's default size
    assert big.data_ptr() % 4096 == 0
    del t, big
    gc.collect()
    assert sio.pinned_stats()["live_blocks"] == before
    assert sio.pinned_empty(0).numel() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
@pytest.mark.parametrize("numel", [1024, 1000, 3 << 20])
def test_sync_round_trip(io_dir: Path, dtype: torch.dtype, numel: int) -> None:
    h = sio.aio_handle()
    src = _filled((numel,), dtype)
    path = io_dir / "t.bin"
    assert h.pwrite(src, path) == 1
    # A size that is not a multiple of 4096 bytes goes with its block's padding.
    assert os.path.getsize(path) == -(-numel * src.element_size() // 4096) * 4096
    dst = sio.pinned_empty((numel,), dtype)
    assert h.pread(dst, str(path)) == 1
    assert torch.equal(src, dst)


def test_async_ops_at_offsets_and_wait_count(io_dir: Path) -> None:
    h = sio.aio_handle(block_size=64 << 10, queue_depth=8)
    assert (h.get_block_size(), h.get_queue_depth(), h.get_intra_op_parallelism()) == (
        64 << 10,
        8,
        1,
    )
    chunks = [_filled((256 << 10,), torch.float32, seed=i) for i in range(4)]  # 1 MiB each
    one = io_dir / "one.bin"
    for i, c in enumerate(chunks):
        assert h.async_pwrite(c, one, offset=i << 20) == 0
    assert h.async_pwrite(chunks[0], io_dir / "other.bin") == 0
    assert h.pending == 5
    assert h.wait() == 5 and h.pending == 0
    back = [sio.pinned_empty((256 << 10,)) for _ in chunks]
    for i, b in reversed(list(enumerate(back))):
        h.async_pread(b, one, file_offset=i << 20)
    assert h.wait() == 4
    for c, b in zip(chunks, back):
        assert torch.equal(c, b)
    assert h.wait() == 0


def test_psync_backend_and_small_blocks(io_dir: Path) -> None:
    h = sio.aio_handle(block_size=4096, queue_depth=4, intra_op_parallelism=2, backend="psync")
    assert h.backend == "psync"
    src = _filled((1 << 18,), torch.float32)
    h.pwrite(src, io_dir / "p.bin", 8192)
    dst = sio.pinned_empty((1 << 18,))
    h.pread(dst, io_dir / "p.bin", 8192)
    assert torch.equal(src, dst)


def test_missing_dir_names_file_offset_and_errno(io_dir: Path) -> None:
    h = sio.aio_handle()
    path = io_dir / "no" / "such" / "dir.bin"
    with pytest.raises(FileNotFoundError) as e:
        h.pwrite(_filled((1024,), torch.float32), path, 4096)
    assert e.value.errno == errno.ENOENT and e.value.filename == str(path)
    assert "offset 4096" in str(e.value) and str(path) in str(e.value)
    with pytest.raises(FileNotFoundError):
        h.pread(sio.pinned_empty(1024), io_dir / "missing.bin")
    assert h.pending == 0


def test_alignment_and_buffer_errors(io_dir: Path) -> None:
    h = sio.aio_handle()
    t = _filled((4096,), torch.float32)
    path = io_dir / "a.bin"
    with pytest.raises(ValueError, match="offset 100.*4096|4096.*offset"):
        h.pwrite(t, path, 100)
    assert not path.exists()  # refused before the file is opened
    with pytest.raises(ValueError, match="address"):
        h.pwrite(t[1:1025], path)  # starts 4 bytes into the block
    with pytest.raises(ValueError, match="length"):
        h.pwrite(t[:1000], path)  # 4000 bytes in the middle of a block: no padding to take
    with pytest.raises(ValueError, match="not in pinned memory"):
        h.pwrite(torch.zeros(1024), path)
    with pytest.raises(ValueError, match="not contiguous"):
        h.pwrite(t.view(64, 64).t(), path)
    with pytest.raises(ValueError, match="empty"):
        h.pwrite(t[:0], path)
    with pytest.raises(ValueError, match="meta"):
        h.pwrite(torch.zeros(1024, device="meta"), path)
    with pytest.raises(TypeError):
        h.pwrite(b"bytes", path)
    with pytest.raises(ValueError, match="block_size"):
        sio.aio_handle(block_size=1000)
    with pytest.raises(ValueError, match="backend"):
        sio.aio_handle(backend="libaio")
    assert h.pending == 0
    h.pwrite(t, path)  # the handle still works


def test_read_past_end_of_file(io_dir: Path) -> None:
    h = sio.aio_handle()
    path = io_dir / "short.bin"
    h.pwrite(_filled((1024,), torch.float32), path)
    with pytest.raises(EOFError, match=r"offset 4096 .*holds only 4096 bytes"):
        h.pread(sio.pinned_empty(1024), path, 4096)


@pytest.mark.parametrize("err,op", [(errno.EIO, 0), (errno.ENOSPC, 1)])
def test_injected_errors_are_raised_after_all_ops_complete(
    io_dir: Path, err: int, op: int
) -> None:
    h = sio.aio_handle(block_size=4096, _faults=[(err, op, 8192, 1)])
    src = _filled((8192,), torch.float32)  # 32 KiB: 8 pieces, the third fails
    path = io_dir / "f.bin"
    other = io_dir / "g.bin"
    if op == 0:
        h.pwrite(src, path)
        h.async_pread(sio.pinned_empty(8192), path)
    else:
        h.async_pwrite(src, path)
    # Past the faulted offset, so only `path` can fail whichever op completes first.
    h.async_pwrite(src, other, 32768)
    with pytest.raises(OSError) as e:
        h.wait()
    assert e.value.errno == err and e.value.filename == str(path)
    assert "offset 8192" in str(e.value) and os.strerror(err) in str(e.value)
    assert h.pending == 0
    back = sio.pinned_empty(8192)
    h.pread(back, other, 32768)  # the other op completed; the fault fired once
    assert torch.equal(back, src)


def test_stats_count_pieces_and_registered_buffers(io_dir: Path) -> None:
    h = sio.aio_handle(block_size=64 << 10)
    t = _filled((1 << 18,), torch.float32)  # 1 MiB: 16 pieces each way
    h.pwrite(t, io_dir / "s.bin")
    h.pread(t, io_dir / "s.bin")
    stats = h.stats()
    assert stats["requests"] == 2 and stats["pieces"] == 32
    if h.backend == "io_uring" and os.geteuid() == 0:
        # The arenas are registered as io_uring fixed buffers (root: no memlock limit).
        assert stats["fixed_pieces"] == 32
