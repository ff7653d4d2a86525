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

What this version runs: ZeRO stages 0-2, CPU tensors on the sim device (host memory),
one process or several under ``mpirun`` (strata's MPI communicator; no
torch.distributed). Stage 3 is refused: it re-points parameters between a module's
forward and its backward, which needs a module backward pre-hook (torch >= 2.0) that
this torch may not have.

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
        stage = config.get("zero_optimization", {}).get("stage", 0)
        if stage == 3:
            raise NotImplementedError(
                "strata.torch: zero_optimization.stage 3 is not built yet (parameters gathered per "
                "module need a module backward pre-hook); use stage 0, 1 or 2")
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
        self._hooks = []
        for index, module in enumerate(modules):
            self._hooks.append(module.register_forward_pre_hook(self._make_fetch(index)))
            self._hooks.append(module.register_forward_hook(self._make_release(index)))
        for tensor, p in enumerate(params):
            self._hooks.append(p.register_hook(self._make_grad(tensor)))
        _live_engines.add(self)

    # --- hooks -------------------------------------------------------------------------
    def _point(self, index: int, views) -> None:
        """Makes the module's parameters views of the engine's compute copies (at stages
        0-2 they stay put, so this changes them only at the first forward)."""
        for tensor, view in zip(self._module_tensors[index], views):
            p = self._params[tensor]
            if p.data.data_ptr() != view.data_ptr():
                p.data = view

    def _make_fetch(self, index: int):
        def hook(module, inputs):
            self._point(index, self._engine.fetch(index))
        return hook

    def _make_release(self, index: int):
        def hook(module, inputs, output):
            self._engine.release(index)
        return hook

    def _make_grad(self, tensor: int):
        def hook(grad: torch.Tensor):
            self._engine.accumulate_grad(tensor, grad.detach().contiguous())
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
        for p in self._params:  # the engine holds the gradients; torch's copy repeats them
            p.grad = None
        self._micro += 1

    def step(self) -> Dict[str, Any]:
        """Steps at the end of an accumulation window (returns the engine's report), else
        returns None."""
        if self._micro < self._engine.gradient_accumulation_steps:
            return None
        self._micro = 0
        return self._engine.step()

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
        _live_engines.discard(self)


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
