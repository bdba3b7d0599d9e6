"""A module's initial states of zeros, made once: in eager mode one tensor per shape, dtype and device,
kept (the ops only read it, and no one else holds it), so that a call allocates and fills none, and a
16-bit call converts it only once to a state its plan keeps float32 (cuda_runner, which asks
`made_here`: any other tensor may change without its version counter telling, as a CUDA graph's replay
writes its static tensors, and is converted at every call). Under a CUDA graph's capture the zeros are
the graph's own, made there and not kept (see Zeros.__call__ and cuda_runner's `_state_in`)."""

from __future__ import annotations

import weakref
from functools import partial

import torch

from .kept_tensors import kept_tensors
from .tracing import traced

MAX_ZEROS = 4  # the shapes, dtypes and devices whose initial states of zeros a module keeps

_made: dict[int, weakref.ref] = {}  # id of each kept tensor -> it, while it lives


def _forget(key: int, _ref: weakref.ref) -> None:
    _made.pop(key, None)


def made_here(t: torch.Tensor) -> bool:
    """Whether t is initial states of zeros a module keeps (see the module's docstring)."""
    ref = _made.get(id(t))
    return ref is not None and ref() is t


class Zeros:
    """One module's kept initial states of zeros: `zeros(shape, dtype, device)`."""

    def __init__(self):
        self._kept: dict[tuple, torch.Tensor] = {}

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # (under a CUDA graph's capture, zeros of the graph's own, not kept: its replays fill them, which
        # calls made outside it would read unfilled)
        if traced() or (torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()):
            return torch.zeros(shape, dtype=dtype, device=device)
        key = (shape, dtype, device)
        t = self._kept.get(key)
        if t is None:  # (threads may make one each: the last kept, every one of them zeros)
            while len(self._kept) >= MAX_ZEROS:
                self._kept.pop(next(iter(self._kept), None), None)
            with kept_tensors():
                t = self._kept[key] = torch.zeros(shape, dtype=dtype, device=device)
            _made[id(t)] = weakref.ref(t, partial(_forget, id(t)))
        return t
