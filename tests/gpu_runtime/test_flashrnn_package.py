"""FlashRNN's LSTM as a peer baseline of the `lstm` template: offered for that cell only, said to be
unavailable (not failed) where the package is missing or its kernels do not build, and loaded with the
template's weights so that it computes the same forward pass (checked here with FlashRNN's own PyTorch
backend, where the package is installed; its fused CUDA kernel on the GPU)."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from cellfuse.gpu_runtime import bench, torch_baselines
from cellfuse.gpu_runtime.bench import BenchConfig, run_benchmark
from cellfuse.gpu_runtime.torch_baselines import FLASHRNN
from cellfuse.graph_model import Sizes, init_params, load_template

SIZES = Sizes(seq=5, batch=3, input=16, hidden=16, layers=2)


def test_it_is_offered_for_the_lstm_only(monkeypatch):
    monkeypatch.setattr(torch_baselines, "torch_available", lambda: True)
    config = BenchConfig(SIZES, "cuda", baselines=[FLASHRNN])
    assert bench.baseline_reasons(load_template("lstm"), config, "cuda") == {FLASHRNN: None}
    for name in ("gru", "peephole_lstm", "sru"):
        assert bench.baseline_reasons(load_template(name), config, "cuda") == {
            FLASHRNN: "not available: of FlashRNN's cells, the LSTM is the one measured here"}, name
    assert FLASHRNN not in bench.TRAIN_BASELINES  # forward only so far


def test_without_the_package_the_row_says_how_to_get_it(monkeypatch):
    real_import = builtins.__import__

    def without_flashrnn(name, *args, **kwargs):
        if name.split(".")[0] == "flashrnn":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_flashrnn)
    problem = bench._Problem(load_template("lstm"), SIZES, {}, None, {}, BenchConfig(SIZES, "cuda"), runs=1)
    row, timed = bench._prepare_torch(problem, FLASHRNN)
    assert timed is None and not row.applicable and not row.ok and row.rel_error is None
    assert row.note.startswith("not available: the flashrnn package does not import (ModuleNotFoundError")
    assert torch_baselines.FLASHRNN_INSTALL in row.note


def test_the_lstm_weights_map_to_flashrnns_layout():
    """FlashRNN's own PyTorch backend (`vanilla`) with the mapped weights computes what torch.nn.LSTM
    computes with the template's: two layers, from given initial states, in float32 and in bf16."""
    pytest.importorskip("flashrnn", reason="FlashRNN is not installed: " + torch_baselines.FLASHRNN_INSTALL)
    torch = pytest.importorskip("torch")
    params = init_params(load_template("lstm"), SIZES.layers, SIZES.input, SIZES.hidden)
    rng = np.random.default_rng(5)
    x, h0, c0 = (torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for shape in (
        (SIZES.seq, SIZES.batch, SIZES.input), *[(SIZES.layers, SIZES.batch, SIZES.hidden)] * 2))
    want = torch_baselines.CudnnCell("lstm", params, SIZES.layers, SIZES.input, SIZES.hidden,
                                     device="cpu")(x, [h0, c0])
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 3e-2)):
        model = torch_baselines.FlashRnnCell(params, SIZES.layers, SIZES.hidden, dtype, device="cpu",
                                             backend="vanilla")
        got = model(x.to(dtype), [h0.to(dtype), c0.to(dtype)])
        assert got.dtype == dtype and got.shape == want.shape
        assert float((got.float() - want).abs().max()) < tolerance, dtype


@pytest.mark.gpu
def test_its_fused_kernel_is_checked_and_timed_in_bf16(gpu):
    """In bf16 beside the schedules: within the precision's bound of the reference and timed; where the
    package is missing, a row that says so. Where it imports, its kernels must build and run."""
    result = run_benchmark(load_template("lstm"), BenchConfig(Sizes(seq=20, batch=8, input=64, hidden=64,
                                                                    layers=1), "cuda", schedules=["graph"],
                                                              baselines=[FLASHRNN], repeats=2,
                                                              precision="bf16"))
    row = result.row(FLASHRNN)
    if torch_baselines.flashrnn_unavailable() is not None:
        assert not row.applicable and row.note.startswith("not available")
    else:
        assert row.applicable and row.ok and row.median_ms > 0, row.note
