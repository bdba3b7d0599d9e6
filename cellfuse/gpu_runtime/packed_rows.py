"""codegen.packed_rows' kernels launched on a caller's stream: a PackedSequence's rows moved between its
packed data and a padded tensor, given the memory's addresses and the batch sizes (on the host, as a
PackedSequence keeps them), which the launch's arguments carry by value. (cf_zero_rows and cf_reverse_rows,
for rows of lengths of their own, are launched by nn.quick_lane's C++ alone: where that is not built,
torch's ops zero the padding and reverse the rows.)

    rows = PackedRows(4, 128, "sm_90")          # float32 elements, sequences of up to 128 steps
    args = rows.rows_args(sizes)                 # once per batch: its sizes and their offsets
    rows.unpack(data, x, steps, args, 104, 512, 512, 1, stream)
    rows.pack(y, out, args, 512, stream)
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from functools import cache

import numpy as np

from ..codegen.kernel_abi import BLOCK
from ..codegen.packed_rows import (
    PACK_ROWS,
    REVERSE_ROWS,
    UNPACK_ROWS,
    ZERO_ROWS,
    args_fields,
    launch_blocks,
    lengths_args_fields,
    packed_rows_source,
)
from . import driver
from .stream_program import loaded_module

_CODES = {"unsigned long long": "Q", "long long": "q", "int": "i"}
# the fields before the batch sizes, which each launch writes: src, dst, steps, elements, steps_elements,
# T, B, W, H
_HEAD_FIELDS = 9


@cache
def args_struct(steps_capacity: int, fields: int | None = None, lengths: bool = False) -> struct.Struct:
    """The kernels' arguments (or their first `fields` fields; `lengths`: cf_zero_rows's) as the host lays
    them out: the C struct's fields in order, none padded."""
    of = (lengths_args_fields if lengths else args_fields)(steps_capacity)
    return struct.Struct("<" + "".join(f"{count if count > 1 else ''}{_CODES[ctype]}"
                                       for _, ctype, count in of[:fields]))


@dataclass(frozen=True)
class RowsArgs:
    """What a batch's launches share (`PackedRows.rows_args`): the arguments' bytes with its sizes, their
    offsets, T and B written, and its T, B and packed rows."""

    data: bytes
    T: int
    B: int
    rows: int


class PackedRows:
    """The kernels for elements of `itemsize` bytes and up to `steps_capacity` steps (or rows, for
    cf_zero_rows and cf_reverse_rows), loaded into the current context for `arch`."""

    def __init__(self, itemsize: int, steps_capacity: int, arch: str):
        what = f"the packed rows' kernels ({itemsize}-byte elements, up to {steps_capacity} steps)"
        module = loaded_module(what, packed_rows_source(itemsize, steps_capacity), arch)
        self.what = what
        self._unpack, self._pack, self._zero, self._reverse = (
            int(module.function(name)) for name in (UNPACK_ROWS, PACK_ROWS, ZERO_ROWS, REVERSE_ROWS))
        self.capacity = steps_capacity

    @property
    def functions(self) -> tuple[int, int, int, int]:
        """The kernels' functions (their addresses): the padding's, the packing's, the zeroing's and the
        reversal's, for the C++ that launches them (nn.quick_lane)."""
        return self._unpack, self._pack, self._zero, self._reverse

    def lane_rows(self, rows: int) -> tuple[int, int, int]:
        """The padding kernel's function (its address), the steps its arguments hold and its blocks for
        `rows` rows (of x and the steps-left state), for a kept call's C++ lane (nn.quick_lane), which
        launches it."""
        return self._unpack, self.capacity, launch_blocks(rows)

    def rows_args(self, sizes: np.ndarray) -> RowsArgs:
        """The arguments that a batch's launches share (its sizes, their offsets, T and B), which each
        launch copies and completes: a batch's rows are moved two to four times a training step."""
        T, capacity = len(sizes), self.capacity
        if T > capacity:
            raise ValueError(f"{T} steps do not fit {self.what}")
        padded = np.zeros(capacity, np.int64)
        padded[:T] = sizes
        offsets = np.zeros(capacity, np.int64)
        offsets[1:T] = np.cumsum(sizes[:-1])
        B = int(sizes[0])
        data = args_struct(capacity).pack(0, 0, 0, 0, 0, T, B, 0, 0, *padded.tolist(), *offsets.tolist())
        return RowsArgs(data, T, B, int(sizes.sum()))

    def _launch(self, function: int, a: RowsArgs, head: tuple, rows: int, stream: int, doing: str) -> None:
        """One launch, its arguments `a`'s with the fields before the sizes (src, dst, steps, elements,
        steps_elements, W, H) given: written into a copy of its bytes by struct, where numpy's structured
        copy and field by field writes took 4 of a launch's 14 us on an H200's host."""
        src, dst, steps, elements, steps_elements, width, hidden = head
        data = bytearray(a.data)
        args_struct(self.capacity, _HEAD_FIELDS).pack_into(data, 0, src, dst, steps, elements, steps_elements,
                                                           a.T, a.B, width, hidden)
        arg = (ctypes.c_char * len(data)).from_buffer(data)
        table = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
        # (the driver copies the arguments as it launches: they need not outlive the call)
        driver.launch(function, launch_blocks(rows), BLOCK, stream, ctypes.addressof(table), doing)

    def unpack(self, data: int, x: int, steps: int, rows_args: RowsArgs, padded_steps: int, width: int,
               hidden: int, copies: int, stream: int) -> None:
        """x [padded_steps, B, width] from the packed data (zeros past each row's length) and, at `steps`
        (0: none), `copies` x [B, hidden] float32 steps-left values (each row's length); `rows_args`: the
        batch's (`rows_args`)."""
        B = rows_args.B
        head = (data, x, steps, padded_steps * B * width, copies * B * hidden if steps else 0, width, hidden)
        self._launch(self._unpack, rows_args, head, padded_steps * B + (copies * B if steps else 0), stream,
                     "padding a PackedSequence")

    def pack(self, y: int, data: int, rows_args: RowsArgs, width: int, stream: int) -> None:
        """The packed data from a padded y [T' >= T, B, width] (`rows_args`: the batch's)."""
        rows = rows_args.rows
        self._launch(self._pack, rows_args, (y, data, 0, rows * width, 0, width, 0), rows, stream,
                     "packing a padded sequence")

