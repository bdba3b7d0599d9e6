"""The benchmark's gradient check where the reference passes within rounding of a kink: it accepts the
gradients along the kink's other branch, which a float32 run may rightly give, says so, and accepts
nothing else."""

from __future__ import annotations

import pytest
from kink_cases import SIZES, indrnn_at_a_kink

from cellfuse.gpu_runtime.bench import BenchConfig, BenchRow, _Problem
from cellfuse.graph_model import backward
from cellfuse.graph_model.kinks import near_kinks, other_branch


@pytest.mark.parametrize("error", [0.0, 1e-2])
def test_the_benchmark_accepts_the_other_branch_and_nothing_else(error):
    cell, params, x, inputs, tape, dy = indrnn_at_a_kink(3e-9)
    kinks = near_kinks(tape, 3)
    config = BenchConfig(sizes=SIZES, schedules=("graph",), baselines=(), train=True)
    problem = _Problem(cell, SIZES, params, x, {"h": inputs["h"]}, config, 1, dy=dy,
                       ref_grads=backward(tape, dy), kinks=kinks, tape=tape)
    got = backward(other_branch(tape, kinks[:1]), dy)
    got.dparams["l0.u"] = got.dparams["l0.u"] * (1 + error)
    row = BenchRow("graph", "schedule", True)
    problem.check_gradients(row, got)
    if error:
        assert row.rel_error > 1e-3 and "other branch" not in row.note
    else:
        assert row.rel_error < 1e-9 and "right along the other branch of relu 'h_new'" in row.note
