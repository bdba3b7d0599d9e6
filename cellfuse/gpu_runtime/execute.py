"""One forward pass of a cell with a chosen schedule and backend."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..codegen import make_plan
from ..codegen.precision import check_precision
from ..graph_model import Cell, CellError, Forward, Sizes, resolve_run
from .auto_schedule import AUTO, choose_schedule


def run_schedule(cell: Cell, params: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
                 layers: int | None, schedule: str, backend: str, dtype=np.float32,
                 chosen: Callable[[str], None] | None = None, precision: str = "fp32") -> Forward:
    """Runs the Plan of `schedule` in `precision` on `backend` ("numpy" or "cuda"; numpy emulates a 16-bit
    precision in `dtype`). For schedule "auto", `chosen` is told which schedule that is, and why."""
    layers, hidden, x, initial = resolve_run(cell, params, inputs, layers)
    sizes = Sizes(seq=x.shape[0], batch=x.shape[1], input=x.shape[2], hidden=hidden, layers=layers)
    check_precision(precision)
    if schedule == AUTO and precision != "fp32":
        raise CellError(f"auto chooses among the float32 rungs only so far: name a rung for {precision} "
                        "(graph or wavefront)")
    if schedule == AUTO:
        choice = choose_schedule(cell, sizes, backend)
        schedule = choice.schedule
        if chosen is not None:
            chosen(choice.why)
    if backend == "numpy":
        from .numpy_executor import NumpyExecutor

        plan = make_plan(cell, sizes, schedule, precision=precision)
        result = NumpyExecutor(plan, params, dtype).run(x, initial)
    elif backend == "cuda":
        from .cuda_executor import CudaExecutor, device_target

        plan = make_plan(cell, sizes, schedule, device_target(), precision=precision)
        result = CudaExecutor(plan, params).run(x, initial)
    else:
        raise CellError(f"unknown backend '{backend}' (backends: numpy, cuda)")
    if not np.all(np.isfinite(result.y)):
        raise CellError(f"schedule '{schedule}' on {backend}: the output holds NaN or infinity")
    return result
