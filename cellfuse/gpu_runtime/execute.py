"""One forward pass of a cell with a chosen schedule and backend."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..codegen import make_plan
from ..graph_model import Cell, CellError, Forward, Sizes, resolve_run
from .auto_schedule import AUTO, choose_schedule


def run_schedule(cell: Cell, params: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
                 layers: int | None, schedule: str, backend: str, dtype=np.float32,
                 chosen: Callable[[str], None] | None = None) -> Forward:
    """Runs the Plan of `schedule` on `backend` ("numpy" or "cuda"). For schedule "auto", `chosen` is
    told which schedule that is, and why."""
    layers, hidden, x, initial = resolve_run(cell, params, inputs, layers)
    sizes = Sizes(seq=x.shape[0], batch=x.shape[1], input=x.shape[2], hidden=hidden, layers=layers)
    if schedule == AUTO:
        choice = choose_schedule(cell, sizes, backend)
        schedule = choice.schedule
        if chosen is not None:
            chosen(choice.why)
    if backend == "numpy":
        from .numpy_executor import NumpyExecutor

        result = NumpyExecutor(make_plan(cell, sizes, schedule), params, dtype).run(x, initial)
    elif backend == "cuda":
        from .cuda_executor import CudaExecutor, device_target

        result = CudaExecutor(make_plan(cell, sizes, schedule, device_target()), params).run(x, initial)
    else:
        raise CellError(f"unknown backend '{backend}' (backends: numpy, cuda)")
    if not np.all(np.isfinite(result.y)):
        raise CellError(f"schedule '{schedule}' on {backend}: the output holds NaN or infinity")
    return result
