"""Optimizers over strata's C++ kernels."""

from strata.optim.cpu_adam import CPUAdam

__all__ = ["CPUAdam"]
