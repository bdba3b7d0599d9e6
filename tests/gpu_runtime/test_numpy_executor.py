"""The numpy executor runs every schedule's Plan to the reference interpreter's result, on the templates
and on random cells."""

from __future__ import annotations

import numpy as np
import pytest
from forward_errors import relative_error
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_cells import random_cell, random_cells
from tiers import slow_beyond, slow_where

from cellfuse.codegen import SCHEDULES, make_plan
from cellfuse.gpu_runtime.execute import run_schedule
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import (
    Cell,
    CellBuilder,
    CellError,
    Sizes,
    analyze,
    init_params,
    load_template,
    run_reference,
    sigmoid,
    tanh,
    template_names,
)

TOLERANCE = {np.float64: 1e-5, np.float32: 1e-4}


def make_data(cell: Cell, seq: int, batch: int, input: int, hidden: int, layers: int, initial: bool,
              seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    params = init_params(cell, layers, input, hidden, seed)
    inputs = {"x": rng.uniform(-1.0, 1.0, (seq, batch, input)).astype(np.float32)}
    if initial:
        for s in cell.of_op("state"):
            inputs[s.id] = rng.uniform(-1.0, 1.0, (layers, batch, hidden)).astype(np.float32)
    return params, inputs


def check_all_schedules(cell: Cell, params, inputs, layers: int, floor: float = 0.0) -> None:
    ref = run_reference(cell, params, inputs, layers)
    for schedule in SCHEDULES:
        for dtype, tol in TOLERANCE.items():
            got = run_schedule(cell, params, inputs, layers, schedule, "numpy", dtype)
            rel = relative_error(got, ref, floor)
            assert rel < tol, f"{cell.name} {schedule} {np.dtype(dtype).name}: relative error {rel:.2e}"


# -- the templates -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("layers", slow_where([1, 2], lambda layers: layers == 2))
def test_every_schedule_of_every_template_matches_the_reference(name, schedule, layers):
    cell = load_template(name)
    seq, batch, input, hidden = 6, 3, 7, 5
    if analyze(cell).ties:  # a cell that ties the two widths runs only where they are equal
        input = hidden
    for initial in (False, True):
        params, inputs = make_data(cell, seq, batch, input, hidden, layers, initial, seed=layers)
        ref = run_reference(cell, params, inputs, layers)
        for dtype, tol in TOLERANCE.items():
            got = run_schedule(cell, params, inputs, layers, schedule, "numpy", dtype)
            assert got.y.shape == (seq, batch, hidden) and got.y.dtype == np.float32
            assert {s: v.shape for s, v in got.final.items()} == \
                {s.id: (layers, batch, hidden) for s in cell.of_op("state")}
            rel = relative_error(got, ref)
            assert rel < tol, f"layers={layers} initial={initial} {np.dtype(dtype).name}: {rel:.2e}"


@pytest.mark.parametrize("name", ["lstm", "gru_cho"])
def test_a_single_step_and_a_single_row(name):
    cell = load_template(name)
    params, inputs = make_data(cell, 1, 1, 2, 3, 2, True)
    check_all_schedules(cell, params, inputs, 2)


def test_the_executor_uses_the_plans_sizes_and_keeps_nothing_from_a_previous_run():
    cell = load_template("gru")
    params, inputs = make_data(cell, 4, 2, 3, 5, 1, True)
    plan = make_plan(cell, Sizes(4, 2, 3, 5, 1), "hoisted")
    ex = NumpyExecutor(plan, params, np.float64)
    init = {"h": inputs["h"]}
    first = ex.run(inputs["x"], init)
    again = ex.run(inputs["x"], init)
    np.testing.assert_array_equal(first.y, again.y)
    ref = run_reference(cell, params, inputs)
    assert relative_error(first, ref) < 1e-5


def test_a_wrong_result_is_never_returned_as_a_number():
    # A run whose values overflow reports it instead of returning infinities.
    b = CellBuilder("overflow")
    x, h = b.input("x"), b.state("h")
    W = b.weight("W", "input", "hidden")
    e = (x @ W) * (x @ W)
    b.update(h, e + h)
    b.output(e + h)
    cell = b.build()
    params, inputs = make_data(cell, 3, 2, 3, 4, 1, False)
    params["l0.W"] = np.full((3, 4), 1e30, np.float32)
    for schedule in SCHEDULES:
        with pytest.raises(CellError, match="NaN or infinity"):
            run_schedule(cell, params, inputs, 1, schedule, "numpy", np.float32)


# -- cells a user can draw that the templates do not ------------------------------------------------------
def test_a_matmul_that_is_an_update_keeps_its_own_value_when_its_bias_could_fold():
    b = CellBuilder("fold-target")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    W, U, bias = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight("b", "hidden")
    m = x @ W
    h_new = tanh(m + bias + c @ U)
    b.update(h, h_new)
    b.update(c, m)
    b.output(h_new)
    cell = b.build()
    params, inputs = make_data(cell, 4, 2, 3, 4, 2, True)
    params["l0.b"] = params["l1.b"] = np.full(4, 0.5, np.float32)  # a bias that shows if added twice
    check_all_schedules(cell, params, inputs, 2)


def test_a_weight_named_like_a_buffer():
    b = CellBuilder("names")
    x, h = b.input("x"), b.state("h")
    W, U, y = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight("y", "hidden")
    h_new = tanh(x @ W + h @ U + y)
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    params, inputs = make_data(cell, 3, 2, 3, 4, 2, True)
    check_all_schedules(cell, params, inputs, 2)


def test_states_that_shift_into_each_other_and_an_output_that_is_a_state():
    b = CellBuilder("shift")
    x, h, c, m = b.input("x"), b.state("h"), b.state("c"), b.state("m")
    W = b.weight("W", "input", "hidden")
    b.update(h, tanh(x @ W + m))
    b.update(c, h)
    b.update(m, c)
    b.output(c)
    cell = b.build()
    params, inputs = make_data(cell, 5, 2, 3, 4, 2, True)
    check_all_schedules(cell, params, inputs, 2)


def test_state_independent_values_used_before_and_inside_the_loop():
    b = CellBuilder("pro-values")
    x, h = b.input("x"), b.state("h")
    W, W2 = b.weight("W", "input", "hidden"), b.weight("W2", "hidden", "hidden")
    U, p = b.weight("U", "hidden", "hidden"), b.weight("p", "hidden")
    v = -p
    t = tanh(x @ W + v)
    b.update(h, sigmoid(t @ W2 + h @ U) * v)
    b.output(t)
    cell = b.build()
    params, inputs = make_data(cell, 4, 3, 5, 3, 2, True)
    check_all_schedules(cell, params, inputs, 2)


# -- random cells ---------------------------------------------------------------------------------------
# Three sweeps of random cells: the default tier runs the first seeds of the last, the widest (row
# reductions and tied widths among the ops of the table), the slow tier the rest of it and the other two.
@st.composite
def runs(draw):
    cell = draw(random_cells())
    seq, batch = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    input, hidden = draw(st.integers(2, 6)), draw(st.integers(2, 6))
    layers, initial = draw(st.integers(1, 2)), draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    return cell, (seq, batch, input, hidden, layers, initial, seed)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_every_schedule_of_a_random_cell_matches_the_reference(run):
    cell, (seq, batch, input, hidden, layers, initial, seed) = run
    params, inputs = make_data(cell, seq, batch, input, hidden, layers, initial, seed)
    check_all_schedules(cell, params, inputs, layers, floor=1e-3)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(40))
