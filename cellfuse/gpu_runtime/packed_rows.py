"""codegen.packed_rows' kernels launched on a caller's stream: a PackedSequence's rows moved between its
packed data and a padded tensor, given the memory's addresses and the batch sizes (on the host, as a
PackedSequence keeps them), which the launch's arguments carry by value.

    rows = PackedRows(4, 128, "sm_90")          # float32 elements, sequences of up to 128 steps
    args = rows.rows_args(sizes)                 # once per batch: its sizes and their offsets
    rows.unpack(data, x, steps, args, 104, 512, 512, 1, stream)
    rows.pack(y, out, args, 512, stream)
"""

from __future__ import annotations

from functools import cache

import numpy as np

from ..codegen.kernel_abi import BLOCK
from ..codegen.packed_rows import PACK_ROWS, UNPACK_ROWS, args_fields, launch_blocks, packed_rows_source
from . import driver
from .stream_program import loaded_module

_NUMPY = {"unsigned long long": "<u8", "long long": "<i8", "int": "<i4"}


@cache
def _args_dtype(steps_capacity: int) -> np.dtype:
    """The kernels' arguments as numpy lays them out: the C struct's fields in order, none padded."""
    return np.dtype([(name, _NUMPY[ctype], (count,) if count > 1 else ())
                     for name, ctype, count in args_fields(steps_capacity)])


class PackedRows:
    """Both kernels for elements of `itemsize` bytes and up to `steps_capacity` steps, loaded into the
    current context for `arch`."""

    def __init__(self, itemsize: int, steps_capacity: int, arch: str):
        what = f"the packed rows' kernels ({itemsize}-byte elements, up to {steps_capacity} steps)"
        module = loaded_module(what, packed_rows_source(itemsize, steps_capacity), arch)
        self.what = what
        self._unpack, self._pack = (int(module.function(name)) for name in (UNPACK_ROWS, PACK_ROWS))
        self.capacity = steps_capacity
        self._dtype = _args_dtype(steps_capacity)

    def lane_rows(self, rows: int) -> tuple[int, int, int]:
        """The padding kernel's function (its address), the steps its arguments hold and its blocks for
        `rows` rows (of x and the steps-left state), for a kept call's C++ lane (nn.quick_lane), which
        launches it."""
        return self._unpack, self.capacity, launch_blocks(rows)

    def rows_args(self, sizes: np.ndarray) -> np.ndarray:
        """The arguments' fields that a batch's launches share (its sizes, their offsets, T and B), which
        each launch copies and completes: a batch's rows are moved two to four times a training step."""
        if len(sizes) > self.capacity:
            raise ValueError(f"{len(sizes)} steps do not fit {self.what}")
        a = np.zeros((), self._dtype)
        a["T"], a["B"] = len(sizes), int(sizes[0])
        a["sizes"][:len(sizes)] = sizes
        a["offsets"][1:len(sizes)] = np.cumsum(sizes[:-1])
        return a

    @staticmethod
    def _args(rows_args: np.ndarray, src: int, dst: int, width: int, elements: int) -> np.ndarray:
        a = rows_args.copy()
        a["src"], a["dst"], a["elements"], a["W"] = src, dst, elements, width
        return a

    def _launch(self, function: int, args: np.ndarray, rows: int, stream: int, doing: str) -> None:
        # (the driver copies the arguments as it launches: they need not outlive the call)
        table = np.array([args.ctypes.data], dtype=np.uint64)
        driver.launch(function, launch_blocks(rows), BLOCK, stream, table.ctypes.data, doing)

    def unpack(self, data: int, x: int, steps: int, rows_args: np.ndarray, padded_steps: int, width: int,
               hidden: int, copies: int, stream: int) -> None:
        """x [padded_steps, B, width] from the packed data (zeros past each row's length) and, at `steps`
        (0: none), `copies` x [B, hidden] float32 steps-left values (each row's length); `rows_args`: the
        batch's (`rows_args`)."""
        B = int(rows_args["B"])
        a = self._args(rows_args, data, x, width, padded_steps * B * width)
        a["steps"], a["steps_elements"], a["H"] = steps, copies * B * hidden if steps else 0, hidden
        self._launch(self._unpack, a, padded_steps * B + (copies * B if steps else 0), stream,
                     "padding a PackedSequence")

    def pack(self, y: int, data: int, rows_args: np.ndarray, width: int, stream: int) -> None:
        """The packed data from a padded y [T' >= T, B, width] (`rows_args`: the batch's)."""
        T = int(rows_args["T"])
        rows = int(rows_args["offsets"][T - 1] + rows_args["sizes"][T - 1])
        a = self._args(rows_args, y, data, width, rows * width)
        self._launch(self._pack, a, rows, stream, "packing a padded sequence")
