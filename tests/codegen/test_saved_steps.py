"""A forward plan that saves its steps (what a backward pass reads): the same results, and every step's
states, values and recurrent GEMM outputs kept in their own rows, equal to the reference's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from random_cells import random_cells

from cellfuse.codegen import SCHEDULES, make_plan
from cellfuse.codegen.plan import Access, GemmLaunch, KernelLaunch
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import Sizes, analyze, init_params, load_template, record_forward, template_names

SIZES = Sizes(seq=4, batch=3, input=5, hidden=6, layers=2)


def run_saved(cell, schedule: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    # a cell that ties the two widths runs only where they are equal
    sizes = replace(SIZES, input=SIZES.hidden) if analyze(cell).ties else SIZES
    params = init_params(cell, sizes.layers, sizes.input, sizes.hidden, seed)
    x = rng.uniform(-1, 1, (sizes.seq, sizes.batch, sizes.input))
    init = {s: rng.uniform(-1, 1, (sizes.layers, sizes.batch, sizes.hidden)) for s in cell.updates}
    plain = NumpyExecutor(make_plan(cell, sizes, schedule), params, np.float64)
    saved_plan = make_plan(cell, sizes, schedule, save_steps=True)
    saved = NumpyExecutor(saved_plan, params, np.float64)
    return plain.run(x, init), saved, saved.run(x, init), record_forward(cell, params, {"x": x, **init})


def check(cell, schedule: str) -> None:
    plain, ex, got, tape = run_saved(cell, schedule)
    np.testing.assert_allclose(got.y, plain.y, rtol=1e-12, atol=1e-12)
    B, H, plan = SIZES.batch, SIZES.hidden, ex.plan
    for lp in plan.layers:
        values = tape.values[lp.layer]
        for t in range(1, SIZES.seq):  # the state each step read: the update of the step before
            for s, acc in lp.state_read.items():
                np.testing.assert_allclose(ex.view(acc, acc.offset(t, B), B, H),
                                           values[t - 1][cell.updates[s]], rtol=1e-9, atol=1e-12)
        for t in range(SIZES.seq):  # every step's kernel outputs and GEMM outputs, kept after the run
            for launch in lp.step:
                match launch:
                    case KernelLaunch():
                        kept = [(v, acc) for v, acc in launch.outputs if acc.kind == "row"]
                        for v, acc in kept:
                            np.testing.assert_allclose(ex.view(acc, acc.offset(t, B), B, launch.width),
                                                       np.broadcast_to(values[t][v], (B, launch.width)),
                                                       rtol=1e-9, atol=1e-12)
                    case GemmLaunch():
                        c = ex.view(launch.c, launch.c.offset(t, B), B, launch.n)
                        group = plan.group(launch.group)
                        # a folded bias is in the GEMM's output: the add's value, not the matmul's
                        add_of = {m: a for a, m in group.folded.items()}
                        want = np.concatenate([values[t][add_of.get(m, m)] for m in group.matmuls], 1)
                        np.testing.assert_allclose(c, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("schedule", [s if s in ("naive", "hoisted", "persistent", "tensor")
                                      else pytest.param(s, marks=pytest.mark.slow) for s in SCHEDULES])
def test_saved_steps_of_every_template(name, schedule):
    check(load_template(name), schedule)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells())
def test_saved_steps_of_random_cells(cell):
    check(cell, "graph")


def test_saved_buffers_have_a_row_block_per_step():
    plan = make_plan(load_template("lstm"), SIZES, "hoisted", save_steps=True)
    assert plan.saves_steps
    rows = {b.name: b.rows for b in plan.buffers.values()}
    assert rows["l0.state.c"] == "seq+1" and rows["l0.gemm1.out"] == "seq"
    assert all(isinstance(a, Access) and a.slot == "t" for a in plan.layers[0].state_read.values()
               if a.buffer != "l0.out.y")


def test_a_persistent_plan_that_saves_its_steps_keeps_no_gemm_output_on_chip_only():
    """The backward pass reads every step's recurrent GEMM outputs from memory: a kernel that kept them
    in shared memory would leave nothing there (the numpy executor, which writes everything, would not
    show it)."""
    cell, sizes = load_template("lstm"), Sizes(5, 3, 6, 6, 2)
    for saved in (False, True):
        plan = make_plan(cell, sizes, "persistent", save_steps=saved)
        on_chip = [item for lp in plan.layers for item in lp.persistent.items if item.output_on_chip]
        assert bool(on_chip) != saved
