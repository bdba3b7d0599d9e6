"""The adjoint of an island: given the island's inputs and its outputs' gradients, the gradients of its
inputs, checked against central differences of the forward body; and compiled as a CUDA kernel. Islands
that reduce rows, and islands that read a column (a [batch, 1] value), are among them: a column's
gradient is one number per row, the sum of what every element of the row passes it."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from compile_cuda import nvcc_cubin
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from random_cells import random_cell, random_cells

from cellfuse.codegen import make_plan
from cellfuse.codegen.adjoint import adjoint, value_kinds
from cellfuse.codegen.cuda_kernels import PRELUDE
from cellfuse.codegen.kernel_set import kernel_source
from cellfuse.codegen.plan import GRAD, Access, GradInstr, Instr, Island, KernelLaunch, grad_of
from cellfuse.gpu_runtime.numpy_executor import run_body
from cellfuse.graph_model import OPS, Sizes, analyze, load_template, template_names

SIZES = Sizes(seq=3, batch=2, input=5, hidden=4)


def fit(sizes: Sizes, cell) -> Sizes:
    """The sizes, with input = hidden for a cell that ties the two widths (it runs at no others)."""
    return replace(sizes, input=sizes.hidden) if analyze(cell).ties else sizes
ROWS, WIDTH = 3, 4


SHAPE = {"row": (ROWS, WIDTH), "col": (ROWS, 1), "vec": (WIDTH,), "scalar": ()}


def launch_of(plan, isl: Island) -> KernelLaunch:
    return next(k for k in plan.layers[0].step + plan.layers[0].prologue
                if isinstance(k, KernelLaunch) and k.island == isl.name)


def input_kinds(plan, isl: Island) -> dict[str, str]:
    return {v: acc.kind for v, acc in launch_of(plan, isl).inputs}


def island_inputs(plan, isl: Island, rng) -> dict[str, np.ndarray]:
    """Values of the island's inputs: [rows, width] for row values, [rows, 1] for columns, [width] for
    vectors, scalars."""
    shape = {v: SHAPE[kind] for v, kind in input_kinds(plan, isl).items()}
    # away from 0, where a division or a kink would make a central difference meaningless
    return {v: rng.choice([-1.0, 1.0], s) * rng.uniform(0.5, 1.5, s) for v, s in shape.items()}


def output_shapes(plan, isl: Island) -> dict[str, tuple[int, ...]]:
    """A column output's gradient is one per row; any other output's, one per element."""
    outputs = dict(launch_of(plan, isl).outputs)
    return {o: SHAPE["col"] if outputs[o].kind == "col" else SHAPE["row"] for o in isl.outputs}


def loss(isl: Island, values: dict[str, np.ndarray], dout: dict[str, np.ndarray]) -> float:
    vals = dict(values)
    run_body(isl.body, vals, np.dtype(np.float64))
    return sum(float(np.sum(dout[o] * np.broadcast_to(vals[o], dout[o].shape))) for o in isl.outputs)


def check_island(plan, isl: Island, rng, conditioned=lambda ok: None) -> None:
    values = island_inputs(plan, isl, rng)
    dout = {o: rng.standard_normal(shape) for o, shape in output_shapes(plan, isl).items()}
    adj = adjoint(isl.body, input_kinds(plan, isl), isl.outputs)
    vals = dict(values) | {grad_of(o): dout[o] for o in isl.outputs}
    run_body(adj.body, vals, np.dtype(np.float64))
    for v, x in values.items():
        exact = vals[adj.grads[v]] if v in adj.grads else np.zeros(x.shape)
        if x.ndim == 2:  # a row's gradient is one per element, a column's one per row
            exact = np.broadcast_to(exact, x.shape)
        else:  # a broadcast input: its gradient, one per element, is summed over the rows (and columns)
            exact = np.broadcast_to(exact, (ROWS, WIDTH)).sum(axis=tuple(range(2 - x.ndim)))
        direction = rng.standard_normal(x.shape)
        numeric = []
        for eps in (1e-5, 1e-6):
            up, down = dict(values), dict(values)
            up[v], down[v] = x + eps * direction, x - eps * direction
            numeric.append((loss(isl, up, dout) - loss(isl, down, dout)) / (2 * eps))
        conditioned(abs(numeric[0] - numeric[1]) <= 1e-6 * max(1.0, abs(numeric[1])))
        got = float(np.sum(exact * direction))
        assert abs(got - numeric[1]) <= 1e-5 * max(1.0, abs(numeric[1])), f"{isl.name}: d/d{v}"


@pytest.mark.parametrize("name", template_names())
def test_adjoints_of_every_template_island_match_central_differences(name):
    cell = load_template(name)
    plan = make_plan(cell, fit(SIZES, cell), "hoisted")
    rng = np.random.default_rng(0)
    for isl in plan.islands:
        if isl.body:
            check_island(plan, isl, rng)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells())
def test_adjoints_of_random_islands_match_central_differences(cell):
    plan = make_plan(cell, SIZES, "fused")
    rng = np.random.default_rng(1)
    for isl in plan.islands:
        if isl.body:
            check_island(plan, isl, rng, assume)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells(reductions=True), st.sampled_from(["naive", "fused"]))
def test_adjoints_of_random_islands_that_reduce_rows_match_central_differences(cell, schedule):
    """In `naive` a column crosses kernels: a kernel reads it and passes it a gradient per row; in `fused`
    the layer norms and the columns they spread over are inside one island."""
    plan = make_plan(cell, SIZES, schedule)
    rng = np.random.default_rng(2)
    for isl in plan.islands:
        if isl.body:
            check_island(plan, isl, rng, assume)


def test_a_value_used_twice_collects_both_gradients():
    plan = make_plan(load_template("lstm"), SIZES, "hoisted")
    (isl,) = [i for i in plan.islands if i.body]
    adj = adjoint(isl.body, input_kinds(plan, isl), isl.outputs)
    # c_new is an output and is also read by tc = tanh(c_new): its gradient adds the outside one to it
    sums = [i for i in adj.body if isinstance(i, Instr) and i.op.name == "add" and i.result.startswith(GRAD)]
    assert any(grad_of("c_new") in i.args for i in sums)


def test_a_column_gets_the_row_sum_of_what_its_elements_pass_it():
    """d_c = c_new - mu_c spreads the column mu_c over the row: mu_c's gradient from it is the row sum
    of -dd_c, one per row; and mu_c = row_mean(c_new) passes each element of c_new dmu_c / width."""
    plan = make_plan(load_template("layernorm_lstm"), SIZES, "hoisted")
    (isl,) = [i for i in plan.islands if i.body]
    adj = adjoint(isl.body, input_kinds(plan, isl), isl.outputs)
    kinds = value_kinds(adj.body, input_kinds(plan, isl) | {grad_of(o): "row" for o in isl.outputs})
    (part,) = [i for i in adj.body if isinstance(i, GradInstr) and i.y == "d_c" and i.arg == 1]
    (row_sum,) = [i for i in adj.body if isinstance(i, Instr) and i.args == (part.result,)]
    assert row_sum.op.name == "row_sum" and (kinds[part.result], kinds[row_sum.result]) == ("row", "col")
    (spread,) = [i for i in adj.body if isinstance(i, GradInstr) and i.y == "mu_c"]
    assert spread.op.name == "row_mean" and kinds[spread.dy] == "col" and kinds[spread.result] == "row"
    # every column of the body gets its gradient as a column
    columns = {i.result for i in isl.body if kinds[i.result] == "col"}
    assert columns and all(kinds[i.result] == "col" for i in adj.body
                           if isinstance(i, GradInstr) and i.args[i.arg] in columns
                           and kinds[i.y] == "col")
    sums = [i.result.split("#")[0] for i in adj.body if isinstance(i, Instr) and i.op.name == "row_sum"]
    assert all(kinds[i.result] == "col" for i in adj.body if isinstance(i, Instr) and i.op.name == "row_sum")
    # rstd_h spreads over four rows: their parts add up per element, and one row sum takes them all
    assert grad_of("rstd_h") in sums and len(sums) == len(set(sums))


def compile_adjoints(cell, schedule: str, tmp_path, stem: str) -> str:
    """The adjoint kernels of adjoint_source, compiled with nvcc; gives the source."""
    source = adjoint_source(cell, schedule, stem)
    nvcc_cubin(source, tmp_path)
    return source


def adjoint_source(cell, schedule: str, stem: str) -> str:
    """The adjoint of every kernel of a plan's step, as a kernel: the island's inputs and the outputs'
    gradients in (a column's one per row), the inputs' gradients out (a column's one per row, any other
    input's one per element, even a broadcast one's)."""
    plan = make_plan(cell, fit(Sizes(3, 2, 24, 40), cell), schedule)
    parts = [PRELUDE]
    for launch in plan.layers[0].step:
        if not isinstance(launch, KernelLaunch) or not launch.body:
            continue
        isl = plan.island(launch.island)
        adj = adjoint(isl.body, input_kinds(plan, isl), isl.outputs)
        kinds = {v: acc.kind for v, acc in (*launch.inputs, *launch.outputs)}
        grads = {v: Access(f"grads{n}", "col" if kind == "col" else "row", launch.width)
                 for n, (v, kind) in enumerate(kinds.items())}
        inputs = (*launch.inputs, *((grad_of(o), grads[o]) for o in isl.outputs))
        outputs = tuple((adj.grads[v], grads[v]) for v in isl.inputs if v in adj.grads)
        backward = KernelLaunch(f"{launch.island}_adjoint", launch.row_kind, launch.rows, launch.width,
                                inputs, outputs, adj.body, False, accumulate=True)
        parts.append(kernel_source(backward, f"cf_{stem}_{launch.island}_adjoint"))
    return "\n".join(parts)


def test_adjoint_kernels_of_every_template_run_a_block_per_row_where_the_cell_reduces_rows():
    """What test_adjoint_kernels_compile checks of the source before it compiles it (the slow tier)."""
    for name in template_names():
        cell = load_template(name)
        source = adjoint_source(cell, "hoisted", name)
        assert ("__shared__ float cf_partial" in source) == any(OPS[n.op].is_reduction for n in cell.nodes)


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", template_names())
def test_adjoint_kernels_compile(name, tmp_path):
    """An adjoint is a kernel body like any other; one that reduces rows runs a block per row."""
    cell = load_template(name)
    source = compile_adjoints(cell, "hoisted", tmp_path, name)
    assert ("__shared__ float cf_partial" in source) == any(OPS[n.op].is_reduction for n in cell.nodes)


@pytest.mark.slow
@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("seed", [0, 1, 2, 4])  # cells with row_mean, row_sum, or both
def test_adjoint_kernels_of_random_cells_that_reduce_rows_compile(seed, tmp_path):
    """Every kernel of `naive` alone (a column read by a kernel that does not reduce), all of a step in
    one (`fused`), for a few seeded cells with row reductions; one nvcc run per cell and schedule."""
    cell = random_cell(seed, reductions=True)
    assert any(OPS[n.op].is_reduction for n in cell.nodes)
    for schedule in ("naive", "fused"):
        compile_adjoints(cell, schedule, tmp_path, f"random{seed}")
