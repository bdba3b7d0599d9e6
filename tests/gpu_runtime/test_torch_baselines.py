"""The PyTorch baselines compute the cell: checked on the CPU against the reference (the benchmark checks
them again on the GPU before it times them)."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.graph_model import analyze, init_params, load_template, run_reference, template_names

torch = pytest.importorskip("torch")

from cellfuse.gpu_runtime.torch_baselines import CompiledCell, TorchCell  # noqa: E402

SEQ, BATCH, INPUT, HIDDEN, LAYERS = 5, 3, 4, 6, 2


@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("kind", ["op by op", "as written by hand"])
def test_the_pytorch_programs_match_the_reference(name, kind):
    cell = load_template(name)
    width = HIDDEN if analyze(cell).ties else INPUT  # a cell that ties the widths runs only where equal
    params = {k: v.astype(np.float64) for k, v in init_params(cell, LAYERS, width, HIDDEN, seed=3).items()}
    rng = np.random.default_rng(4)
    x = rng.standard_normal((SEQ, BATCH, width))
    initial = {s: rng.standard_normal((LAYERS, BATCH, HIDDEN)) for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, LAYERS)
    model = (TorchCell(cell, params, LAYERS, device="cpu") if kind == "op by op"
             else CompiledCell(cell, params, LAYERS, None, device="cpu"))
    y = model(torch.from_numpy(x), [torch.from_numpy(initial[s]) for s in cell.updates])
    np.testing.assert_allclose(y.numpy(), ref.y, rtol=1e-6, atol=1e-7)


@pytest.mark.slow  # torch.compile of several cells: a minute
def test_every_compiled_cell_has_compiled_code_of_its_own(monkeypatch):
    """torch.compile keeps its code per Python code object and runs a function uncompiled past 8 entries:
    a benchmark of several cells and modes must not time its later cells uncompiled."""
    import torch._dynamo

    graphs = []

    def counting_backend(gm, example_inputs):  # a torch.compile backend that counts what it compiles
        graphs.append(gm)
        return gm.forward

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, backend=counting_backend, dynamic=False))
    torch._dynamo.reset()
    for name in [*template_names(), *template_names()]:  # 20 compiled forwards, more than twice the limit
        cell = load_template(name)
        width = HIDDEN if analyze(cell).ties else INPUT
        params = init_params(cell, 1, width, HIDDEN)
        model = CompiledCell(cell, params, 1, "default", device="cpu")
        before = len(graphs)
        y = model(torch.ones(SEQ, BATCH, width), [torch.zeros(1, BATCH, HIDDEN) for _ in cell.updates])
        assert len(graphs) > before, f"{name}: run without being compiled"
        ref = run_reference(cell, params, {"x": np.ones((SEQ, BATCH, width), np.float32)}, 1)
        np.testing.assert_allclose(y.numpy(), ref.y, rtol=1e-5, atol=1e-6)


def test_the_hand_written_program_splits_the_hoisted_rows_once():
    """Each step reads its rows of a hoisted value (the input projection) from one split, whose backward
    is one concatenation; indexing the rows in every step would give autograd a zero-padded full-size
    gradient per step, which torch.compile sums in a kernel that reads all of them for every element."""
    cell = load_template("peephole_lstm")
    params = init_params(cell, 1, INPUT, HIDDEN, seed=3)
    model = CompiledCell(cell, params, 1, None, device="cpu", train=True)
    x = torch.zeros(SEQ, BATCH, INPUT)
    y = model(x, [torch.zeros(1, BATCH, HIDDEN) for _ in cell.updates])
    seen, kinds, todo = set(), [], [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        kinds.append(type(fn).__name__)
        todo += [nxt for nxt, _ in fn.next_functions]
    assert not any(k.startswith("SliceBackward") for k in kinds)
    assert any(k.startswith("SplitBackward") for k in kinds)
