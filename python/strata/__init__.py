"""strata from PyTorch.

Parts a torch user can adopt one at a time:

- ``strata.optim.CPUAdam``: a drop-in for DeepSpeed's ``DeepSpeedCPUAdam``, stepping
  CPU tensors in place with strata's SIMD Adam on oneTBB threads.
- ``strata.io``: asynchronous O_DIRECT reads and writes of pinned tensors over strata's
  io_uring engine, in the shape of DeepNVMe's ``aio_handle``.
- ``strata.torch.initialize(model, config)``: ZeRO stages 0-3 with CPU or NVMe offload of
  the optimizer state and (stage 3) the parameters, for a torch ``nn.Module``.

Submodules are imported on first use, so ``import strata`` itself does not import torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__version__ = "0.1.0"

# Subpackages loaded lazily by __getattr__.
_SUBMODULES = ("optim", "io", "torch")

__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str) -> ModuleType:
    """Imports ``strata.<name>`` on first access (PEP 562)."""
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
