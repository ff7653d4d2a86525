"""The checkpoint calls of ``strata.torch.Engine`` (DeepSpeed's names): synchronous and
asynchronous saves, finishing a save in flight, ``latest``, and loading."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional, Union


class _Checkpoints:
    """The checkpoint calls of ``strata.torch.Engine`` (a base class of it)."""

    # Set by the engine.
    _engine: Any  # the extension's engine
    _micro: int
    _pending: Optional["_PendingSave"]
    global_steps: int
    rank: int

    def save_checkpoint(self, save_dir: Union[str, os.PathLike], tag: Any = None,
                        client_state: Dict[str, Any] = None, save_latest: bool = True, *,
                        async_save: bool = False) -> str:
        """Saves the training state into ``save_dir/tag`` (default ``global_step<N>``, N
        the steps taken) and returns that path; collective. ``client_state`` (a JSON
        dict) comes back from ``load_checkpoint``; ``save_latest`` writes the tag into
        ``save_dir/latest``, as DeepSpeed does. The format, its crash safety and its
        checksums are strata's (docs/checkpoints.md): the fp32 master, Adam's moments,
        the step counts, the loss scaler and the learning rate, from whichever tier holds
        them. Call it between ``step()`` and the next micro-batch.

        ``async_save=True`` returns once the engine knows where each block of the state
        is; a worker writes the files while training goes on (the optimizer waits only
        for blocks the save has not read yet), and the next ``step()`` that ends an
        accumulation window finishes it, as DeepSpeed's decoupled checkpoint engine
        commits in ``step()``. ``wait_checkpoint()``, ``load_checkpoint``, another
        ``save_checkpoint`` and ``close()`` finish it too. The state saved is the one of
        this call, whatever training does meanwhile. ``save_dir/tag`` and ``latest``
        appear only once the save is complete on every rank (a crash before leaves the
        previous checkpoint and ``latest`` as they were); an error of the background
        writes is raised where the save is finished, naming ``save_dir/tag``. It is a
        keyword of this call rather than a config key (DeepSpeed's
        ``checkpoint.writer.decoupled``) so that one engine can save both ways: behind
        training during the run, and synchronously at its end. A save still in flight is
        finished (its error raised, this one not started) before a new one starts, so at
        most one is pending and ``latest`` follows the order of the calls."""
        if self._micro:
            raise RuntimeError("strata.torch: save_checkpoint inside an accumulation window "
                               f"({self._micro} of {self._engine.gradient_accumulation_steps} micro-batches "
                               "done); call it after step()")
        try:
            state = json.dumps({"client_state": client_state or {}, "global_steps": self.global_steps})
        except TypeError as e:
            raise TypeError(f"strata.torch.save_checkpoint: client_state must be JSON: {e}") from None
        tag = f"global_step{self.global_steps}" if tag is None else str(tag)
        path = os.path.join(os.fspath(save_dir), tag)
        self.wait_checkpoint()
        if async_save:
            self._engine.start_checkpoint(path, state)
            self._pending = _PendingSave(path, os.fspath(save_dir), tag, save_latest)
            return path
        self._engine.save_checkpoint(path, state)
        if save_latest:
            self._write_latest(os.fspath(save_dir), tag)
        return path

    def wait_checkpoint(self) -> Optional[str]:
        """Finishes the save started with ``save_checkpoint(..., async_save=True)``, if one
        is in flight, and returns its path (None when there was none). Collective; call
        it between ``step()`` and the next micro-batch. A failed save raises (OSError,
        RuntimeError, ...) naming its directory, which is left as it was; training may go
        on."""
        if self._pending is None:
            return None
        if self._micro:
            raise RuntimeError(f"strata.torch: wait_checkpoint inside an accumulation window ({self._micro} of "
                               f"{self._engine.gradient_accumulation_steps} micro-batches done); call it after "
                               f"step() (which finishes the save into {self._pending.path} itself)")
        path = self._pending.path
        self._finish_save()
        return path

    @property
    def checkpoint_pending(self) -> Optional[str]:
        """The path of the save in flight (``async_save=True``) not yet finished, or None."""
        return None if self._pending is None else self._pending.path

    def _finish_save(self) -> Dict[str, float]:
        pending, self._pending = self._pending, None
        times = self._engine.finish_checkpoint()
        if pending.save_latest:
            self._write_latest(pending.save_dir, pending.tag)
        return times

    def _write_latest(self, save_dir: str, tag: str) -> None:
        if self.rank != 0:
            return
        latest = os.path.join(save_dir, "latest")
        with open(latest + ".tmp", "w", encoding="utf-8") as f:
            f.write(tag)
            f.flush()
            os.fsync(f.fileno())
        os.replace(latest + ".tmp", latest)

    def load_checkpoint(self, load_dir: Union[str, os.PathLike], tag: Any = None):
        """Loads ``load_dir/tag`` (default: the tag in ``load_dir/latest``) into the
        engine and returns ``(path, client_state)``, or ``(None, None)`` when there is no
        ``latest`` to follow (a fresh start, as DeepSpeed). Collective. A save in flight
        is finished first. The checkpoint may come from another number of ranks, stage,
        offload or chunk size: it is resharded as it loads. A checkpoint of another model
        is refused naming the tensor."""
        self.wait_checkpoint()
        load_dir = os.fspath(load_dir)
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                return None, None
            with open(latest, encoding="utf-8") as f:
                tag = f.read().strip()
        path = os.path.join(load_dir, str(tag))
        state, step_calls, _ = self._engine.load_checkpoint(path)
        saved = json.loads(state)
        self.global_steps = int(saved.get("global_steps", step_calls))
        self._micro = 0
        return path, saved.get("client_state", {})


class _PendingSave:
    """A save started with async_save=True: where it goes and what finishing it writes."""

    def __init__(self, path: str, save_dir: str, tag: str, save_latest: bool) -> None:
        self.path, self.save_dir, self.tag, self.save_latest = path, save_dir, tag, save_latest
