"""One forward pass of a cell with a chosen schedule and backend."""

from __future__ import annotations

from collections.abc import Callable, Collection

import numpy as np

from ..codegen import make_plan
from ..codegen.plan import H100
from ..codegen.precision import check_precision
from ..graph_model import Cell, CellError, Forward, Sizes, resolve_run
from .auto_schedule import AUTO, choose_schedule


def run_schedule(cell: Cell, params: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
                 layers: int | None, schedule: str, backend: str, dtype=np.float32,
                 chosen: Callable[[str], None] | None = None, precision: str = "fp32",
                 float32_states: Collection[str] | None = None) -> Forward:
    """Runs the Plan of `schedule` in `precision` on `backend` ("numpy" or "cuda"; numpy emulates a 16-bit
    precision in `dtype`; `float32_states` as make_plan takes them). For schedule "auto", `chosen` is told
    which schedule that is, and why."""
    layers, hidden, x, initial = resolve_run(cell, params, inputs, layers)
    sizes = Sizes(seq=x.shape[0], batch=x.shape[1], input=x.shape[2], hidden=hidden, layers=layers)
    check_precision(precision)
    if backend not in ("numpy", "cuda"):
        raise CellError(f"unknown backend '{backend}' (backends: numpy, cuda)")
    if backend == "cuda":
        from .cuda_executor import CudaExecutor, device_target

        target = device_target()
    else:
        target = H100
    if schedule == AUTO:
        choice = choose_schedule(cell, sizes, backend, precision=precision)
        schedule = choice.schedule
        if chosen is not None:
            chosen(choice.why)
    plan = make_plan(cell, sizes, schedule, target, precision=precision, float32_states=float32_states)
    if backend == "numpy":
        from .numpy_executor import NumpyExecutor

        result = NumpyExecutor(plan, params, dtype).run(x, initial)
    else:
        result = CudaExecutor(plan, params).run(x, initial)
    if not np.all(np.isfinite(result.y)):
        raise CellError(f"schedule '{schedule}' on {backend}: the output holds NaN or infinity")
    return result
