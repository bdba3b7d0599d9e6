"""The sru package's SRU as a peer baseline of the `sru` template: offered for that cell only, said to be
unavailable (not failed) where the package or its kernel is missing, and loaded with the template's
weights so that it computes the same forward pass and gradients."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.gpu_runtime import bench, torch_baselines
from cellfuse.gpu_runtime.bench import TOLERANCE, BenchConfig, run_benchmark
from cellfuse.gpu_runtime.torch_baselines import SRU_PACKAGE
from cellfuse.graph_model import Sizes, init_params, load_template, run_reference
from cellfuse.graph_model.backward import run_reference_backward

SIZES = Sizes(seq=5, batch=3, input=16, hidden=16, layers=2)


def test_it_is_offered_for_the_sru_cell_only(monkeypatch):
    monkeypatch.setattr(torch_baselines, "torch_available", lambda: True)
    config = BenchConfig(SIZES, "cuda", baselines=["pytorch eager", SRU_PACKAGE])
    assert bench.baseline_reasons(load_template("sru"), config, "cuda") == {"pytorch eager": None,
                                                                            SRU_PACKAGE: None}
    for name in ("lstm", "residual_lstm", "indrnn"):
        reasons = bench.baseline_reasons(load_template(name), config, "cuda")
        assert reasons == {"pytorch eager": None,
                           SRU_PACKAGE: "not available: the sru package implements only the SRU"}, name
    on_numpy = bench.baseline_reasons(load_template("sru"), config, "numpy")
    assert set(on_numpy) == {"pytorch eager", SRU_PACKAGE}
    assert all("numpy backend" in why for why in on_numpy.values())
    # it has a backward pass: training offers it too
    train = BenchConfig(SIZES, "cuda", baselines=[SRU_PACKAGE], train=True)
    assert bench.baseline_reasons(load_template("sru"), train, "cuda") == {SRU_PACKAGE: None}


def test_without_the_package_the_row_says_how_to_get_it(monkeypatch):
    def missing():
        try:
            import sru_package_that_is_not_there  # noqa: F401
        except ImportError as e:
            return f"the sru package does not import ({type(e).__name__}: {e}); {torch_baselines.SRU_INSTALL}"

    monkeypatch.setattr(torch_baselines, "sru_unavailable", missing)
    cell = load_template("sru")
    problem = bench._Problem(cell, SIZES, {}, None, {}, BenchConfig(SIZES, "cuda"), runs=1)
    row, timed = bench._prepare_torch(problem, SRU_PACKAGE)
    assert timed is None and not row.applicable and not row.ok and row.rel_error is None
    assert row.note.startswith("not available: the sru package does not import (ModuleNotFoundError")
    assert "pip install sru ninja" in row.note


def _problem():
    """The SRU template's float32 weights, x, initial c and a seed dy at SIZES."""
    cell = load_template("sru")
    params = init_params(cell, SIZES.layers, SIZES.input, SIZES.hidden)
    rng = np.random.default_rng(3)
    x, c0, dy = (rng.standard_normal(shape).astype(np.float32) for shape in (
        (SIZES.seq, SIZES.batch, SIZES.input), (SIZES.layers, SIZES.batch, SIZES.hidden),
        (SIZES.seq, SIZES.batch, SIZES.hidden)))
    return cell, params, x, c0, dy


def test_the_package_computes_the_template_with_its_weights():
    """On the CPU the package runs its own PyTorch recurrence: the weight mapping is checked here, forward
    and backward, wherever the package is installed (the benchmark checks its CUDA kernel on the GPU)."""
    pytest.importorskip("sru")
    torch = pytest.importorskip("torch")
    cell, params, x, c0, dy = _problem()
    model = torch_baselines.SruPackageCell(params, SIZES.layers, SIZES.input, SIZES.hidden, device="cpu")
    y = model(torch.from_numpy(x), [torch.from_numpy(c0)]).numpy()
    ref = run_reference(cell, params, {"x": x, "c": c0}, SIZES.layers)
    assert np.abs(y - ref.y).max() / np.abs(ref.y).max() < TOLERANCE
    # a wrong interleaving of the three matrices would not be caught by a symmetric weight: they differ
    assert not np.allclose(params["l0.W"], params["l0.W_f"])
    trained = torch_baselines.SruPackageCell(params, SIZES.layers, SIZES.input, SIZES.hidden, device="cpu",
                                             train=True)
    run = torch_baselines.Training(trained, ["c"], torch.from_numpy(x), [torch.from_numpy(c0)],
                                   torch.from_numpy(dy))
    got = run.gradients(run())
    want = run_reference_backward(cell, {k: v.astype(np.float64) for k, v in params.items()},
                                  {"x": x.astype(np.float64), "c": c0.astype(np.float64)}, SIZES.layers,
                                  dy.astype(np.float64))
    assert set(got.dparams) == set(want.dparams)
    assert bench._grad_error(got, want) < TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True])
def test_gpu_the_benchmark_checks_and_times_its_kernel(gpu, train):
    pytest.importorskip("torch")
    if reason := torch_baselines.sru_unavailable():
        pytest.skip(reason)
    sizes = Sizes(seq=6, batch=4, input=48, hidden=48, layers=2)
    config = BenchConfig(sizes, "cuda", schedules=["graph"], baselines=[SRU_PACKAGE], repeats=3, warmup=1,
                         train=train)
    result = run_benchmark(load_template("sru"), config)
    row = result.row(SRU_PACKAGE)
    assert row.ok, row.note
    assert row.rel_error < TOLERANCE and 0 < row.min_ms <= row.median_ms <= row.max_ms
