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
    engine.save_checkpoint("ckpt", async_save=True)  # written behind training: the next
                                                     # step() finishes it

What this version runs: ZeRO stages 0-3 with the optimizer state and (stage 3) the
parameters on the device, in pinned host memory or on NVMe, CPU tensors on the sim
device (host memory), one process or several under ``mpirun`` (strata's MPI
communicator; no torch.distributed). At stage 3 a parameter holds its data only while
a module that holds it runs (an empty tensor otherwise, as DeepSpeed's): the forward
pre-hook gathers, the forward hook releases, and an identity autograd function on the
module's outputs gathers again just before the module's backward; the release follows
the last of the module's gradients.

Modules: every submodule that holds parameters of its own is one engine module, in
registration order; a parameter held by several submodules (tied weights) is one
engine tensor. A module holds its own parameters (``named_parameters(recurse=False)``)
and those registered on it with ``register_external_parameter``. Its hooks bracket its
children, so what it holds stays gathered while they run: a parameter of the root
module (``self.pos_emb = nn.Parameter(...)``) is there for the whole forward and, in
backward, until its gradient is in; keep large parameters in leaf modules. At stage 3 a
parameter that the forward reads while no module holding it runs (a tied LM head
``F.linear(h, self.wte.weight)`` in the parent's forward) raises a RuntimeError naming
the parameter and the module to register it on, rather than computing with an empty
tensor. Loss scaling (fp16) is applied by ``backward``; the loss passed in is the
micro-batch's, and ``backward`` divides it by ``gradient_accumulation_steps``.

Frozen parameters (``requires_grad`` False at ``initialize``, a fine-tuned model's
base) stay torch's own, as torch's AdamW leaves a parameter without gradient alone: not
in the engine, not stepped, not decayed, not sharded (every rank keeps its copy where
the model put it) and not in the engine's checkpoints (the model that loads one brings
them). Unfreezing one later needs a new engine.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import weakref
from typing import Any, Dict, List, Optional, Union

import torch

from . import _strata
from ._checkpoints import _Checkpoints, _PendingSave
from ._gather import _ModuleHooks

__all__ = ["initialize", "Engine", "register_external_parameter"]

# Per module, the parameters registered on it (register_external_parameter).
_external: "weakref.WeakKeyDictionary[torch.nn.Module, List[torch.nn.Parameter]]" = weakref.WeakKeyDictionary()
# Modules of a live engine's model: a registration on them would come too late.
_declared: "weakref.WeakSet[torch.nn.Module]" = weakref.WeakSet()


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """Declares that ``module``'s forward reads ``parameter``, a parameter of another
    module (DeepSpeed's ``deepspeed.zero.register_external_parameter``): at stage 3
    ``module`` then gathers it for its whole forward and again for its backward, as its
    own. Call it before ``initialize``; ``parameter`` must be a parameter of the model.
    The usual case is a tied LM head written ``F.linear(h, self.wte.weight)`` in the
    parent's forward: ``register_external_parameter(model, model.wte.weight)``."""
    if not isinstance(module, torch.nn.Module) or not isinstance(parameter, torch.nn.Parameter):
        raise TypeError("strata.torch.register_external_parameter(module, parameter): "
                        f"got {type(module).__name__} and {type(parameter).__name__}")
    if module in _declared:
        raise RuntimeError("strata.torch.register_external_parameter: the module belongs to an engine "
                           "already; register its external parameters before initialize")
    held = _external.setdefault(module, [])
    if not any(p is parameter for p in held):
        held.append(parameter)


def _load_config(config: Union[str, os.PathLike, Dict[str, Any]]) -> Dict[str, Any]:
    if isinstance(config, dict):
        return json.loads(json.dumps(config))  # a copy; fails early on what is not JSON
    with open(config, encoding="utf-8") as f:
        return json.load(f)


def _declare(model: torch.nn.Module):
    """Tensors (deduplicated by identity, in ``named_parameters`` order) and modules (the
    parameters each holds: its own, then those registered on it)."""
    ids: Dict[int, int] = {}
    params: List[torch.nn.Parameter] = []
    names: List[str] = []
    frozen = set()
    for name, p in model.named_parameters():
        if not p.requires_grad:  # torch's own: not sharded, not stepped (see initialize)
            frozen.add(id(p))
            continue
        ids[id(p)] = len(params)
        params.append(p)
        names.append(name)
    modules: List[torch.nn.Module] = []
    module_names: List[str] = []
    module_tensors: List[List[int]] = []
    for mname, module in model.named_modules():
        held = [p for _, p in module.named_parameters(recurse=False)] + _external.get(module, [])
        held = [p for p in held if id(p) not in frozen]
        if not held:
            continue
        tensor_ids = []
        for p in held:
            if id(p) not in ids:
                raise ValueError(f"strata.torch.initialize: a parameter registered on module {mname or 'model'!r} "
                                 "(register_external_parameter) is not a parameter of the model")
            if ids[id(p)] not in tensor_ids:
                tensor_ids.append(ids[id(p)])
        modules.append(module)
        module_names.append(mname or "model")
        module_tensors.append(tensor_ids)
    return params, names, modules, module_names, module_tensors


class Engine(_ModuleHooks, _Checkpoints):
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
            raise ValueError("strata.torch.initialize: the model has no parameters that require grad")
        for n, p in zip(names, params):
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(
                    f"strata.torch.initialize: parameter {n!r} is {p.dtype} on {p.device}; "
                    "give the model fp32 CPU parameters (bf16/fp16 compute comes from the config)")
        init = [p.detach().contiguous().numpy() for p in params]
        self.module = model
        self._params = params
        self._names = names
        self._engine = _strata.Engine(json.dumps(config), names, [list(p.shape) for p in params],
                                      module_names, module_tensors, init)
        self._modules = modules
        self._module_names = module_names
        self._module_tensors = module_tensors
        self._micro = 0
        self.global_steps = 0  # step() calls that ended an accumulation window
        self._pending: Optional[_PendingSave] = None  # the save_checkpoint(async_save=True) in flight
        self._install_hooks()
        _declared.update(model.modules())
        _live_engines.add(self)

    # --- training ----------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """The model's forward, as one micro-batch; under ``torch.no_grad()`` (or
        inference mode) an evaluation pass instead, which trains nothing: it starts no
        micro-batch and is left out of the recorded call order, and at stage 3 gathers
        what it uses and lets go of it after (the engine's SetEvaluating). The engine
        evaluates between steps: inside an accumulation window it is refused (a
        RuntimeError; nothing changes and training goes on)."""
        if not torch.is_grad_enabled():
            return self._evaluate(*args, **kwargs)
        self._engine.begin_micro_batch()
        return self._forward(*args, **kwargs)

    def _forward(self, *args, **kwargs):
        if self._check is None:
            return self.module(*args, **kwargs)
        with self._check:
            return self.module(*args, **kwargs)

    def _evaluate(self, *args, **kwargs):
        if self._micro != 0:
            raise RuntimeError(
                f"strata.torch: a forward under torch.no_grad() is an evaluation pass, which the engine runs "
                f"between steps; this accumulation window has {self._micro} of "
                f"{self._engine.gradient_accumulation_steps} micro-batches: evaluate after step() ends it")
        self._release_due()
        self._engine.set_evaluating(True)
        try:
            return self._forward(*args, **kwargs)
        finally:
            self._engine.set_evaluating(False)

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

    def step(self) -> Optional[Dict[str, Any]]:
        """Steps at the end of an accumulation window (returns the engine's report), else
        returns None. After the step it finishes a save started with
        ``save_checkpoint(..., async_save=True)`` (the report's ``"checkpoint"``: its path
        and where training waited for it, ``stalled_s``); if that save failed, the step is
        taken all the same and the save's error is raised here, naming its directory."""
        if self._micro < self._engine.gradient_accumulation_steps:
            return None
        self._micro = 0
        report = self._engine.step()
        self.global_steps += 1
        if self._pending is not None:
            path = self._pending.path
            report["checkpoint"] = dict(path=path, **self._finish_save())
        return report

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
        """Finishes a save in flight (collective, as ``wait_checkpoint``), then lets go of
        the engine; the parameters keep their values as plain tensors. The engine is
        closed even when that save fails; its error is raised after."""
        self._close(finish_save=True)

    def _close(self, finish_save: bool) -> None:
        error = None
        if self._pending is not None and finish_save:
            try:
                self._finish_save()
            except Exception as e:  # noqa: BLE001: raised once the engine is closed
                error = e
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for p in self._params:  # the parameters outlive the engine's memory
            p.data = p.data.clone()
        self._engine.close()
        self._engine = _Closed()  # let go of the extension's object before the interpreter ends
        self._pending = None
        for m in self.module.modules():
            _declared.discard(m)
        _live_engines.discard(self)
        if error is not None:
            raise error


class _Closed:
    """What a closed Engine holds instead of the extension's engine."""

    def __getattr__(self, name: str):
        raise RuntimeError(f"strata.torch: the engine was closed (engine.{name})")


_live_engines: "set[Engine]" = set()


@atexit.register
def _end_mpi() -> None:
    for e in list(_live_engines):
        # Finishing a save takes every rank, and at exit the others may be gone (one rank
        # raised): with several ranks the save is left unfinished, its files in a .tmp-
        # folder that the next save there removes, and the previous checkpoint stays.
        try:
            e._close(finish_save=e.world_size == 1)
        except Exception as err:  # noqa: BLE001: every engine is closed, MPI ended
            print(f"strata.torch: at exit: {err}", file=sys.stderr)
    _strata.finalize_world()


def initialize(model: torch.nn.Module, config: Union[str, os.PathLike, Dict[str, Any]]) -> Engine:
    """Returns an engine that trains ``model`` with ZeRO and offload as ``config`` (a
    DeepSpeed-style dict or JSON file) says. Collective under mpirun."""
    return Engine(model, _load_config(config))