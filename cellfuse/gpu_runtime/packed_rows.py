"""codegen.packed_rows' kernels launched on a caller's stream: a PackedSequence's rows moved between its
packed data and a padded tensor, given the memory's addresses and the batch sizes (on the host, as a
PackedSequence keeps them), which the launch's arguments carry by value.

    rows = PackedRows(4, 128, "sm_90")          # float32 elements, sequences of up to 128 steps
    rows.unpack(data, x, steps, sizes, 104, 512, 512, 1, stream)
    rows.pack(y, out, sizes, 512, stream)
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
        self.cu, self.what = driver.bindings(), what
        self._unpack, self._pack = module.function(UNPACK_ROWS), module.function(PACK_ROWS)
        self.capacity = steps_capacity
        self._dtype = _args_dtype(steps_capacity)

    def lane_rows(self, rows: int) -> tuple[int, int, int]:
        """The padding kernel's function (its address), the steps its arguments hold and its blocks for
        `rows` rows (of x and the steps-left state), for a kept call's C++ lane (nn.quick_lane), which
        launches it."""
        return int(self._unpack), self.capacity, launch_blocks(rows)

    def _args(self, src: int, dst: int, sizes: np.ndarray, width: int, elements: int) -> np.ndarray:
        if len(sizes) > self.capacity:
            raise ValueError(f"{len(sizes)} steps do not fit {self.what}")
        a = np.zeros((), self._dtype)
        a["src"], a["dst"], a["elements"] = src, dst, elements
        a["T"], a["B"], a["W"] = len(sizes), int(sizes[0]), width
        a["sizes"][:len(sizes)] = sizes
        a["offsets"][1:len(sizes)] = np.cumsum(sizes[:-1])
        return a

    def _launch(self, function, args: np.ndarray, rows: int, stream: int, doing: str) -> None:
        # (the driver copies the arguments as it launches: they need not outlive the call)
        table = np.array([args.ctypes.data], dtype=np.uint64)
        driver.check(self.cu.cuLaunchKernel(function, launch_blocks(rows), 1, 1, BLOCK, 1, 1, 0,
                                            driver.as_stream(stream), table.ctypes.data, 0), doing)

    def unpack(self, data: int, x: int, steps: int, sizes: np.ndarray, padded_steps: int, width: int,
               hidden: int, copies: int, stream: int) -> None:
        """x [padded_steps, B, width] from the packed data (zeros past each row's length) and, at `steps`
        (0: none), `copies` x [B, hidden] float32 steps-left values (each row's length)."""
        B = int(sizes[0])
        a = self._args(data, x, sizes, width, padded_steps * B * width)
        a["steps"], a["steps_elements"], a["H"] = steps, copies * B * hidden if steps else 0, hidden
        self._launch(self._unpack, a, padded_steps * B + (copies * B if steps else 0), stream,
                     "padding a PackedSequence")

    def pack(self, y: int, data: int, sizes: np.ndarray, width: int, stream: int) -> None:
        """The packed data from a padded y [T' >= len(sizes), B, width]."""
        rows = int(sizes.sum())
        a = self._args(y, data, sizes, width, rows * width)
        self._launch(self._pack, a, rows, stream, "packing a padded sequence")
