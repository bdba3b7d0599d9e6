"""Runs for checking gradients: a cell, sizes, parameters, inputs and seeds, their gradients by the
float64 reference and by the numpy executor's backward Plan, and the comparison of two sets of gradients."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from cellfuse.codegen import make_plan
from cellfuse.codegen.plan import H100, Target
from cellfuse.gpu_runtime.numpy_backward import NumpyBackward
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import (
    OPS,
    Cell,
    Gradients,
    Sizes,
    analyze,
    init_params,
    run_reference_backward,
)

GRAPH_FAMILY = ("naive", "combined", "fused", "hoisted", "graph")
SIZES = Sizes(seq=4, batch=3, input=5, hidden=4, layers=2)


def reduces_rows(cell: Cell) -> bool:
    """Whether the cell has a row reduction (whose adjoint sums gradients over rows)."""
    return any(OPS[n.op].is_reduction for n in cell.nodes)


@dataclass
class Run:
    cell: Cell
    sizes: Sizes
    params: dict[str, np.ndarray]
    x: np.ndarray
    initial: dict[str, np.ndarray] | None  # None: the states start at zero, as when none are given
    dy: np.ndarray
    dfinal: dict[str, np.ndarray] | None

    def reference(self) -> Gradients:
        inputs = {"x": self.x, **(self.initial or {})}
        return run_reference_backward(self.cell, self.params, inputs, self.sizes.layers, self.dy, self.dfinal)

    def numpy(self, schedule: str, dtype=np.float64, target: Target = H100,
              reverse_blocks: bool = False, precision: str = "fp32") -> Gradients:
        """The gradients by the numpy executor's backward Plan (a persistent plan's made for `target`, its
        blocks run in decreasing order with `reverse_blocks`; a 16-bit `precision` emulated)."""
        s = self.sizes
        initial = self.initial or {st: np.zeros((s.layers, s.batch, s.hidden)) for st in self.cell.updates}
        plan = make_plan(self.cell, s, schedule, target, save_steps=True, precision=precision)
        forward = NumpyExecutor(plan, self.params, dtype, reverse_blocks=reverse_blocks)
        forward.run(self.x, initial)
        return NumpyBackward(forward).run(self.dy.astype(dtype), self.dfinal)

    def cuda(self, schedule: str, precision: str = "fp32") -> Gradients:
        """The gradients by the CUDA executor's backward Plan, float32 (on a GPU only)."""
        from cellfuse.gpu_runtime.cuda_backward import CudaBackward
        from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

        s = self.sizes
        plan = make_plan(self.cell, s, schedule, device_target(), save_steps=True, precision=precision)
        initial = self.initial or {st: np.zeros((s.layers, s.batch, s.hidden)) for st in self.cell.updates}
        forward = CudaExecutor(plan, self.params)
        backward = None
        try:
            forward.run(self.x, initial)
            backward = CudaBackward(forward)
            return backward.run(self.dy, self.dfinal)
        finally:
            if backward is not None:
                backward.close()
            forward.close()


def make_run(cell: Cell, layers: int = 2, seed: int = 0, initial: bool = True, dfinal: bool = True,
             sizes: Sizes = SIZES, scale: float = 2.0) -> Run:
    sizes = replace(sizes, layers=layers)
    if analyze(cell).ties:  # a cell that ties the two widths runs only where they are equal
        sizes = replace(sizes, input=sizes.hidden)
    rng = np.random.default_rng(seed)
    # twice PyTorch's scale by default, so that the gates work away from their linear middle
    params = {k: scale * v.astype(np.float64)
              for k, v in init_params(cell, layers, sizes.input, sizes.hidden, seed).items()}
    shape = (layers, sizes.batch, sizes.hidden)
    return Run(cell, sizes, params, rng.standard_normal((sizes.seq, sizes.batch, sizes.input)),
               {s: rng.standard_normal(shape) for s in cell.updates} if initial else None,
               rng.standard_normal((sizes.seq, sizes.batch, sizes.hidden)),
               {s: rng.standard_normal(shape) for s in cell.updates} if dfinal else None)


def sixteen_bit_error(got: Gradients, want: Gradients) -> tuple[float, str]:
    """The largest error of a 16-bit run's gradients, each relative to its own largest magnitude or
    precision.SIXTEEN_BIT_GRADIENT_FLOOR of the largest of all where that is more, and the gradient it is
    in."""
    from cellfuse.codegen.precision import SIXTEEN_BIT_GRADIENT_FLOOR

    pairs = [("x", got.dx, want.dx),
             *((f"initial {s}", got.dinitial[s], v) for s, v in want.dinitial.items()),
             *((key, got.dparams[key], v) for key, v in want.dparams.items())]
    largest = max(float(np.max(np.abs(w), initial=0.0)) for _, _, w in pairs)
    return max((float(np.max(np.abs(g.astype(np.float64) - w))) /
                max(float(np.max(np.abs(w), initial=0.0)), SIXTEEN_BIT_GRADIENT_FLOOR * largest), name)
               for name, g, w in pairs)


def assert_gradients(got: Gradients, want: Gradients, rtol: float, what: str = "") -> None:
    """Each gradient within rtol of the reference's, relative to the largest magnitude of that gradient
    (an element near 0 is the difference of larger terms), and never closer than the rounding noise of
    the dtype at the magnitude of all the run's gradients (a gradient that cancels to about 1e-17 is 0)."""
    pairs = [("x", got.dx, want.dx),
             *((f"initial {s}", got.dinitial[s], v) for s, v in want.dinitial.items()),
             *((key, got.dparams[key], v) for key, v in want.dparams.items())]
    assert set(got.dparams) == set(want.dparams) and set(got.dinitial) == set(want.dinitial)
    overall = max(float(np.max(np.abs(w), initial=0.0)) for _, _, w in pairs)
    noise = 100 * np.finfo(got.dx.dtype).eps * overall
    for name, g, w in pairs:
        assert g.shape == w.shape, f"{what} d{name}: shape {g.shape}, expected {w.shape}"
        scale = float(np.max(np.abs(w), initial=0.0))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=max(rtol * scale, noise), err_msg=f"{what} d{name}")
