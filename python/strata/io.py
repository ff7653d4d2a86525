"""strata.io: asynchronous O_DIRECT reads and writes of pinned torch tensors.

An ``aio_handle`` has the shape of DeepNVMe's (``deepspeed.ops.op_builder.AsyncIOBuilder``):
reads and writes of whole tensors to files at a byte offset, synchronous, or
asynchronous and collected by ``wait()``. Underneath is strata's IoEngine: io_uring
(batched submission, registered files and buffers), or a pread/pwrite thread pool where
the kernel refuses io_uring.

O_DIRECT needs page-locked, 4 KiB aligned buffers: tensors from ``pinned_empty`` (or
torch's own pinned memory). The file offset must be a multiple of 4096. A
``pinned_empty`` tensor whose size is not a multiple of 4096 bytes is transferred with
its allocation's padding up to the next 4096 bytes, so the file holds that rounded size.

Errors are Python exceptions naming the file, the offset and the errno: OSError and its
subclasses (FileNotFoundError, ...) for the system's refusals, ValueError for bad
arguments (alignment, a tensor that is not pinned or not contiguous), EOFError for a
read past the end of the file.
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Optional, Sequence, Union

import torch

from strata import _strata

__all__ = ["aio_handle", "pinned_empty", "pinned_stats"]

Shape = Union[int, Sequence[int], torch.Size]


def pinned_empty(shape: Shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialized CPU tensor on strata's pinned host arena, 4 KiB aligned.

    The memory returns to the arena when torch frees the tensor.
    """
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"strata.io.pinned_empty: negative dimension in shape {dims}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = _strata.pinned_bytes(math.prod(dims) * itemsize)
    return raw.view(dtype).view(dims)


def pinned_stats() -> dict[str, int]:
    """The pinned pool: arenas, their bytes, bytes allocated, live blocks."""
    return dict(_strata.pinned_stats())


class aio_handle:  # noqa: N801 -- DeepNVMe's class name, for a drop-in
    """A queue of O_DIRECT tensor reads and writes over strata's I/O engine.

    Args:
        block_size: largest piece submitted to the kernel, bytes (a multiple of 4096).
        queue_depth: pieces in flight per I/O thread.
        single_submit, overlap_events: DeepNVMe's libaio switches, accepted for
            compatibility and without effect (io_uring batches and overlaps anyway).
        intra_op_parallelism: I/O threads, one io_uring ring each.
        backend: "auto" (io_uring, else psync), "io_uring" or "psync".

    Not thread-safe: use a handle from one thread at a time.
    """

    def __init__(
        self,
        block_size: int = 1 << 20,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
        *,
        backend: str = "auto",
        _faults: Iterable[tuple[int, int, int, int]] = (),
    ) -> None:
        # _faults (tests only): injected failures, tuples of
        # (errno, op: 0 read / 1 write / -1 any, file offset or -1 for any, times).
        self._handle = _strata.IoHandle(
            block_size, queue_depth, intra_op_parallelism, backend, list(_faults)
        )
        self._single_submit = single_submit
        self._overlap_events = overlap_events

    def get_block_size(self) -> int:
        return self._handle.block_size

    def get_queue_depth(self) -> int:
        return self._handle.queue_depth

    def get_single_submit(self) -> bool:
        return self._single_submit

    def get_overlap_events(self) -> bool:
        return self._overlap_events

    def get_intra_op_parallelism(self) -> int:
        return self._handle.threads

    @property
    def backend(self) -> str:
        """ "io_uring" or "psync"."""
        return self._handle.backend

    @property
    def pending(self) -> int:
        """Ops submitted and not yet collected by wait()."""
        return self._handle.pending

    def async_pread(
        self,
        tensor: torch.Tensor,
        path: str,
        offset: int = 0,
        *,
        file_offset: Optional[int] = None,
    ) -> int:
        """Queues a read of the file at ``offset`` into ``tensor``; returns 0. See wait()."""
        self._submit(False, tensor, path, offset if file_offset is None else file_offset)
        return 0

    def async_pwrite(
        self,
        tensor: torch.Tensor,
        path: str,
        offset: int = 0,
        *,
        file_offset: Optional[int] = None,
    ) -> int:
        """Queues a write of ``tensor`` to the file (made if missing) at ``offset``; returns 0."""
        self._submit(True, tensor, path, offset if file_offset is None else file_offset)
        return 0

    def pread(
        self,
        tensor: torch.Tensor,
        path: str,
        offset: int = 0,
        *,
        file_offset: Optional[int] = None,
    ) -> int:
        """Reads and waits; returns the number of ops completed (this one and any queued)."""
        self.async_pread(tensor, path, offset, file_offset=file_offset)
        return self.wait()

    def pwrite(
        self,
        tensor: torch.Tensor,
        path: str,
        offset: int = 0,
        *,
        file_offset: Optional[int] = None,
    ) -> int:
        """Writes and waits; returns the number of ops completed (this one and any queued)."""
        self.async_pwrite(tensor, path, offset, file_offset=file_offset)
        return self.wait()

    sync_pread = pread
    sync_pwrite = pwrite

    def stats(self) -> dict[str, int]:
        """The engine's counters: requests, pieces, submits, retries, fixed_pieces (pieces
        that used io_uring registered buffers, i.e. strata's pinned arenas)."""
        return dict(self._handle.stats())

    def wait(self) -> int:
        """Waits for every queued op and returns how many completed.

        When any failed, all are still waited for, then the first failure is raised.
        """
        return self._handle.wait()

    def new_cpu_locked_tensor(self, num_elem: int, example_tensor: torch.Tensor) -> torch.Tensor:
        """DeepNVMe's allocator: a 1-D pinned tensor of ``example_tensor``'s dtype."""
        return pinned_empty((num_elem,), example_tensor.dtype)

    def free_cpu_locked_tensor(self, tensor: torch.Tensor) -> None:
        """For DeepNVMe compatibility: the memory returns when torch frees the tensor."""

    def _submit(self, write: bool, tensor: torch.Tensor, path: str, offset: int) -> None:
        op = "pwrite" if write else "pread"
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"strata.io: {op} takes a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != "cpu":
            raise ValueError(
                f"strata.io: {op} of {path} at offset {offset}: the tensor is on {tensor.device}; "
                "copy it to a strata.io.pinned_empty() tensor"
            )
        if offset < 0:
            raise ValueError(f"strata.io: {op} of {path}: negative offset {offset}")
        self._handle.submit(write, tensor.detach(), _is_pinned(tensor), os.fspath(path), offset)


def _is_pinned(tensor: torch.Tensor) -> bool:
    """torch's page-locked memory (cudaHostAlloc); False where torch has no CUDA."""
    try:
        return bool(tensor.is_pinned())
    except RuntimeError:
        return False
