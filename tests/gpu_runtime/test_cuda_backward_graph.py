"""The backward program replayed from a CUDA graph where the forward plan has one: captured once, at the
first run, and replayed by every run after it, with the reference's gradients each time."""

from __future__ import annotations

import numpy as np
import pytest
from gradient_runs import assert_gradients, make_run

from cellfuse.codegen import make_plan
from cellfuse.graph_model import Sizes, load_template

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("schedule, graphed", [("hoisted", False), ("graph", True), ("persistent", True)])
def test_gpu_the_backward_pass_is_captured_once_where_the_forward_pass_is(gpu, schedule, graphed):
    from cellfuse.gpu_runtime.cuda_backward import CudaBackward
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    run = make_run(load_template("gru_cho"), 2, seed=3, sizes=Sizes(seq=7, batch=5, input=24, hidden=40))
    s = run.sizes
    forward = CudaExecutor(make_plan(run.cell, s, schedule, device_target(), save_steps=True), run.params)
    backward = None
    try:
        forward.run(run.x, run.initial)
        backward = CudaBackward(forward)
        first = backward.run(run.dy, run.dfinal)
        graph = backward.graph_exec
        assert (graph is not None) == graphed
        second = backward.run(run.dy, run.dfinal)
        assert backward.graph_exec is graph  # replayed, not captured again
    finally:
        if backward is not None:
            backward.close()
        forward.close()
    want = run.reference()
    assert_gradients(first, want, 1e-4, schedule)
    np.testing.assert_array_equal(first.dx, second.dx)
    for key, value in first.dparams.items():
        np.testing.assert_array_equal(value, second.dparams[key])
