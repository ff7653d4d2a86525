"""The engine's torch hooks and the state they keep: a module's forward pre-hook gathers
its parameters and its forward hook releases them (at stage 3 a parameter has data only
while some module holds it, counted per tensor), an identity autograd function gathers
them again before the module's backward, each gradient hook hands a gradient to the
engine, and during the forward a guard refuses reading a parameter no module holds."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, List, Optional

import torch
from torch.overrides import TorchFunctionMode

if TYPE_CHECKING:
    from .torch import Engine


class _ModuleHooks:
    """The hooks of ``strata.torch.Engine`` (a base class of it): installs them and keeps
    the hold counts and the backward bookkeeping they need."""

    # Set by the engine before _install_hooks.
    _engine: Any  # the extension's engine
    _stage3: bool
    _params: List[torch.nn.Parameter]
    _modules: List[torch.nn.Module]
    _module_tensors: List[List[int]]

    def _install_hooks(self) -> None:
        """Registers the module and gradient hooks; at stage 3 empties the parameters,
        whose shards the engine holds from now on."""
        params, modules, module_tensors = self._params, self._modules, self._module_tensors
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
        self._hooks = []
        for index, module in enumerate(modules):
            self._hooks.append(module.register_forward_pre_hook(self._make_fetch(index)))
            self._hooks.append(module.register_forward_hook(self._make_release(index)))
        self._grad_accs = []
        for tensor, p in enumerate(params):
            self._hooks.append(p.register_hook(self._make_grad(tensor)))
            self._drop_grad_after_accumulation(p)
            if self._stage3:  # the engine holds the shards; a module's forward gathers them
                p.data = torch.empty(0, dtype=p.dtype)

    def _drop_grad_after_accumulation(self, p: torch.nn.Parameter) -> None:
        """torch adds each gradient into ``.grad`` after the hook has handed it to the
        engine, which holds it from then on: dropping it at once keeps one parameter's
        ``.grad`` alive at a time, not the whole model's until ``backward`` ends."""
        def drop(*_) -> None:
            p.grad = None
        if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
            self._hooks.append(p.register_post_accumulate_grad_hook(drop))
            return
        with torch.enable_grad():  # the parameter's AccumulateGrad node, after which hooks run
            accumulate = p.view_as(p).grad_fn.next_functions[0][0]
        self._grad_accs.append(accumulate)  # the node lives only while someone holds it
        self._hooks.append(accumulate.register_hook(drop))

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
