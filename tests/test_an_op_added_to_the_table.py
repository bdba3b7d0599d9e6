"""The op table is the single source of truth: an op added to it alone works in the builder, the
reference, every schedule of the numpy executor, the generated CUDA, the PyTorch baseline and the random
cells of the tests."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from compile_cuda import nvcc_ptx
from random_cells import random_cell

from cellfuse.codegen import SCHEDULES, make_plan, plan_kernels
from cellfuse.codegen.cuda_kernels import PRELUDE
from cellfuse.codegen.persistent_cuda import PERSISTENT_PRELUDE
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import (
    OPS,
    CellBuilder,
    OpSpec,
    Sizes,
    init_params,
    record_forward,
    run_reference,
    run_reference_backward,
)
from cellfuse.graph_model import builder as builder_module
from cellfuse.graph_model.ops import OpKind, RandomUse

# An op the table does not have (sinh), added by the tests alone.
SINH = OpSpec("sinh", 1, OpKind.ELEMENTWISE, "sinh(a)", ("a",), np.sinh, "sinhf({0})", "sinh", None,
              RandomUse(("bounded",), lambda a: float(np.sinh(a))), grad=(lambda dy, a, y: dy * np.cosh(a),),
              cuda_grad=("({dy} * coshf({0}))",))
SIZES = Sizes(seq=5, batch=2, input=3, hidden=4, layers=2)


@pytest.fixture
def sinh(monkeypatch):
    monkeypatch.setitem(OPS, "sinh", SINH)


def sinh_cell():
    """h' = tanh(sinh(x W) - sinh(h U) + b)"""
    b = CellBuilder("Sinhs", input=SIZES.input, hidden=SIZES.hidden)
    x, h = b.input("x"), b.state("h")
    W, U = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden")
    bias = b.weight("b", "hidden")
    h_new = builder_module.tanh(builder_module.sinh(x @ W) - builder_module.apply("sinh", h @ U) + bias)
    b.update(h, h_new.named("h_new"))
    b.output(h_new)
    return b.build()


def data(cell, seed=0):
    params = init_params(cell, SIZES.layers, SIZES.input, SIZES.hidden, seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((SIZES.seq, SIZES.batch, SIZES.input))
    initial = {s: rng.standard_normal((SIZES.layers, SIZES.batch, SIZES.hidden)) for s in cell.updates}
    return params, x, initial


def test_the_builder_and_the_reference_know_the_new_op(sinh):
    cell = sinh_cell()
    assert sum(n.op == "sinh" for n in cell.nodes) == 2
    params, x, initial = data(cell)
    ref = run_reference(cell, params, {"x": x, **initial}, SIZES.layers)
    # by hand, layer 0 only
    p = {k[3:]: v.astype(np.float64) for k, v in params.items() if k.startswith("l0.")}
    h = initial["h"][0]
    for t in range(SIZES.seq):
        h = np.tanh(np.sinh(x[t] @ p["W"]) - np.sinh(h @ p["U"]) + p["b"])
    np.testing.assert_allclose(ref.final["h"][0], h, rtol=1e-6)


def test_without_the_table_entry_the_builder_does_not_know_it():
    with pytest.raises(AttributeError):
        _ = builder_module.sinh


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_runs_the_new_op_on_numpy(sinh, schedule):
    cell = sinh_cell()
    params, x, initial = data(cell)
    ref = run_reference(cell, params, {"x": x, **initial}, SIZES.layers)
    got = NumpyExecutor(make_plan(cell, SIZES, schedule), params, np.float64).run(x, initial)
    np.testing.assert_allclose(got.y, ref.y, rtol=1e-5, atol=1e-6)


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_generated_kernels_of_the_new_op_compile(sinh, tmp_path):
    cell = sinh_cell()
    parts = [PERSISTENT_PRELUDE, PRELUDE]
    for schedule in SCHEDULES:
        ks = plan_kernels(make_plan(cell, SIZES, schedule))
        for name, body in ks.sources.items():
            parts.append(body.replace(name, f"{name}_{schedule}"))
    source = "\n".join(parts)
    assert "// sinh" in source
    nvcc_ptx(source, tmp_path)  # the front end's checks: the op's CUDA is a C expression


def test_the_torch_baseline_runs_the_new_op(sinh):
    torch = pytest.importorskip("torch")
    from cellfuse.gpu_runtime.torch_baselines import make_step

    cell = sinh_cell()
    params, x, initial = data(cell)
    ref = run_reference(cell, params, {"x": x, **initial}, SIZES.layers)
    step = make_step(cell)
    weights = {k[3:]: torch.from_numpy(v.astype(np.float64))
               for k, v in params.items() if k.startswith("l0.")}
    states = (torch.from_numpy(initial["h"][0]),)
    for t in range(SIZES.seq):
        _, states = step(torch.from_numpy(x[t]), states, weights)
    np.testing.assert_allclose(states[0].numpy(), ref.final["h"][0], rtol=1e-5, atol=1e-6)


def test_random_cells_draw_the_new_op(sinh):
    cells = [random_cell(seed) for seed in range(40)]
    assert any(n.op == "sinh" for c in cells for n in c.nodes)


def test_the_backward_reference_differentiates_the_new_op(sinh):
    """The derivative rule in the table entry is all the backward pass needs: it matches a central
    difference of the forward pass along a random direction of the parameters."""
    cell = sinh_cell()
    rng = np.random.default_rng(0)
    params = init_params(cell, SIZES.layers, SIZES.input, SIZES.hidden, 0)
    inputs = {"x": rng.uniform(-1, 1, (SIZES.seq, SIZES.batch, SIZES.input))}
    dy = rng.standard_normal((SIZES.seq, SIZES.batch, SIZES.hidden))
    grads = run_reference_backward(cell, params, inputs, SIZES.layers, dy)
    direction = {k: rng.standard_normal(v.shape) for k, v in params.items()}

    def loss(eps: float) -> float:
        moved = {k: v.astype(np.float64) + eps * direction[k] for k, v in params.items()}
        return float(np.sum(dy * record_forward(cell, moved, inputs, SIZES.layers).y))

    numeric = (loss(1e-6) - loss(-1e-6)) / 2e-6
    exact = sum(float(np.sum(grads.dparams[k] * direction[k])) for k in params)
    assert abs(numeric - exact) <= 1e-6 * max(1.0, abs(exact))
