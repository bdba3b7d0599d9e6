"""The PyTorch baselines compute the cell: checked on the CPU against the reference (the benchmark checks
them again on the GPU before it times them)."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.graph_model import analyze, init_params, load_template, run_reference, template_names

torch = pytest.importorskip("torch")

from cellfuse.codegen.precision import forward_tolerance  # noqa: E402
from cellfuse.gpu_runtime.torch_baselines import (  # noqa: E402
    Autocast,
    CompiledCell,
    CudnnCell,
    TorchCell,
)

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


@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_in_bf16_the_baselines_run_in_it_within_its_bound(name):
    """As the benchmark runs them in bf16: PyTorch's programs under autocast with their weights float32,
    and torch.nn.LSTM / GRU with its module and inputs in bfloat16; each within bf16's bound of the
    reference, and not float32's result."""
    cell = load_template(name)
    params = init_params(cell, LAYERS, INPUT, HIDDEN, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    initial = {s: np.zeros((LAYERS, BATCH, HIDDEN), np.float32) for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, LAYERS)
    xt, init = torch.from_numpy(x), [torch.from_numpy(initial[s]) for s in cell.updates]
    eager = TorchCell(cell, params, LAYERS, device="cpu")
    models = {"op by op": (Autocast(eager, torch.bfloat16), xt, init),
              "as written by hand": (Autocast(CompiledCell(cell, params, LAYERS, None, device="cpu"),
                                              torch.bfloat16), xt, init),
              "cudnn": (CudnnCell(name, params, LAYERS, INPUT, HIDDEN, device="cpu", dtype=torch.bfloat16),
                        xt.bfloat16(), [s.bfloat16() for s in init])}
    for kind, (model, x_in, init_in) in models.items():
        y = model(x_in, init_in).float().numpy()
        error = np.abs(y - ref.y).max() / np.abs(ref.y).max()
        assert 1e-4 < error < forward_tolerance("bf16"), (kind, error)
    assert all(w.dtype == torch.float32 for w in eager.parameters())
