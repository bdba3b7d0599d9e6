"""Tensors kept from call to call are made as normal tensors, even in a call under torch.inference_mode:
an inference tensor may be neither written in place nor saved for a backward pass outside that mode,
so a tensor kept from an evaluation under torch.inference_mode() (a runner's buffers, a module's
initial zeros, its packed weights) broke every training call after it. The making of a runner, the CUDA
runner's calls and the making of its lanes, and the making of kept zeros run in `kept_tensors()`."""

from __future__ import annotations

import contextlib

import torch

_NOTHING = contextlib.nullcontext()


@contextlib.contextmanager
def _normal():
    # (torch.inference_mode(False) turns grad mode on: no_grad keeps autograd out, as it was)
    with torch.inference_mode(False), torch.no_grad():
        yield


def kept_tensors():
    """A context in which the tensors made are normal ones, where inference mode is on (else one that does
    nothing: the test costs a tenth of a microsecond)."""
    return _normal() if torch.is_inference_mode_enabled() else _NOTHING