def test_every_schedule_of_a_seeded_random_cell_matches_the_reference(seed):
    cell = random_cell(np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    seq, batch, input, hidden = (int(v) for v in rng.integers((1, 1, 2, 2), (6, 4, 8, 8)))
    params, inputs = make_data(cell, seq, batch, input, hidden, 1 + seed % 2, seed % 3 == 0, seed)
    check_all_schedules(cell, params, inputs, 1 + seed % 2, floor=1e-3)


@pytest.mark.parametrize("seed", slow_beyond(range(200), 20))
def test_random_cells_with_reductions_and_tied_widths_match_the_reference_under_every_schedule(seed):
    """The new ops, [batch, 1] values and input-wide rows meeting hidden-wide ones, which run only where
    input == hidden: every schedule, the persistent ones included, in float64 and float32."""
    cell = random_cell(seed + 5000, reductions=True, ties=True)
    rng = np.random.default_rng(seed)
    seq, batch = (int(v) for v in rng.integers((1, 1), (6, 4)))
    # the sizes the cells are drawn with: a cell without a weight of hidden width runs at its own
    params, inputs = make_data(cell, seq, batch, 8, 8, 1 + seed % 2, seed % 3 == 0, seed)
    check_all_schedules(cell, params, inputs, 1 + seed % 2, floor=1e-3)


@pytest.mark.parametrize("seed", range(8))
def test_random_cells_stay_bounded_over_long_sequences(seed):
    cell = random_cell(seed + 1000)
    params, inputs = make_data(cell, 300, 2, 6, 8, 1, True, seed)
    ref = run_reference(cell, params, inputs)
    assert float(np.abs(ref.y).max()) < 100.0
    got = run_schedule(cell, params, inputs, 1, "hoisted", "numpy", np.float32)
    assert relative_error(got, ref) < 1e-3
