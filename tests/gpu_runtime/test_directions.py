"""`bench --bidirectional`'s two directions against torch's bidirectional LSTM and GRU on the CPU: the
float64 reference run in each direction and joined (directions.Directions) gives torch's outputs, final
states and every gradient, for full sequences and for rows of their own lengths (a PackedSequence)."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.gpu_runtime.directions import Directions
from cellfuse.graph_model import backward, load_template, record_forward, run_reference
from cellfuse.graph_model.lengths import STEPS_LEFT, masked
from cellfuse.graph_model.params import init_params

torch = pytest.importorskip("torch")

T, B, INPUT, H = 6, 4, 5, 7


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("lengths", [None, [6, 2, 4, 1]])
def test_both_directions_are_torchs(kind, lengths):
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from cellfuse.gpu_runtime.torch_baselines import CudnnCell

    cell = load_template(kind)
    params = {k: v.astype(np.float64) for k, v in init_params(cell, 1, INPUT, H, 3, True).items()}
    rng = np.random.default_rng(1)
    x = rng.standard_normal((T, B, INPUT))
    initial = {s: rng.standard_normal((2, B, H)) for s in cell.updates}
    dy = rng.standard_normal((T, B, 2 * H))
    if lengths is not None:
        cell = masked(cell)
        initial[STEPS_LEFT] = np.broadcast_to(np.array(lengths, float)[None, :, None], (2, B, H)).copy()
        for b, n in enumerate(lengths):
            dy[n:, b] = 0  # torch's padding is no output: no gradient reaches it
    d = Directions(2, H, None if lengths is None else np.array(lengths))
    runs = list(zip(d.params(params), d.inputs(x, initial), strict=True))
    got = d.forward([run_reference(cell, ps, {"x": xs, **init}) for ps, (xs, init) in runs])
    grads = d.gradients([backward(record_forward(cell, ps, {"x": xs, **init}), seed)
                         for (ps, (xs, init)), seed in zip(runs, d.seeds(dy), strict=True)])

    model = CudnnCell(kind, params, 1, INPUT, H, device="cpu", train=True, bidirectional=True)
    xt = torch.from_numpy(x).requires_grad_()
    hx = [torch.from_numpy(initial[s]).requires_grad_() for s in load_template(kind).updates]
    given = xt if lengths is None else pack_padded_sequence(xt, torch.tensor(lengths), enforce_sorted=False)
    y, finals = model.module(given, tuple(hx) if kind == "lstm" else hx[0])
    if lengths is not None:
        y, _ = pad_packed_sequence(y, total_length=T)
    finals = finals if kind == "lstm" else (finals,)
    # (run_reference computes in float64 and gives float32; the gradients are float64's)
    np.testing.assert_allclose(got.y, y.detach().numpy(), rtol=0, atol=1e-6)
    for s, value in zip(load_template(kind).updates, finals, strict=True):
        np.testing.assert_allclose(got.final[s], value.detach().numpy(), rtol=0, atol=1e-6)
    want = torch.autograd.grad(y, [xt, *hx, *model.parameters()], torch.from_numpy(dy))
    np.testing.assert_allclose(grads.dx, want[0].numpy(), rtol=0, atol=1e-11)
    for s, g in zip(load_template(kind).updates, want[1:1 + len(hx)], strict=True):
        np.testing.assert_allclose(grads.dinitial[s], g.numpy(), rtol=0, atol=1e-11)
    for key, g in model.param_gradients(want[1 + len(hx):]).items():
        np.testing.assert_allclose(grads.dparams[key], g, rtol=0, atol=1e-10, err_msg=key)


def test_of_the_baselines_only_cudnn_runs_both_directions(monkeypatch):
    from cellfuse.gpu_runtime import bench, torch_baselines
    from cellfuse.graph_model import Sizes

    monkeypatch.setattr(torch_baselines, "torch_available", lambda: True)
    config = bench.BenchConfig(Sizes(seq=T, batch=B, input=INPUT, hidden=H, layers=1), "cuda",
                               baselines=["cudnn", "pytorch eager", "torch.compile"], bidirectional=True)
    reasons = bench.baseline_reasons(load_template("lstm"), config, "cuda")
    assert reasons["cudnn"] is None
    assert reasons["pytorch eager"] == reasons["torch.compile"] == (
        "not with --bidirectional: of the baselines, only cuDNN's runs both directions")


@pytest.mark.gpu
@pytest.mark.parametrize("train", [False, True])
@pytest.mark.parametrize("lengths", [None, "uniform:2-6"])
def test_gpu_benchmark_runs_both_directions_side_by_side(gpu, train, lengths):
    """On the GPU each rung's two directions (two executors, two streams) and cuDNN's bidirectional LSTM
    match the reference, forward and in training."""
    from cellfuse.gpu_runtime.bench import TOLERANCE, BenchConfig, run_benchmark
    from cellfuse.graph_model import Sizes

    config = BenchConfig(Sizes(seq=T, batch=B, input=32, hidden=48, layers=1), "cuda",
                         schedules=["fused", "graph", "persistent", "tensor"],
                         baselines=[] if lengths else ["cudnn"], repeats=3, warmup=1, train=train,
                         lengths=lengths, bidirectional=True)
    result = run_benchmark(load_template("lstm"), config)
    assert [r.name for r in result.rows] == config.schedules + config.baselines
    for r in result.rows:
        assert r.ok, (r.name, r.note)
        assert r.rel_error < TOLERANCE and 0 < r.median_ms
