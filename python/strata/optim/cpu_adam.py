"""strata.optim.CPUAdam: DeepSpeed's DeepSpeedCPUAdam on strata's SIMD CPU Adam."""

from __future__ import annotations

from itertools import chain
from typing import Any, Callable, Iterable, Optional, Union

import torch

from strata import _strata

_PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_GROUP_KEYS = ("bias_correction", "adamw_mode", "amsgrad")
_MOMENTS = ("exp_avg", "exp_avg_sq")

Params = Union[Iterable[torch.Tensor], Iterable[dict]]


class CPUAdam(torch.optim.Optimizer):
    """Adam/AdamW for CPU tensors with strata's SIMD kernel on oneTBB threads.

    A drop-in for ``deepspeed.ops.adam.DeepSpeedCPUAdam``: the same arguments with the
    same meaning. Parameters are float32, bfloat16 or float16 CPU tensors, updated in
    place (the C++ kernel works on the tensors' own memory through DLPack, no copies).

    - ``adamw_mode=True``: decoupled weight decay (torch.optim.AdamW); ``False``: L2
      decay added to the gradient (torch.optim.Adam).
    - ``bias_correction=False`` drops the (1 - beta^t) factors, as in DeepSpeed.
    - 16-bit parameters keep no fp32 master copy (as DeepSpeed): each step widens them
      to fp32, updates, and rounds back to nearest even. ``exp_avg`` and ``exp_avg_sq``
      are always float32.
    - Refused: ``amsgrad=True``; ``fp32_optimizer_states=False`` with 16-bit parameters
      (strata's kernel keeps the moments in fp32); ``maximize=True`` in a loaded group.

    The state is torch.optim.AdamW's (``step`` as a float tensor, ``exp_avg``,
    ``exp_avg_sq``), so ``state_dict()`` loads into AdamW and back.
    """

    def __init__(
        self,
        model_params: Params,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,
    ) -> None:
        _check_hyper(lr, betas, eps, weight_decay)
        if amsgrad:
            raise ValueError(
                "strata.optim.CPUAdam: amsgrad=True is not supported (strata's Adam keeps no "
                "running maximum of exp_avg_sq); use amsgrad=False"
            )
        # Read by add_param_group, which the base constructor calls.
        self.fp32_optimizer_states = fp32_optimizer_states
        self.adam_w_mode = adamw_mode  # DeepSpeed's attribute name
        defaults = dict(
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            bias_correction=bias_correction,
            amsgrad=amsgrad,
            adamw_mode=adamw_mode,
        )
        super().__init__(model_params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        """Adds a group after checking its parameters' device and dtype."""
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            _check_param(p, self.fp32_optimizer_states)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        # Groups loaded from torch.optim.AdamW lack DeepSpeed's keys: use this optimizer's.
        for group in self.param_groups:
            for key in _GROUP_KEYS:
                group.setdefault(key, self.defaults[key])

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Performs one step over every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params, grads, exp_avgs, exp_avg_sqs, hyper = [], [], [], [], []
        counts = []  # (state, step being taken), stored once the step has succeeded
        for index, group in enumerate(self.param_groups):
            _check_group(group, index)
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = _grad_of(p)
                state = self._state_of(p)
                step = int(state["step"]) + 1
                counts.append((state, step))
                params.append(p.detach())
                grads.append(grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                hyper.append(
                    (
                        float(group["lr"]),
                        float(beta1),
                        float(beta2),
                        float(group["eps"]),
                        float(group["weight_decay"]),
                        bool(group["adamw_mode"]),
                        bool(group["bias_correction"]),
                        step,
                    )
                )
        if params:
            _strata.adam_step(params, grads, exp_avgs, exp_avg_sqs, hyper)
        for state, step in counts:
            _store_step(state, step)
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads this optimizer's or torch.optim.AdamW's state.

        torch casts floating-point state to each parameter's dtype; the moments are put
        back as float32 from the saved values, so 16-bit parameters lose nothing.
        """
        saved_groups = state_dict["param_groups"]
        saved_state = state_dict["state"]
        saved_ids = chain.from_iterable(g["params"] for g in saved_groups)
        own = chain.from_iterable(g["params"] for g in self.param_groups)
        id_map = dict(zip(saved_ids, own))
        super().load_state_dict(state_dict)
        for key, p in id_map.items():
            if key not in saved_state:
                continue
            state = self.state[p]
            for name in _MOMENTS:
                if name in saved_state[key]:
                    state[name] = (
                        saved_state[key][name]
                        .to(device="cpu", dtype=torch.float32, copy=True)
                        .contiguous()
                    )
            if "step" in state:
                state["step"] = torch.tensor(float(state["step"]))

    def _state_of(self, p: torch.Tensor) -> dict:
        """The parameter's state, created (zeros) on its first step, moments fp32 contiguous."""
        state = self.state[p]
        if len(state) == 0:
            state["step"] = torch.tensor(0.0)
            for name in _MOMENTS:
                state[name] = torch.zeros(p.shape, dtype=torch.float32)
        for name in _MOMENTS:
            m = state[name]
            if m.dtype != torch.float32 or m.device.type != "cpu" or not m.is_contiguous():
                state[name] = m.to(device="cpu", dtype=torch.float32).contiguous()
        return state


def _check_hyper(lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    if not 0.0 <= lr:
        raise ValueError(f"strata.optim.CPUAdam: invalid learning rate lr={lr}")
    if not 0.0 <= eps:
        raise ValueError(f"strata.optim.CPUAdam: invalid eps={eps}")
    if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
        raise ValueError(f"strata.optim.CPUAdam: invalid betas={betas} (each in [0, 1))")
    if not 0.0 <= weight_decay:
        raise ValueError(f"strata.optim.CPUAdam: invalid weight_decay={weight_decay}")


def _check_param(p: torch.Tensor, fp32_optimizer_states: bool) -> None:
    if p.device.type != "cpu":
        raise ValueError(
            f"strata.optim.CPUAdam: parameters must be CPU tensors, got one on {p.device}"
        )
    if p.dtype not in _PARAM_DTYPES:
        raise ValueError(
            f"strata.optim.CPUAdam: parameter dtype {p.dtype} is not float32, bfloat16 or float16"
        )
    if p.dtype != torch.float32 and not fp32_optimizer_states:
        raise ValueError(
            "strata.optim.CPUAdam: fp32_optimizer_states=False is not supported: strata's Adam "
            f"keeps exp_avg and exp_avg_sq in float32 (DeepSpeed would keep {p.dtype} states for "
            f"a {p.dtype} parameter)"
        )
    if not p.is_contiguous():
        raise ValueError(
            "strata.optim.CPUAdam: parameters must be contiguous (they are updated in place)"
        )


def _check_group(group: dict, index: int) -> None:
    if group.get("amsgrad", False):
        raise ValueError(
            f"strata.optim.CPUAdam: param group {index} has amsgrad=True, which is not supported"
        )
    if group.get("maximize", False):
        raise ValueError(
            f"strata.optim.CPUAdam: param group {index} has maximize=True, which is not supported"
        )


def _grad_of(p: torch.Tensor) -> torch.Tensor:
    grad = p.grad
    if grad.is_sparse:
        raise ValueError("strata.optim.CPUAdam does not support sparse gradients")
    if grad.device.type != "cpu":
        raise ValueError(
            f"strata.optim.CPUAdam: gradients must be CPU tensors, got one on {grad.device}"
        )
    return grad.detach().contiguous()


def _store_step(state: dict, step: int) -> None:
    """Records the step count as AdamW does: a float tensor (updated in place if one)."""
    if torch.is_tensor(state["step"]):
        state["step"].fill_(float(step))
    else:
        state["step"] = torch.tensor(float(step))
