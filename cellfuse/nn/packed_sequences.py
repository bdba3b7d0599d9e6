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
tracing, a CUDA graph capture before the kernels were loaded, more steps than a launch's arguments
hold, 2**31 rows or more, elements of other sizes than 2 and 4 bytes) torch's ops pad and pack.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import numpy as np
import torch
from torch.autograd.function import once_differentiable
from torch.nn.utils.rnn import PackedSequence

from ..graph_model import CellError
from . import ops
from .row_kernels import rows_kernels
from .stacks import steps_left, to_device
from .zeros import made_here

STEPS_MULTIPLE = 4  # a PackedSequence's steps are run in multiples of this (see Unpacked)


def _checked(sizes: np.ndarray, rows: int) -> None:
    """Raises CellError where batch sizes are not a PackedSequence's of `rows` rows (the kernels would read
    past the data of sizes that do not add up)."""
    if len(sizes) == 0 or sizes[-1] < 1 or (sizes[1:] > sizes[:-1]).any() or sizes.sum() != rows:
        raise CellError(f"a PackedSequence's batch sizes must not grow, be at least 1 and add up to its "
                        f"data's {rows} rows; got {sizes.tolist()}")


class _Rows:
    """A PackedSequence's rows as the kernels for one size of elements move them: its batch sizes (a CPU
    tensor, as torch keeps them) and those kernels, no tensors of the GPU (an autograd Function's context
    keeps it: one that held the padded x would keep it alive, through x's grad_fn, until Python's cycle
    collector came by). The C++ launches them where it is built (quick_lane.rows: it checks the sizes
    too, and answers None for what it does not move); else, or where it answers None, Python does."""

    def __init__(self, batch_sizes: torch.Tensor, kernels: tuple):
        self.batch_sizes = batch_sizes
        self.kernels, self._fast = kernels

    @cached_property
    def sizes(self) -> np.ndarray:
        return self.batch_sizes.numpy()

    @cached_property
    def _args(self):
        return self.kernels.rows_args(self.sizes)

    @staticmethod
    def _stream(t: torch.Tensor) -> int:
        return torch._C._cuda_getCurrentRawStream(t.get_device())

    def padded(self, data: torch.Tensor, steps: int, hidden: int = 1, state_layers: int = 0
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [steps, B, ...] from data [N, ...], and the steps-left state where `state_layers`."""
        if self._fast is not None:
            done = self._fast.padded(data, self.batch_sizes, steps, hidden, state_layers, self._stream(data))
            if done is not None:
                return done
        _checked(self.sizes, data.shape[0])
        B = int(self.sizes[0])
        data = data.contiguous()
        x = data.new_empty((steps, B, *data.shape[1:]))
        left = (torch.empty((state_layers, B, hidden), dtype=torch.float32, device=data.device)
                if state_layers else None)
        with ops.made_current(data):
            self.kernels.unpack(data.data_ptr(), x.data_ptr(), 0 if left is None else left.data_ptr(),
                                self._args, steps, data.numel() // data.shape[0], hidden, state_layers,
                                self._stream(data))
        return x, left

    def packed(self, y: torch.Tensor) -> torch.Tensor:
        """The packed data [N, ...] of y [T' >= T, B, ...] (its sizes checked as its padding was)."""
        if self._fast is not None:
            done = self._fast.packed(y, self.batch_sizes, self._stream(y))
            if done is not None:
                return done
        y = y.contiguous()
        data = y.new_empty((int(self.sizes.sum()), *y.shape[2:]))
        with ops.made_current(y):
            self.kernels.pack(y.data_ptr(), data.data_ptr(), self._args, data.numel() // data.shape[0],
                              self._stream(y))
        return data


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
        self.x: torch.Tensor | None = None
        self.steps: torch.Tensor | None = None

    @cached_property
    def _rows(self) -> _Rows | None:
        """The kernels' rows for the data (looked up when first needed: a kept call's lane pads the data
        itself, and the call's packing of y after its launch is host time the GPU does not wait for)."""
        return self._rows_for(self._like.data)

    def _rows_for(self, t: torch.Tensor) -> _Rows | None:
        """The kernels' rows for tensors of t's device and elements, or None (torch's ops move them)."""
        kernels = rows_kernels(t, self._steps)
        return None if kernels is None else _Rows(self._like.batch_sizes, kernels)

    def ends(self, hidden: int, state_layers: int) -> Ends | None:
        """How the ops' training call pads the data and packs y back itself (ops.run's `ends`), for a call
        of `state_layers` layers of `hidden`; None where the kernels do not move these rows."""
        if self._rows is None:
            return None
        like = self._like
        return Ends(self._rows, self._steps, hidden, state_layers, like.sorted_indices, like.unsorted_indices)

    def pad(self, hidden: int, state_layers: int) -> None:
        """x and the steps-left state made (see the class's docstring), the batch sizes checked."""
        data = self._like.data
        if self._rows is None:
            _checked(self._sizes, data.shape[0])
            self.x = self._positions_padded(data)
            self.steps = steps_left(self.lengths, state_layers, self.x, hidden)
        elif torch.is_grad_enabled() and data.requires_grad:
            self.x, self.steps = _Padded.apply(data, self._rows, self._steps, hidden, state_layers)
        else:
            self.x, self.steps = self._rows.padded(data.detach(), self._steps, hidden, state_layers)

    def lane_rows(self, state_layers: int) -> tuple[int, int, int] | None:
        """What a lane needs to pad a float32 PackedSequence like this one for a call of `state_layers`
        layers (quick_lane.make's `rows`), or None where the kernels do not pad it."""
        if self._rows is None or self._like.data.dtype != torch.float32:
            return None
        return self._rows.kernels.lane_rows((self._steps + state_layers) * int(self._sizes[0]))

    @cached_property
    def lengths(self) -> torch.Tensor:
        """The rows' lengths, in this order (CPU, int64): row b's, how many steps' batch sizes exceed b,
        found by a binary search in the non-increasing sizes (6 us at T=100, B=64, where counting them
        over a [T, B] comparison took 18)."""
        sizes = self._sizes
        return torch.from_numpy(np.searchsorted(-sizes, -np.arange(int(sizes[0])), side="left"))

    @cached_property
    def _at(self) -> torch.Tensor:
        """Where each element of the packed data (step by step, longest row first) is in x [T * B, ...]: at
        step t, rows 0 .. sizes[t] - 1 (in numpy: a few microseconds, where torch's small ops take tens)."""
        sizes = self._sizes
        T, B = len(sizes), int(sizes[0])
        at = np.repeat(np.arange(T) * B - (np.cumsum(sizes) - sizes), sizes) + np.arange(int(sizes.sum()))
        return to_device(torch.from_numpy(at), self._like.data)

    def _positions_padded(self, data: torch.Tensor) -> torch.Tensor:
        B, steps = int(self._sizes[0]), self._steps
        return data.new_zeros((steps * B, *data.shape[1:])).index_copy(0, self._at, data).view(
            steps, B, *data.shape[1:])

    def padded_shape(self) -> tuple[int, ...]:
        """The shape of x, as `pad` makes it."""
        data = self._like.data
        return (self._steps, int(self._sizes[0]), *data.shape[1:])

    # -- back ------------------------------------------------------------------------------------------
    def sequence(self, data: torch.Tensor) -> PackedSequence:
        """Packed data of the input's rows as a PackedSequence of the input's layout."""
        like = self._like
        return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)

    def pack(self, y: torch.Tensor) -> PackedSequence:
        """y [T' >= T, B, ...] in this order of rows as a PackedSequence of the input's layout (by the
        kernels for y's elements where there are some: under torch.autocast y's differ from x's)."""
        like, rows = self._like, self._rows
        if rows is not None and y.element_size() != like.data.element_size():
            rows = self._rows_for(y)
        if rows is None:
            data = y[:self._steps].reshape(-1, *y.shape[2:]).index_select(0, self._at)
        elif torch.is_grad_enabled() and y.requires_grad:
            data = _Packed.apply(y, rows)
        else:
            data = rows.packed(y.detach())
        return self.sequence(data)

    def sorted(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """States [n, B, H] in the batch's order, in this one (see _reordered)."""
        return _reordered(states, self._like.sorted_indices)

    def unsorted(self, states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """States [n, B, H] in this order, in the batch's."""
        return _reordered(states, self._like.unsorted_indices)


def _reordered(states: Sequence[torch.Tensor | None], order: torch.Tensor | None
               ) -> list[torch.Tensor | None]:
    """States [n, B, H] with their rows in `order` (None: as they are); None stays None, and a module's
    kept zeros stay as they are (the same in any order of rows, and kept by the runner in the types its
    plans store them in)."""
    if order is None:
        return list(states)
    return [s if s is None or made_here(s) else s.index_select(1, order) for s in states]


class Ends:
    """A PackedSequence as a training call of the ops pads its data and packs y back, inside one autograd
    node (ops._Eager), and their gradients the other way: where the padding, the packing and the two
    reorderings of states were each a node of autograd's graph, their host time (the recording, and the
    engine's calls in the backward pass) kept the GPU waiting between the forward and backward kernels
    of a step timed alone. Holds no tensor that requires a gradient (an autograd context keeps it)."""

    def __init__(self, rows: _Rows, steps: int, hidden: int, state_layers: int, order: torch.Tensor | None,
                 unorder: torch.Tensor | None):
        self._rows, self._steps, self._hidden, self._state_layers = rows, steps, hidden, state_layers
        self._order, self._unorder = order, unorder

    def padded(self, data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [steps, B, ...] and the steps-left state of the call, from the data."""
        return self._rows.padded(data, self._steps, self._hidden, self._state_layers)

    def packed(self, y: torch.Tensor) -> torch.Tensor:
        """The packed data of y (or of x's gradient)."""
        return self._rows.packed(y)

    def gradient_padded(self, ddata: torch.Tensor) -> torch.Tensor:
        """y's gradient padded (zeros past each row's length) from the packed data's."""
        return self._rows.padded(ddata, self._steps)[0]

    def sorted(self, states: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """States (or final states' gradients) in the batch's order of rows, in the data's."""
        return _reordered(states, self._order)

    def unsorted(self, states: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Final states (or initial states' gradients) in the data's order of rows, in the batch's."""
        return _reordered(states, self._unorder)


class _Padded(torch.autograd.Function):
    """x and the steps-left state from the packed data by the kernel; x's gradient packed back by the
    other (the padding's: nothing)."""

    @staticmethod
    def forward(ctx, data, rows: _Rows, steps: int, hidden: int, state_layers: int):
        ctx.rows = rows
        x, left = rows.padded(data, steps, hidden, state_layers)
        ctx.mark_non_differentiable(left)
        return x, left

    @staticmethod
    @once_differentiable
    def backward(ctx, dx, _dleft):
        return ctx.rows.packed(dx), None, None, None, None


class _Packed(torch.autograd.Function):
    """The packed data of y by the kernel; its gradient padded by the other (zeros past each row's
    length), to y's steps."""

    @staticmethod
    def forward(ctx, y, rows: _Rows):
        ctx.rows, ctx.steps = rows, y.shape[0]
        return rows.packed(y)

    @staticmethod
    @once_differentiable
    def backward(ctx, ddata):
        return ctx.rows.padded(ddata, ctx.steps)[0], None
