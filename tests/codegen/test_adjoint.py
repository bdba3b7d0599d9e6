"""The adjoint of an island: given the island's inputs and its outputs' gradients, the gradients of its
inputs, checked against central differences of the forward body; and compiled as a CUDA kernel."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest
from compile_cuda import nvcc_cubin
from hypothesis import HealthCheck, assume, given, settings
from random_cells import random_cells

from cellfuse.codegen import make_plan
from cellfuse.codegen.adjoint import adjoint
from cellfuse.codegen.cuda_kernels import PRELUDE, kernel_source
from cellfuse.codegen.plan import GRAD, Access, Instr, Island, KernelLaunch, grad_of
from cellfuse.gpu_runtime.numpy_executor import run_body
from cellfuse.graph_model import Sizes, analyze, load_template, template_names

SIZES = Sizes(seq=3, batch=2, input=5, hidden=4)


def fit(sizes: Sizes, cell) -> Sizes:
    """The sizes, with input = hidden for a cell that ties the two widths (it runs at no others)."""
    return replace(sizes, input=sizes.hidden) if analyze(cell).ties else sizes
ROWS, WIDTH = 3, 4


def island_inputs(plan, isl: Island, rng) -> dict[str, np.ndarray]:
    """Values of the island's inputs: [rows, width] for row values, [width] for vectors, scalars."""
    launch = next(k for k in plan.layers[0].step + plan.layers[0].prologue
                  if isinstance(k, KernelLaunch) and k.island == isl.name)
    shape = {"row": (ROWS, WIDTH), "vec": (WIDTH,), "scalar": ()}
    # away from 0, where a division or a kink would make a central difference meaningless
    return {v: rng.choice([-1.0, 1.0], shape[acc.kind]) * rng.uniform(0.5, 1.5, shape[acc.kind])
            for v, acc in launch.inputs}


def loss(isl: Island, values: dict[str, np.ndarray], dout: dict[str, np.ndarray]) -> float:
    vals = dict(values)
    run_body(isl.body, vals, np.dtype(np.float64))
    return sum(float(np.sum(dout[o] * np.broadcast_to(vals[o], (ROWS, WIDTH)))) for o in isl.outputs)


def check_island(plan, isl: Island, rng, conditioned=lambda ok: None) -> None:
    values = island_inputs(plan, isl, rng)
    dout = {o: rng.standard_normal((ROWS, WIDTH)) for o in isl.outputs}
    adj = adjoint(isl.body, isl.inputs, isl.outputs)
    vals = dict(values) | {grad_of(o): dout[o] for o in isl.outputs}
    run_body(adj.body, vals, np.dtype(np.float64))
    for v, x in values.items():
        exact = vals[adj.grads[v]] if v in adj.grads else np.zeros((ROWS, WIDTH))
        exact = np.broadcast_to(exact, (ROWS, WIDTH))
        if x.ndim < 2:  # a broadcast input: its gradient is summed over the rows (and columns)
            exact = exact.sum(axis=tuple(range(2 - x.ndim)))
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


def test_a_value_used_twice_collects_both_gradients():
    plan = make_plan(load_template("lstm"), SIZES, "hoisted")
    (isl,) = [i for i in plan.islands if i.body]
    adj = adjoint(isl.body, isl.inputs, isl.outputs)
    # c_new is an output and is also read by tc = tanh(c_new): its gradient adds the outside one to it
    sums = [i for i in adj.body if isinstance(i, Instr) and i.op.name == "add" and i.result.startswith(GRAD)]
    assert any(grad_of("c_new") in i.args for i in sums)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", template_names())
def test_adjoint_kernels_compile(name, tmp_path):
    """An adjoint is a kernel body like any other: the island's inputs and the outputs' gradients in,
    the inputs' gradients out (one per element, even for a broadcast input)."""
    cell = load_template(name)
    plan = make_plan(cell, fit(Sizes(3, 2, 24, 40), cell), "hoisted")
    parts = [PRELUDE]
    for launch in plan.layers[0].step:
        if not isinstance(launch, KernelLaunch) or not launch.body:
            continue
        isl = plan.island(launch.island)
        adj = adjoint(isl.body, isl.inputs, isl.outputs)
        row = Access("grads", "row", launch.width)
        inputs = (*launch.inputs, *((grad_of(o), row) for o in isl.outputs))
        outputs = tuple((adj.grads[v], row) for v in isl.inputs if v in adj.grads)
        backward = KernelLaunch(f"{launch.island}_adjoint", launch.row_kind, launch.rows, launch.width,
                                inputs, outputs, adj.body, False)
        parts.append(kernel_source(backward, f"cf_{name}_{launch.island}_adjoint"))
    nvcc_cubin("\n".join(parts), tmp_path)
