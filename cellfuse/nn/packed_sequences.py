"""A PackedSequence padded for the kernels and packed back (`Unpacked`), in its own order of rows (longest
first, as its data holds them), so that nothing waits for the GPU. torch's pad_packed_sequence and
pack_padded_sequence copy a step at a time and read the order of rows back from the GPU, which cost more
than the kernels of a layer (docs/results/2026-11-28-packed-and-side-by-side.md).

On a GPU, one generated kernel (codegen.packed_rows) pads the data and writes the steps-left state of
the cell that runs each row to its own length, and one packs y back: the batch sizes go in the
launches' arguments, so the host works out and copies nothing before the call's first kernel; padding
with torch's ops (the positions of the packed elements worked out on the host and copied to the GPU, a
fill, an index_copy, the lengths' state made hidden wide) cost the call 0.6 ms of host time before its
first kernel on an H200 (docs/results/2026-11-29-packed-rows.md). Elsewhere (the CPU, torch.compile's
tracing, a CUDA graph capture before the kernels were loaded, more steps than a launch's arguments hold)
torch's ops pad and pack.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cached_property

import numpy as np
import torch
from torch.nn.utils.rnn import PackedSequence

from ..codegen.packed_rows import MAX_STEPS, capacity
from ..graph_model import CellError
from . import ops
from .stacks import steps_left, to_device
from .zeros import made_here

log = logging.getLogger(__name__)

STEPS_MULTIPLE = 4  # a PackedSequence's steps are run in multiples of this (see Unpacked)

_kernels: dict[tuple[int, int, int], object] = {}  # (device, itemsize, capacity) -> PackedRows, or None


def _rows_kernels(data: torch.Tensor, steps: int):
    """The packed rows' kernels (gpu_runtime.packed_rows) for data's device and elements and `steps`
    steps, loaded at their first use; None where torch's ops pad instead (see the module's docstring)."""
    if (data.device.type != "cuda" or torch.compiler.is_compiling() or steps > MAX_STEPS
            or data.element_size() not in (2, 4) or data.shape[0] >= 2**31):
        return None
    key = (data.get_device(), data.element_size(), capacity(steps))
    if key in _kernels:
        return _kernels[key]
    if torch.cuda.is_current_stream_capturing():  # (loading a module would break the capture)
        return None
    from ..gpu_runtime.packed_rows import PackedRows

    major, minor = torch.cuda.get_device_capability(data.device)
    try:
        with ops.made_current(data):
            made = PackedRows(key[1], key[2], f"sm_{major}{minor}")
    except CellError as e:
        log.warning("the packed rows' kernels could not be made (%s); torch's ops pad PackedSequences", e)
        made = None
    _kernels[key] = made
    return made


class Unpacked:
    """A PackedSequence padded in its own order of rows, by `pad`: x [T', B, width] (zeros past each
    row's length; T' the longest length rounded up to a multiple of STEPS_MULTIPLE) and the steps-left
    state of a call of `state_layers` layers ([state_layers, B, hidden]: each row's length, see
    stacks.run); the rows' lengths (on the CPU, from the batch sizes), and how to pack y back and to
    move states between the batch's order and this one. Gradients flow through the padding and the
    packing."""

    def __init__(self, packed: PackedSequence):
        self._sizes = packed.batch_sizes.numpy()  # on the CPU, as torch keeps them
        self._like = packed
        # x's steps rounded up to a multiple of STEPS_MULTIPLE (past every row's length, the steps after
        # T change nothing): batches whose longest rows differ by a few steps share a runner and `auto`'s
        # choice, where each new length would have made (and measured) its own
        self._steps = -(-len(self._sizes) // STEPS_MULTIPLE) * STEPS_MULTIPLE
        self._rows = _rows_kernels(packed.data, self._steps)
        self.x: torch.Tensor | None = None
        self.steps: torch.Tensor | None = None

    def pad(self, hidden: int, state_layers: int) -> None:
        """x and the steps-left state made (see the class's docstring)."""
        data = self._like.data
        if self._rows is None:
            self.x = self._positions_padded(data)
            self.steps = steps_left(self.lengths, state_layers, self.x, hidden)
        elif torch.is_grad_enabled() and data.requires_grad:
            self.x, self.steps = _Padded.apply(data, self, hidden, state_layers)
        else:
            self.x, self.steps = self._padded(data.detach(), hidden, state_layers)

    def lane_rows(self, state_layers: int) -> tuple[int, int, int] | None:
        """What a lane needs to pad a float32 PackedSequence like this one for a call of `state_layers`
        layers (quick_lane.make's `rows`), or None where the kernels do not pad it."""
        if self._rows is None or self._like.data.dtype != torch.float32:
            return None
        B = int(self._sizes[0])
        return self._rows.lane_rows((self._steps + state_layers) * B)

    @cached_property
    def lengths(self) -> torch.Tensor:
        """The rows' lengths, in this order (CPU, int64)."""
        sizes = self._sizes
        return torch.from_numpy((np.arange(int(sizes[0]))[None, :] < sizes[:, None]).sum(0))

    @cached_property
    def _at(self) -> torch.Tensor:
        """Where each element of the packed data (step by step, longest row first) is in x [T * B, ...]: at
        step t, rows 0 .. sizes[t] - 1 (in numpy: a few microseconds, where torch's small ops take tens)."""
        sizes = self._sizes
        T, B = len(sizes), int(sizes[0])
        at = np.repeat(np.arange(T) * B - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        return to_device(torch.from_numpy(at), self._like.data)

    def _positions_padded(self, data: torch.Tensor) -> torch.Tensor:
        B = int(self._sizes[0])
        return data.new_zeros((self._steps * B, *data.shape[1:])).index_copy(0, self._at, data).view(
            self._steps, B, *data.shape[1:])

    # -- through the kernels --------------------------------------------------------------------------
    def _stream(self, t: torch.Tensor) -> int:
        return torch._C._cuda_getCurrentRawStream(t.get_device())

    def _padded(self, data: torch.Tensor, hidden: int = 1, state_layers: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [T', B, ...] from data [N, ...] by the kernel, and the steps-left state where
        `state_layers`."""
        B, padded = int(self._sizes[0]), self._steps
        data = data.contiguous()
        x = data.new_empty((padded, B, *data.shape[1:]))
        steps = (torch.empty((state_layers, B, hidden), dtype=torch.float32, device=data.device)
                 if state_layers else None)
        with ops.made_current(data):
            self._rows.unpack(data.data_ptr(), x.data_ptr(), 0 if steps is None else steps.data_ptr(),
                              self._sizes, padded, data.numel() // data.shape[0], hidden, state_layers,
                              self._stream(data))
        return x, steps

    def _packed_data(self, y: torch.Tensor) -> torch.Tensor:
        """The packed data [N, ...] of y [T', B, ...] by the kernel."""
        y = y.contiguous()
        data = y.new_empty((int(self._sizes.sum()), *y.shape[2:]))
        with ops.made_current(y):
            self._rows.pack(y.data_ptr(), data.data_ptr(), self._sizes, data.numel() // data.shape[0],
                            self._stream(y))
        return data

    # -- back ------------------------------------------------------------------------------------------
    def pack(self, y: torch.Tensor) -> PackedSequence:
        """y [T, B, ...] in this order of rows as a PackedSequence of the input's layout."""
        like = self._like
        if self._rows is None:
            data = y.reshape(-1, *y.shape[2:]).index_select(0, self._at)
        elif torch.is_grad_enabled() and y.requires_grad:
            data = _Packed.apply(y, self)
        else:
            data = self._packed_data(y.detach())
        return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)

    def sorted(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """States [n, B, H] in the batch's order, in this one (a module's kept zeros as they are: the
        same in any order of rows, and kept by the runner in the types its plans store them in)."""
        order = self._like.sorted_indices
        if order is None:
            return list(states)
        return [s if made_here(s) else s.index_select(1, order) for s in states]

    def unsorted(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """States [n, B, H] in this order, in the batch's."""
        order = self._like.unsorted_indices
        return list(states) if order is None else [s.index_select(1, order) for s in states]


class _Padded(torch.autograd.Function):
    """x and the steps-left state from the packed data by the kernel; x's gradient packed back by the
    other (the padding's: nothing)."""

    @staticmethod
    def forward(ctx, data, unpacked: Unpacked, hidden: int, state_layers: int):
        ctx.unpacked = unpacked
        x, steps = unpacked._padded(data, hidden, state_layers)
        ctx.mark_non_differentiable(steps)
        return x, steps

    @staticmethod
    def backward(ctx, dx, _dsteps):
        return ctx.unpacked._packed_data(dx), None, None, None


class _Packed(torch.autograd.Function):
    """The packed data of y by the kernel; its gradient padded by the other (zeros past each row's
    length)."""

    @staticmethod
    def forward(ctx, y, unpacked: Unpacked):
        ctx.unpacked = unpacked
        return unpacked._packed_data(y)

    @staticmethod
    def backward(ctx, ddata):
        return ctx.unpacked._padded(ddata)[0], None
