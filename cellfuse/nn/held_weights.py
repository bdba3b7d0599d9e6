"""A module's weight as it holds it at the time of a call: its Parameter, or the tensor that code put in
its place. torch's parametrizations (`weight_norm`, `orthogonal`), its pruning and weight-drop wrappers
(fastai's `WeightDropout`, AWD-LSTM's) take a Parameter out of a module's `_parameters` and make the name
an attribute computed or set before every call, which torch's own modules read as they read any weight.
Such a tensor is packed for the kernels at every call (nn.packed_for).
"""

from __future__ import annotations

import torch


def held(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The weight `name` of `module` now (from `_parameters` where it is there: Module.__getattr__ would
    search it more slowly)."""
    p = module._parameters.get(name)
    return p if p is not None else getattr(module, name)
