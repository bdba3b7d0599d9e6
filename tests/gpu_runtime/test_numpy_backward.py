"""The backward Plan run by the numpy executor: the gradients of x, of every initial state and of every
parameter equal the float64 reference's (graph_model.backward), for every template, seeded random cells
(with row reductions and without), 1 and 2 layers, with and without initial states and seeds of the
final states, on every schedule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from gradient_runs import GRAPH_FAMILY, SIZES, assert_gradients, make_run, reduces_rows
from hypothesis import HealthCheck, given, settings
from random_cells import random_cell, random_cells
from tiers import slow_where

from cellfuse.codegen import make_plan
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.plan import H100, Target
from cellfuse.gpu_runtime.numpy_backward import NumpyBackward
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import (
    Cell,
    CellBuilder,
    CellError,
    Sizes,
    exp,
    load_template,
    relu,
    sigmoid,
    tanh,
    template_names,
)


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("schedule", GRAPH_FAMILY)
@pytest.mark.parametrize("layers", slow_where([1, 2], lambda layers: layers == 2))
def test_gradients_of_every_template_equal_the_reference(name, schedule, layers):
    cell = load_template(name)
    run = make_run(cell, layers)
    assert_gradients(run.numpy(schedule), run.reference(), 1e-9, f"{name} {schedule}")


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("initial, dfinal", [(False, False), (False, True), (True, False)])
def test_gradients_without_initial_states_or_final_seeds(name, initial, dfinal):
    cell = load_template(name)
    run = make_run(cell, 2, seed=3, initial=initial, dfinal=dfinal)
    assert_gradients(run.numpy("hoisted"), run.reference(), 1e-9, name)


@pytest.mark.parametrize("schedule", slow_where(GRAPH_FAMILY, lambda s: s != "naive"))
@pytest.mark.parametrize("reductions", [False, True])
def test_gradients_of_seeded_random_cells_equal_the_reference(schedule, reductions):
    """With reductions, the layer norms and [batch, 1] columns of random cells: in `naive` a column
    crosses kernels (its gradient, a row sum per reading kernel, adds up in its buffer); from `fused` on
    it stays inside a kernel whose adjoint sums it over the row; hoisted, before the loop."""
    reducing = 0
    for seed in range(60):
        cell = random_cell(seed, reductions=reductions)
        reducing += reduces_rows(cell)
        run = make_run(cell, layers=1 + seed % 2, seed=seed, initial=seed % 3 != 0, dfinal=seed % 4 != 0,
                       sizes=Sizes(seq=3, batch=2, input=5, hidden=4), scale=1.0)
        assert_gradients(run.numpy(schedule), run.reference(), 1e-9, f"random cell {seed}")
    assert (reducing > 20) == reductions


@pytest.mark.parametrize("reductions", slow_where([False, True], lambda reductions: not reductions))
def test_persistent_backward_passes_of_seeded_random_cells_equal_the_reference(reductions):
    """The reverse loop as one persistent launch (an adjoint that reduces rows a block per row in it),
    run block by block on 3 SMs, so that blocks own several columns, in both orders."""
    few = Target(3, H100.smem_per_block)
    persistent = 0
    for seed in range(40):
        cell = random_cell(seed, reductions=reductions)
        run = make_run(cell, layers=1 + seed % 2, seed=seed, initial=seed % 3 != 0, dfinal=seed % 4 != 0,
                       sizes=Sizes(seq=3, batch=2, input=5, hidden=7), scale=1.0)
        schedule = ("persistent", "tensor")[seed % 2]
        persistent += backward_plan(make_plan(run.cell, run.sizes, schedule, few, save_steps=True)
                                    ).layers[0].persistent is not None
        got = run.numpy(schedule, target=few, reverse_blocks=seed % 3 == 1)
        assert_gradients(got, run.reference(), 1e-9, f"random cell {seed}, {schedule}")
    assert persistent > 20


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells(reductions=True))
def test_gradients_of_random_cells_equal_the_reference(cell):
    run = make_run(cell, 2, sizes=Sizes(seq=3, batch=2, input=5, hidden=4), scale=1.0)
    want = run.reference()
    for schedule in ("naive", "hoisted"):
        assert_gradients(run.numpy(schedule), want, 1e-9, schedule)


def shared_row_value_cell() -> Cell:
    """A [hidden] value nb computed once and read by the kernels of two stages: the fused kernel of the
    first computes it per row and stores it for the second (a [N] output of a kernel with rows)."""
    b = CellBuilder("shared")
    x, h = b.input("x"), b.state("h")
    W, U1, U2 = b.weight("W", "input", "hidden"), b.weight("U1", "hidden", "hidden"), b.weight("U2", "hidden",
                                                                                               "hidden")
    nb = exp(tanh(b.weight("b", "hidden")) * 0.5).named("nb")
    r = sigmoid(x @ W + h @ U1 + nb).named("r")
    n = tanh((r * h).named("rh") @ U2 + nb * 2.0).named("n")
    b.update(h, n)
    b.output(n)
    return b.build()


def hoisted_row_value_cell() -> Cell:
    """A [hidden] value read by a kernel before the loop (which computes it) and by one in every step."""
    b = CellBuilder("hoisted_vec")
    x, h, c = b.input("x"), b.state("h"), b.state("c")
    nb = tanh(b.weight("b", "hidden")).named("nb")
    xr = relu(x @ b.weight("W0", "input", "hidden") + nb * 0.5).named("xr")
    bh = b.weight("bh", "hidden")
    hh = tanh(xr @ b.weight("W1", "hidden", "hidden") + h @ b.weight("U1", "hidden", "hidden")
              + bh * tanh(bh)).named("hh")
    z = sigmoid(hh @ b.weight("W2", "hidden", "hidden") + nb).named("z")
    c_new = (z * c + (1.0 - z) * hh).named("c_new")
    b.update(h, hh)
    b.update(c, c_new)
    b.output(c_new)
    return b.build()


@pytest.mark.parametrize("make, hoisted", [(shared_row_value_cell, False), (hoisted_row_value_cell, True)])
@pytest.mark.parametrize("schedule", GRAPH_FAMILY)
def test_a_row_value_shared_between_kernels(make, hoisted, schedule):
    """Random cells rarely draw these: the gradient of a [N] value that a kernel with rows computes comes
    from the per-row gradients of the kernels that read it (in `fused` and up); in `naive` and `combined`
    a kernel of [N] values only computes it, and its gradient is their column sum."""
    cell = make()
    run = make_run(cell, 2, sizes=replace(SIZES, input=SIZES.hidden))
    plan = make_plan(cell, run.sizes, schedule, save_steps=True)
    kernels = [k for k in (*plan.layers[0].prologue, *plan.layers[0].step) if hasattr(k, "island")]
    vec_outputs = [k for k in kernels if k.row_kind != "one" and any(a.kind == "vec" for _, a in k.outputs)]
    if schedule in ("naive", "combined"):
        assert any(k.row_kind == "one" for k in kernels) and not vec_outputs
    else:
        assert vec_outputs and vec_outputs[0].hoisted == (hoisted and schedule != "fused")
    assert_gradients(run.numpy(schedule), run.reference(), 1e-9, schedule)


@pytest.mark.parametrize("name", slow_where(template_names(), lambda name: name not in ("lstm", "gru_cho",
                                                                                      "layernorm_lstm")))
def test_float32_gradients_are_within_1e_4_of_the_reference(name):
    cell = load_template(name)
    # The states start at 0, as sLSTM's do: from random ones its normaliser state starts near 0, where
    # rounding x and the weights to float32 moves the exact gradients by 1e-2 already.
    run = make_run(cell, 2, seed=5, initial=False, sizes=Sizes(seq=20, batch=8, input=32, hidden=48),
                   scale=1.0)
    got = run.numpy("graph", np.float32)
    assert got.dx.dtype == np.float32 and all(g.dtype == np.float32 for g in got.dparams.values())
    assert_gradients(got, run.reference(), 1e-4, name)


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("sms, reverse_blocks", [pytest.param(132, False, marks=pytest.mark.slow),
                                                 pytest.param(132, True, marks=pytest.mark.slow), (3, False)])
def test_the_persistent_backward_pass_block_by_block_equals_the_reference(name, sms, reverse_blocks):
    """Each layer's reverse loop as one persistent launch (the layer norm's, whose gradients reduce rows,
    as a loop of launches), its blocks run one by one between barriers in either order; with 3 SMs a
    block owns several columns of each width."""
    run = make_run(load_template(name), 2)
    got = run.numpy("persistent", target=Target(sms, H100.smem_per_block), reverse_blocks=reverse_blocks)
    assert_gradients(got, run.reference(), 1e-9, name)


@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho", "mgu"])
@pytest.mark.parametrize("reverse_blocks", [False, True])
def test_a_barrier_missing_from_the_persistent_backward_pass_shows(monkeypatch, name, reverse_blocks):
    """Without the barrier before a dA GEMM, a block reads dC before the other blocks wrote it (or after
    they wrote the next step's): the block-by-block run gives other gradients."""
    from cellfuse.codegen import persistent

    def without_last(step, reverse=False):
        placed = barriers(step, reverse)
        if reverse:
            placed[len(placed) - 1 - placed[::-1].index(True)] = False
        return placed

    barriers = persistent.barriers
    monkeypatch.setattr(persistent, "barriers", without_last)
    run = make_run(load_template(name), 2)
    with pytest.raises(AssertionError):
        assert_gradients(run.numpy("persistent", reverse_blocks=reverse_blocks), run.reference(), 1e-9)


def test_a_second_run_starts_again_from_zero():
    """Gradients accumulate into their buffers during a run: each run zeroes them first."""
    run = make_run(load_template("gru"), 2)
    s = run.sizes
    forward = NumpyExecutor(make_plan(run.cell, s, "graph", save_steps=True), run.params, np.float64)
    forward.run(run.x, run.initial)
    backward = NumpyBackward(forward)
    first = backward.run(run.dy, run.dfinal)
    again = backward.run(run.dy, run.dfinal)
    assert_gradients(again, first, 1e-15)
    # and a new forward run is what the next backward run reads
    x2 = run.x[::-1].copy()
    forward.run(x2, run.initial)
    assert_gradients(backward.run(run.dy, run.dfinal), replace(run, x=x2).reference(), 1e-9)


@pytest.mark.parametrize("schedule", ["naive", "hoisted", "persistent"])
def test_the_pass_without_dx_gives_every_other_gradient_and_leaves_dx_as_it_starts(schedule):
    """BackwardPlan.without_input_grad leaves out the GEMMs that write only dx (in the loop where the
    input GEMM is a step's, after it where it is hoisted); the other gradients are the whole pass's."""
    run = make_run(load_template("lstm"), 2)
    forward = NumpyExecutor(make_plan(run.cell, run.sizes, schedule, save_steps=True), run.params, np.float64)
    forward.run(run.x, run.initial)
    backward = NumpyBackward(forward)
    whole = backward.run(run.dy, run.dfinal)
    backward.plan = backward.plan.without_input_grad()
    backward.instructions = backward.plan.instructions()
    without = backward.run(run.dy, run.dfinal)
    assert not without.dx.any() and whole.dx.any()
    assert_gradients(without, replace(whole, dx=without.dx), 0.0)


def test_seeds_that_do_not_fit_are_refused_by_name():
    run = make_run(load_template("lstm"), 1)
    forward = NumpyExecutor(make_plan(run.cell, run.sizes, "graph", save_steps=True), run.params, np.float64)
    forward.run(run.x, run.initial)
    backward = NumpyBackward(forward)
    with pytest.raises(CellError, match=r"dy has shape \[4, 3, 5\], expected \[4, 3, 4\]"):
        backward.run(np.zeros((4, 3, 5)))
    with pytest.raises(CellError, match="'m' is not a state of cell 'LSTM' \\(states: h, c\\)"):
        backward.run(run.dy, {"m": np.zeros((1, 3, 4))})
    with pytest.raises(CellError, match="dfinal 'c' has shape"):
        backward.run(run.dy, {"c": np.zeros((2, 3, 4))})
    with pytest.raises(CellError, match="dy must be a float array"):
        backward.run([[0.0]])


@pytest.mark.parametrize("schedule", slow_where(GRAPH_FAMILY, lambda schedule: schedule != "hoisted"))
def test_gradients_of_random_cells_that_tie_the_widths_equal_the_reference(schedule):
    """Input-wide rows meeting hidden-wide ones (at equal sizes), with row reductions too."""
    for seed in range(40):
        cell = random_cell(seed + 7000, reductions=True, ties=True)
        run = make_run(cell, layers=1 + seed % 2, seed=seed, initial=seed % 3 != 0, dfinal=seed % 4 != 0,
                       sizes=Sizes(seq=4, batch=3, input=8, hidden=8))
        assert_gradients(run.numpy(schedule), run.reference(), 1e-9, f"seed {seed} {schedule}")
