"""The kernels that move a batch's rows into the padded tensor the cell runs over and back (codegen.
packed_rows: a PackedSequence's padding and packing, the zeroing of the padding of rows of lengths of their
own and their reversal in time), loaded once per device, element size and capacity, with the C++ that
launches them (quick_lane.rows).
Where they cannot be used (the CPU, torch.compile's tracing, a CUDA graph capture before they were loaded,
more steps or rows than a launch's arguments hold, 2**31 rows of packed data or steps of x or more,
elements of other sizes than 2 and 4 bytes), torch's ops do the same instead.
"""

from __future__ import annotations

import logging

import torch

from ..codegen.packed_rows import MAX_STEPS, capacity
from ..graph_model import CellError
from . import ops, quick_lane
from .tracing import traced

log = logging.getLogger(__name__)

_kernels: dict[tuple[int, int, int], tuple | None] = {}  # (device, itemsize, capacity) -> see rows_kernels


def rows_kernels(data: torch.Tensor, count: int) -> tuple | None:
    """The kernels (gpu_runtime.packed_rows.PackedRows) for data's device and elements and `count` steps
    (a PackedSequence's) or rows (a batch's, for the zeroing), loaded at their first use, and the same
    launched in C++ (quick_lane.rows; None where it is not built); None where torch's ops move the rows
    instead (see the module's docstring)."""
    if (data.device.type != "cuda" or traced() or count > MAX_STEPS
            or data.element_size() not in (2, 4) or data.shape[0] >= 2**31
            or data.numel() == 0):  # (rows of no elements: the kernels divide by a row's width)
        return None
    key = (data.get_device(), data.element_size(), capacity(count))
    if key in _kernels:
        return _kernels[key]
    from ..gpu_runtime.packed_rows import PackedRows

    major, minor = torch.cuda.get_device_capability(data.device)
    with ops.made_current(data):
        if torch.cuda.is_current_stream_capturing():  # (loading a module would break the capture)
            return None
        try:
            kernels = PackedRows(key[1], key[2], f"sm_{major}{minor}")
        except CellError as e:
            log.warning("the packed rows' kernels could not be made (%s); torch's ops move rows instead", e)
            made = None
        else:
            try:
                made = (kernels, quick_lane.rows(kernels, key[0], key[1]))
            except (CellError, ValueError) as e:  # (the driver's context or entry points not found)
                log.warning("the packed rows' kernels cannot be launched from C++ (%s); Python launches "
                            "a PackedSequence's, and torch's ops zero the padding of rows of lengths of "
                            "their own and reverse them", e)
                made = (kernels, None)
    _kernels[key] = made
    return made
