"""ZeRO with offload for a torch ``nn.Module``: ``strata.torch.initialize(model, config)``.

The engine owns the parameters: after ``initialize`` every parameter of the model is a
view of the engine's compute copy, and the fp32 master, Adam state and gradients live
where the config puts them (DeepSpeed's keys: ``zero_optimization.stage``,
``offload_optimizer``, ...; the same file as ``strata train --config``). Gradients go to
the engine as autograd produces them, so the reduction and the overlapped CPU optimizer
run during the backward, as they do in C++::

    engine = strata.torch.initialize(model, "ds_config.json")
    for batch in data:                      # one micro-batch per call
        loss = loss_fn(engine(batch.x), batch.y)
        engine.backward(loss)
        engine.step()                       # steps at the end of each accumulation window
    engine.save_checkpoint("ckpt")          # and engine.load_checkpoint("ckpt") to resume

What this version runs: ZeRO stages 0-3 with the optimizer state and (stage 3) the
parameters on the device, in pinned host memory or on NVMe, CPU tensors on the sim
device (host memory), one process or several under ``mpirun`` (strata's MPI
communicator; no torch.distributed). At stage 3 a parameter holds its data only while
its module runs (an empty tensor otherwise, as DeepSpeed's): the forward pre-hook
gathers, the forward hook releases, and an identity autograd function on the module's
outputs gathers again just before the module's backward; the release follows the last
of the module's gradients.

Modules: every submodule that holds parameters of its own is one engine module, in
registration order; a parameter held by several submodules (tied weights) is one
engine tensor. Loss scaling (fp16) is applied by ``backward``; the loss passed in is
the micro-batch's, and ``backward`` divides it by ``gradient_accumulation_steps``.
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any, Dict, List, Union

import torch

from . import _strata

__all__ = ["initialize", "Engine"]


def _load_config(config: Union[str, os.PathLike, Dict[str, Any]]) -> Dict[str, Any]:
    if isinstance(config, dict):
        return json.loads(json.dumps(config))  # a copy; fails early on what is not JSON
    with open(config, encoding="utf-8") as f:
        return json.load(f)


def _declare(model: torch.nn.Module):
    """Tensors (deduplicated by identity) and modules (their own parameters)."""
    ids: Dict[int, int] = {}
    params: List[torch.nn.Parameter] = []
    names: List[str] = []
    modules: List[torch.nn.Module] = []
    module_names: List[str] = []
    module_tensors: List[List[int]] = []
    for mname, module in model.named_modules():
        own = list(module.named_parameters(recurse=False))
        if not own:
            continue
        tensor_ids = []
        for pname, p in own:
            if id(p) not in ids:
                ids[id(p)] = len(params)
                params.append(p)
                names.append(f"{mname}.{pname}" if mname else pname)
            if ids[id(p)] not in tensor_ids:
                tensor_ids.append(ids[id(p)])
        modules.append(module)
        module_names.append(mname or "model")
        module_tensors.append(tensor_ids)
    return params, names, modules, module_names, module_tensors


class Engine:
    """Trains ``model`` with the strata engine; see the module's documentation."""

    def __init__(self, model: torch.nn.Module, config: Dict[str, Any]):
        self._stage3 = config.get("zero_optimization", {}).get("stage", 0) == 3
        strata_block = config.setdefault("strata", {})
        if strata_block.setdefault("device", "sim") != "sim":
            raise NotImplementedError(
                f"strata.torch: strata.device {strata_block['device']!r}: this version runs CPU tensors "
                "on the sim device; leave strata.device unset")
        params, names, modules, module_names, module_tensors = _declare(model)
        if not params:
            raise ValueError("strata.torch.initialize: the model has no parameters")
        for n, p in zip(names, params):
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(
                    f"strata.torch.initialize: parameter {n!r} is {p.dtype} on {p.device}; "
                    "give the model fp32 CPU parameters (bf16/fp16 compute comes from the config)")
        init = [p.detach().contiguous().numpy() for p in params]
        self.module = model
        self._params = params
        self._engine = _strata.Engine(json.dumps(config), names, [list(p.shape) for p in params],
                                      module_names, module_tensors, init)
        self._modules = modules
        self._module_tensors = module_tensors
        self._micro = 0
        self.global_steps = 0  # step() calls that ended an accumulation window
        # Stage 3: per module, the backward fetches whose release waits for its gradients,
        # and the parameters still to hand theirs in; releases due after a gradient hook.
        self._open_backward = [0] * len(modules)
        self._grads_due = [set() for _ in modules]
        self._releases_due: List[int] = []
        self._owners = [[m for m, ids in enumerate(module_tensors) if t in ids] for t in range(len(params))]
        self._hooks = []
        for index, module in enumerate(modules):
            self._hooks.append(module.register_forward_pre_hook(self._make_fetch(index)))
            self._hooks.append(module.register_forward_hook(self._make_release(index)))
        for tensor, p in enumerate(params):
            self._hooks.append(p.register_hook(self._make_grad(tensor)))
            if self._stage3:  # the engine holds the shards; a module's forward gathers them
                p.data = torch.empty(0, dtype=p.dtype)
        _live_engines.add(self)

    # --- hooks -------------------------------------------------------------------------
    def _point(self, index: int, views) -> None:
        """Makes the module's parameters views of the engine's compute copies (at stages
        0-2 they stay put, so this changes them only at the first forward)."""
        for tensor, view in zip(self._module_tensors[index], views):
            p = self._params[tensor]
            if p.data.data_ptr() != view.data_ptr():
                p.data = view

    def _unpoint(self, index: int) -> None:
        """Stage 3: the released chunks may be refilled, so the parameters let go of them."""
        for tensor in self._module_tensors[index]:
            p = self._params[tensor]
            p.data = torch.empty(0, dtype=p.dtype)

    def _make_fetch(self, index: int):
        def hook(module, inputs):
            self._release_due()
            self._point(index, self._engine.fetch(index))
        return hook

    def _make_release(self, index: int):
        def hook(module, inputs, output):
            self._engine.release(index)
            if not self._stage3 or not torch.is_grad_enabled():
                return None
            self._unpoint(index)
            return _wrap_outputs(output, lambda: self._before_backward(index))
        return hook

    def _before_backward(self, index: int) -> None:
        """Stage 3, before the module's backward: gather its parameters again. They are
        released once every one of them has handed its gradient in."""
        self._release_due()
        self._point(index, self._engine.fetch(index))
        self._open_backward[index] += 1
        self._grads_due[index] = {t for t in self._module_tensors[index] if self._params[t].requires_grad}

    def _release_due(self) -> None:
        # After a gradient hook torch still adds the gradient into .grad, which needs the
        # parameter's shape: the release waits for the next call.
        for index in self._releases_due:
            for _ in range(self._open_backward[index]):
                self._engine.release(index)
            self._open_backward[index] = 0
            self._unpoint(index)
        self._releases_due = []

    def _make_grad(self, tensor: int):
        def hook(grad: torch.Tensor):
            self._release_due()
            self._engine.accumulate_grad(tensor, grad.detach().contiguous())
            if not self._stage3:
                return
            for index in self._owners[tensor]:
                due = self._grads_due[index]
                if tensor in due:
                    due.discard(tensor)
                    if not due and self._open_backward[index]:
                        self._releases_due.append(index)
        return hook

    # --- training ----------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """The model's forward, as one micro-batch."""
        self._engine.begin_micro_batch()
        return self.module(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of this rank's micro-batch loss (a mean over its samples). The engine
        sums gradients over ranks and micro-batches, so the loss is divided by both
        counts to give the mean over the global batch, as DeepSpeed's averaging does."""
        e = self._engine
        (loss * (e.loss_scale / (e.gradient_accumulation_steps * e.world_size))).backward()
        self._release_due()
        for p in self._params:  # the engine holds the gradients; torch's copy repeats them
            p.grad = None
        self._micro += 1

    def step(self) -> Dict[str, Any]:
        """Steps at the end of an accumulation window (returns the engine's report), else
        returns None."""
        if self._micro < self._engine.gradient_accumulation_steps:
            return None
        self._micro = 0
        report = self._engine.step()
        self.global_steps += 1
        return report

    # --- checkpoints (DeepSpeed's engine calls) -------------------------------------------
    def save_checkpoint(self, save_dir: Union[str, os.PathLike], tag: Any = None,
                        client_state: Dict[str, Any] = None, save_latest: bool = True) -> str:
        """Saves the training state into ``save_dir/tag`` (default ``global_step<N>``, N
        the steps taken) and returns that path; collective. ``client_state`` (a JSON
        dict) comes back from ``load_checkpoint``; ``save_latest`` writes the tag into
        ``save_dir/latest``, as DeepSpeed does. The format, its crash safety and its
        checksums are strata's (docs/checkpoints.md): the fp32 master, Adam's moments,
        the step counts, the loss scaler and the learning rate, from whichever tier holds
        them. Call it between ``step()`` and the next micro-batch."""
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
        self._engine.save_checkpoint(path, state)
        if save_latest and self.rank == 0:
            latest = os.path.join(os.fspath(save_dir), "latest")
            with open(latest + ".tmp", "w", encoding="utf-8") as f:
                f.write(tag)
                f.flush()
                os.fsync(f.fileno())
            os.replace(latest + ".tmp", latest)
        return path

    def load_checkpoint(self, load_dir: Union[str, os.PathLike], tag: Any = None):
        """Loads ``load_dir/tag`` (default: the tag in ``load_dir/latest``) into the
        engine and returns ``(path, client_state)``, or ``(None, None)`` when there is no
        ``latest`` to follow (a fresh start, as DeepSpeed). Collective. The checkpoint may
        come from another number of ranks, stage, offload or chunk size: it is resharded
        as it loads. A checkpoint of another model is refused naming the tensor."""
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

    @property
    def lr(self) -> float:
        """The learning rate the next step uses (settable between steps)."""
        return self._engine.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self._engine.lr = value

    def master(self, tensor: int) -> torch.Tensor:
        """The fp32 master of the engine's tensor ``tensor`` (collective over the ranks)."""
        return self._engine.gather_master(tensor)

    def master_params(self) -> List[torch.Tensor]:
        return [self.master(t) for t in range(len(self._params))]

    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def world_size(self) -> int:
        return self._engine.world_size

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for p in self._params:  # the parameters outlive the engine's memory
            p.data = p.data.clone()
        self._engine.close()
        self._engine = _Closed()  # let go of the extension's object before the interpreter ends
        _live_engines.discard(self)


class _Closed:
    """What a closed Engine holds instead of the extension's engine."""

    def __getattr__(self, name: str):
        raise RuntimeError(f"strata.torch: the engine was closed (engine.{name})")


class _BeforeBackward(torch.autograd.Function):
    """Identity on a module's outputs whose backward runs just before the module's own:
    there, stage 3 gathers the module's parameters again (torch 1.13 has no module
    backward pre-hook)."""

    @staticmethod
    def forward(ctx, callback, *tensors):  # type: ignore[override]
        ctx.callback = callback
        return tuple(t.view_as(t) for t in tensors)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        ctx.callback()
        return (None, *grads)


def _wrap_outputs(output, callback):
    """The module's output with its differentiable tensors routed through _BeforeBackward."""
    if isinstance(output, torch.Tensor):
        return _BeforeBackward.apply(callback, output)[0] if output.requires_grad else output
    if isinstance(output, (tuple, list)):
        picks = [i for i, t in enumerate(output) if isinstance(t, torch.Tensor) and t.requires_grad]
        if not picks:
            return output
        wrapped = _BeforeBackward.apply(callback, *[output[i] for i in picks])
        out = list(output)
        for i, t in zip(picks, wrapped):
            out[i] = t
        return type(output)(out) if isinstance(output, tuple) else out
    return output


_live_engines: "set[Engine]" = set()


@atexit.register
def _end_mpi() -> None:
    for e in list(_live_engines):
        e.close()
    _strata.finalize_world()


def initialize(model: torch.nn.Module, config: Union[str, os.PathLike, Dict[str, Any]]) -> Engine:
    """Returns an engine that trains ``model`` with ZeRO and offload as ``config`` (a
    DeepSpeed-style dict or JSON file) says. Collective under mpirun."""
    return Engine(model, _load_config(config))
