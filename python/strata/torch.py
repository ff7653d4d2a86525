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
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import warnings
import weakref
from typing import Any, Dict, List, Optional, Union

import torch
from torch.overrides import TorchFunctionMode

from . import _strata

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
    for name, p in model.named_parameters():
        ids[id(p)] = len(params)
        params.append(p)
        names.append(name)
    modules: List[torch.nn.Module] = []
    module_names: List[str] = []
    module_tensors: List[List[int]] = []
    for mname, module in model.named_modules():
        held = [p for _, p in module.named_parameters(recurse=False)] + _external.get(module, [])
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
        self._names = names
        self._engine = _strata.Engine(json.dumps(config), names, [list(p.shape) for p in params],
                                      module_names, module_tensors, init)
        self._modules = modules
        self._module_names = module_names
        self._module_tensors = module_tensors
        self._micro = 0
        self.global_steps = 0  # step() calls that ended an accumulation window
        # Stage 3: per module, the backward fetches whose release waits for its gradients,
        # and the parameters still to hand theirs in; releases due after a gradient hook.
        self._open_backward = [0] * len(modules)
        self._grads_due = [set() for _ in modules]
        self._releases_due: List[int] = []
        self._owners = [[m for m, ids in enumerate(module_tensors) if t in ids] for t in range(len(params))]
        # Stage 3: per tensor, the fetches of modules holding it not yet released. A tensor
        # held by a module and by one of its children (an external parameter) keeps its
        # data until both let go.
        self._holds = [0] * len(params)
        self._tensor_of = {id(p): t for t, p in enumerate(params)}
        self._check = _ReleasedCheck(self) if self._stage3 else None
        self._pending: Optional[_PendingSave] = None  # the save_checkpoint(async_save=True) in flight
        self._hooks = []
        for index, module in enumerate(modules):
            self._hooks.append(module.register_forward_pre_hook(self._make_fetch(index)))
            self._hooks.append(module.register_forward_hook(self._make_release(index)))
        for tensor, p in enumerate(params):
            self._hooks.append(p.register_hook(self._make_grad(tensor)))
            if self._stage3:  # the engine holds the shards; a module's forward gathers them
                p.data = torch.empty(0, dtype=p.dtype)
        _declared.update(model.modules())
        _live_engines.add(self)

    # --- hooks -------------------------------------------------------------------------
    def _point(self, index: int, views) -> None:
        """Makes the module's parameters views of the engine's compute copies (at stages
        0-2 they stay put, so this changes them only at the first forward)."""
        for tensor, view in zip(self._module_tensors[index], views):
            p = self._params[tensor]
            self._holds[tensor] += 1
            if p.data.data_ptr() != view.data_ptr():
                p.data = view

    def _unpoint(self, index: int) -> None:
        """Stage 3, after a release: the released chunks may be refilled, so a parameter
        that no module holds any more lets go of them."""
        for tensor in self._module_tensors[index]:
            self._holds[tensor] -= 1
            if self._holds[tensor] == 0:
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
            if not self._stage3:
                return None
            self._unpoint(index)  # under no_grad too: the chunks may be refilled all the same
            if not torch.is_grad_enabled():
                return None
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
                self._unpoint(index)
            self._open_backward[index] = 0
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
        if self._check is None:
            return self.module(*args, **kwargs)
        with self._check:
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

    # --- checkpoints (DeepSpeed's engine calls) -------------------------------------------
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


class _PendingSave:
    """A save started with async_save=True: where it goes and what finishing it writes."""

    def __init__(self, path: str, save_dir: str, tag: str, save_latest: bool) -> None:
        self.path, self.save_dir, self.tag, self.save_latest = path, save_dir, tag, save_latest


# Calls that read no parameter data: metadata, and the hooks' own moves of ``.data``.
_NO_DATA = {torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.element_size,
            torch.Tensor.data_ptr, torch.Tensor.is_floating_point, torch.Tensor.is_contiguous,
            torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.register_hook}


class _ReleasedCheck(TorchFunctionMode):
    """Stage 3, during the forward: refuses a torch call that reads a parameter no
    module holds at that moment (its data is an empty tensor then, and some calls would
    compute with it silently: ``(w ** 2).sum()`` is 0)."""

    def __init__(self, engine: "Engine") -> None:
        super().__init__()
        self._engine = engine

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _NO_DATA and getattr(func, "__name__", "") not in ("__get__", "__set__"):
            for a in args:
                self._refuse_released(a, func)
                if isinstance(a, (list, tuple)):
                    for b in a:
                        self._refuse_released(b, func)
            for a in kwargs.values():
                self._refuse_released(a, func)
        return func(*args, **kwargs)

    def _refuse_released(self, a, func) -> None:
        if type(a) is not torch.nn.Parameter:
            return
        e = self._engine
        tensor = e._tensor_of.get(id(a))
        if tensor is None or e._holds[tensor] > 0:
            return
        holders = [n for n, ids in zip(e._module_names, e._module_tensors) if tensor in ids]
        user = _forward_module(e.module)
        target = "model" if user in (None, "model") else f"model.{user}"
        name = e._names[tensor]
        raise RuntimeError(
            f"strata.torch: parameter {name!r} is read by {getattr(func, '__qualname__', func)} in the forward "
            f"of {user or 'the model'!r} while no module holding it runs (held by {', '.join(holders)}), so at "
            f"stage 3 it has no data there; declare the use before initialize: "
            f"strata.torch.register_external_parameter({target}, model.{name})")


def _forward_module(model: torch.nn.Module) -> Optional[str]:
    """The name of the innermost module of ``model`` whose forward is on the stack."""
    names = {id(m): n or "model" for n, m in model.named_modules()}
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if frame.f_code.co_name == "forward" and id(owner) in names:
            return names[id(owner)]
        frame = frame.f_back
    return None


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
