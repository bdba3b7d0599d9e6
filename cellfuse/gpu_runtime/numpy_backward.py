"""The backward pass of a numpy executor's forward run: the backward Plan's launches on the forward run's
own saved buffers, in the executor's dtype (a 16-bit plan's emulated, as its forward run is).

    forward = NumpyExecutor(make_plan(cell, sizes, schedule, save_steps=True), params, np.float64)
    out = forward.run(x, initial)
    grads = NumpyBackward(forward).run(dy, dfinal)  # graph_model.Gradients: dx, dinitial, dparams
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..codegen.backward_plan import BackwardPlan, backward_plan
from ..codegen.dtypes import FLOAT32
from ..graph_model import Gradients
from .numpy_executor import NumpyExecutor


class NumpyBackward:
    """The gradient buffers of a forward executor's plan (beside its own, in its `buf`) and the backward
    Plan's program. `run` reads what the executor's last forward run saved."""

    def __init__(self, forward: NumpyExecutor):
        self.forward = forward
        self.plan: BackwardPlan = backward_plan(forward.plan)
        self.instructions = self.plan.instructions()
        for name, b in self.plan.buffers.items():
            forward.buf[name] = np.empty(self.plan.buffer_elements(name), forward.dtype)
            if b.dtype != FLOAT32:  # a 16-bit gradient (of a 16-bit plan's GEMM output): stored rounded
                forward.rounded[name] = b.dtype

    def run(self, dy: np.ndarray, dfinal: Mapping[str, np.ndarray] | None = None) -> Gradients:
        """The gradients of sum(dy * y) + sum(dfinal[s] * final[s]) for the forward run, in the executor's
        dtype (see BackwardPlan.seeds for the seeds); raises CellError for a seed that does not fit."""
        buf = self.forward.buf
        seeds = self.plan.seeds(dy, dfinal, self.forward.dtype)
        for name in self.plan.buffers:
            if name in seeds:
                buf[name][:] = seeds[name]
            else:
                buf[name].fill(self.plan.start_value(name))
        for instr in self.instructions:
            self.forward.execute(instr)
        return self.plan.gradients(lambda name: buf[name])
