"""The benchmark in training mode (forward + backward): every schedule's gradients and every baseline's,
checked against the float64 reference's before they are timed; on the numpy backend everywhere, the
PyTorch baselines' gradients on the CPU, and the whole benchmark on the GPU (`-m gpu`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from cellfuse.codegen import SCHEDULES
from cellfuse.codegen.precision import gradient_floor
from cellfuse.gpu_runtime import bench
from cellfuse.gpu_runtime.bench import TOLERANCE, TRAIN_BASELINES, BenchConfig, run_benchmark
from cellfuse.gpu_runtime.numpy_backward import NumpyBackward
from cellfuse.graph_model import (
    CellError,
    Gradients,
    Sizes,
    analyze,
    init_params,
    load_template,
    run_reference_backward,
    template_names,
)

SMALL = Sizes(seq=4, batch=3, input=8, hidden=6, layers=2)


@pytest.fixture
def backward_runs(monkeypatch):
    """The schedule of every backward run on the numpy executor, in the order they ran."""
    seen: list[str] = []
    original = NumpyBackward.run

    def run(self, dy, dfinal=None):
        seen.append(self.forward.plan.schedule)
        return original(self, dy, dfinal)

    monkeypatch.setattr(NumpyBackward, "run", run)
    return seen


@pytest.mark.parametrize("name", ["lstm", pytest.param("gru", marks=pytest.mark.slow),
                                  pytest.param("layernorm_lstm", marks=pytest.mark.slow)])
def test_every_schedule_is_checked_by_its_gradients_then_timed(backward_runs, name):
    result = run_benchmark(load_template(name), BenchConfig(SMALL, "numpy", repeats=2, train=True))
    assert result.train and [r.name for r in result.rows] == [*SCHEDULES, "numpy reference"]
    for r in result.rows:
        assert r.ok and r.rel_error < TOLERANCE and r.min_ms <= r.median_ms <= r.max_ms, (r.name, r.note)
    # One checked forward + backward run each, then two rounds that take every schedule in turn.
    assert backward_runs == list(SCHEDULES) * 3
    assert "forward + backward" in result.row("numpy reference").note
    record = json.loads(json.dumps(result.to_json()))
    assert record["train"] is True and record["measures"].startswith("forward + backward")


def test_the_forward_benchmark_says_it_times_the_forward_pass(backward_runs):
    result = run_benchmark(load_template("elman"), BenchConfig(SMALL, "numpy", repeats=1))
    record = result.to_json()
    assert record["train"] is False and record["measures"] == "forward" and backward_runs == []


def test_launches_per_step_count_forward_and_backward():
    config = BenchConfig(SMALL, "numpy", schedules=["fused"], baselines=[], repeats=1)
    forward = run_benchmark(load_template("lstm"), config).row("fused").launches_per_step
    config.train = True
    training = run_benchmark(load_template("lstm"), config).row("fused").launches_per_step
    assert forward == 3 and training == 6  # the backward step mirrors the forward one


def test_a_wrong_gradient_is_reported_and_never_timed(backward_runs, monkeypatch):
    original = NumpyBackward.run

    def wrong_when_hoisted(self, dy, dfinal=None):
        grads = original(self, dy, dfinal)
        if self.forward.plan.schedule == "hoisted":
            grads.dparams["l1.W_hz"][0, 0] += 1.0
        return grads

    monkeypatch.setattr(NumpyBackward, "run", wrong_when_hoisted)
    result = run_benchmark(load_template("gru"), BenchConfig(SMALL, "numpy", repeats=2, train=True))
    hoisted = result.row("hoisted")
    assert not hoisted.ok and hoisted.median_ms is None
    assert hoisted.rel_error > TOLERANCE and "wrong result" in hoisted.note
    assert backward_runs.count("hoisted") == 1  # the checked run only
    assert all(r.ok for r in result.rows if r.name != "hoisted")


def test_a_schedule_whose_backward_cannot_be_planned_is_reported(monkeypatch):
    from cellfuse.gpu_runtime import numpy_backward

    def refuse(plan):
        raise CellError(f"no backward plan for '{plan.schedule}'")

    monkeypatch.setattr(numpy_backward, "backward_plan", refuse)
    result = run_benchmark(load_template("mgu"), BenchConfig(SMALL, "numpy", schedules=["graph"], train=True))
    row = result.row("graph")
    assert not row.ok and row.applicable and row.note == "no backward plan for 'graph'"


def test_the_schedules_plans_save_their_steps_in_training(monkeypatch):
    made = []
    original = bench.make_plan

    def recording(*args, **kwargs):
        made.append(kwargs.get("save_steps"))
        return original(*args, **kwargs)

    monkeypatch.setattr(bench, "make_plan", recording)
    run_benchmark(load_template("elman"), BenchConfig(SMALL, "numpy", baselines=[], repeats=1, train=True))
    assert made and all(made)


def test_gradient_error_of_a_missing_or_broken_gradient_is_infinite():
    ref = Gradients(np.ones((2, 1, 3)), {"h": np.ones((1, 1, 3))}, {"l0.W": np.full((3, 3), 2.0)})
    same = Gradients(ref.dx.copy(), {"h": ref.dinitial["h"].copy()}, {"l0.W": ref.dparams["l0.W"].copy()})
    assert bench._grad_error(same, ref) == 0.0
    same.dparams["l0.W"][1, 1] += 0.02
    assert bench._grad_error(same, ref) == pytest.approx(0.01)  # relative to the gradient's largest value
    assert bench._grad_error(Gradients(ref.dx, {}, ref.dparams), ref) == float("inf")
    assert bench._grad_error(Gradients(ref.dx * np.nan, ref.dinitial, ref.dparams), ref) == float("inf")


def test_gradient_error_of_a_vanishing_gradient_counts_against_the_largest_gradient():
    """A gradient far below the largest, which float32 rounds to 0 (a saturated sigmoid's derivative), is
    not an error of 1; an error of that size in a large gradient still counts."""
    ref = Gradients(np.ones((2, 1, 3)), {"h": np.full((1, 1, 3), 1e-12)}, {"l0.W": np.full((3, 3), 2.0)})
    vanished = Gradients(ref.dx.copy(), {"h": np.zeros((1, 1, 3))}, {"l0.W": ref.dparams["l0.W"].copy()})
    assert bench._grad_error(vanished, ref) == pytest.approx(1e-12 / (2.0 * gradient_floor("fp32")))
    vanished.dx[0, 0, 0] += 1e-12
    assert bench._grad_error(vanished, ref) == pytest.approx(1e-12 / (2.0 * gradient_floor("fp32")))
    half = Gradients(ref.dx.copy(), {"h": np.full((1, 1, 3), 0.5e-12)}, ref.dparams)
    ref_small = Gradients(ref.dx, {"h": np.full((1, 1, 3), 1e-2)}, ref.dparams)
    assert bench._grad_error(half, ref_small) == pytest.approx(1.0, rel=1e-6)  # above the floor: relative


def test_slstm_float32_gradients_pass_the_check_though_its_input_gate_bias_has_none():
    """The sLSTM's output is the same for any common shift of its input gate's pre-activations, so the
    input-gate bias's gradient is 0 in exact arithmetic, and float32's sum of it over every step and row
    leaves rounding noise: measured against the largest gradient, as the check does, that passes."""
    cell = load_template("slstm")
    sizes = Sizes(seq=100, batch=8, input=64, hidden=64)
    params = init_params(cell, 1, sizes.input, sizes.hidden, 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((sizes.seq, sizes.batch, sizes.input))
    initial = {s: np.zeros((1, sizes.batch, sizes.hidden)) for s in cell.updates}
    ref = run_reference_backward(cell, params, {"x": x, **initial}, 1, rng.standard_normal(x.shape))
    assert np.max(np.abs(ref.dparams["l0.b_i"])) < 1e-12 * bench.largest_gradient(ref)
    result = run_benchmark(cell, BenchConfig(sizes, "numpy", schedules=["graph"], baselines=[], repeats=1,
                                             train=True))
    assert [(r.name, r.ok) for r in result.rows] == [("graph", True)]
    assert result.rows[0].rel_error < TOLERANCE


def test_training_baselines_are_those_that_run_backward():
    assert set(TRAIN_BASELINES) <= set(bench.BASELINES)
    assert "pytorch graph" not in TRAIN_BASELINES and not set(bench.CUDNN_PERSISTENT) & set(TRAIN_BASELINES)
    assert set(bench.TRAIN_NOTES) == set(TRAIN_BASELINES)


# -- the PyTorch baselines' gradients, on the CPU in float64 -----------------------------------------

SEQ, BATCH, INPUT, HIDDEN, LAYERS = 5, 3, 4, 6, 2


def baseline_problem(name: str, seed: int = 3):
    cell = load_template(name)
    width = HIDDEN if analyze(cell).ties else INPUT
    params = {k: v.astype(np.float64) for k, v in init_params(cell, LAYERS, width, HIDDEN, seed=seed).items()}
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((SEQ, BATCH, width))
    initial = {s: rng.standard_normal((LAYERS, BATCH, HIDDEN)) for s in cell.updates}
    dy = rng.standard_normal((SEQ, BATCH, HIDDEN))
    ref = run_reference_backward(cell, params, {"x": x, **initial}, LAYERS, dy)
    return cell, width, params, x, initial, dy, ref


def baseline_gradients(model, cell, x, initial, dy) -> Gradients:
    import torch

    from cellfuse.gpu_runtime.torch_baselines import Training

    training = Training(model, list(cell.updates), torch.from_numpy(x),
                        [torch.from_numpy(initial[s]) for s in cell.updates], torch.from_numpy(dy))
    first = training.gradients(training())
    again = training.gradients(training())  # a second call gives the same: no gradient accumulates
    assert bench._grad_error(again, first) == 0.0
    return first


@pytest.mark.parametrize("name", [*(n if n in ("lstm", "gru") else pytest.param(n, marks=pytest.mark.slow)
                                   for n in template_names())])
@pytest.mark.parametrize("kind", ["op by op", "as written by hand"])
def test_the_pytorch_programs_gradients_match_the_reference(name, kind):
    pytest.importorskip("torch")
    from cellfuse.gpu_runtime.torch_baselines import CompiledCell, TorchCell

    cell, _, params, x, initial, dy, ref = baseline_problem(name)
    model = (TorchCell(cell, params, LAYERS, device="cpu", train=True) if kind == "op by op"
             else CompiledCell(cell, params, LAYERS, None, device="cpu", train=True))
    assert bench._grad_error(baseline_gradients(model, cell, x, initial, dy), ref) < 1e-10


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_torch_nn_rnn_gradients_map_back_to_the_cells_parameters(kind):
    pytest.importorskip("torch")
    from cellfuse.gpu_runtime.torch_baselines import CudnnCell

    cell, width, params, x, initial, dy, ref = baseline_problem(kind)
    model = CudnnCell(kind, params, LAYERS, width, HIDDEN, device="cpu", train=True)
    got = baseline_gradients(model, cell, x, initial, dy)
    assert set(got.dparams) == set(ref.dparams)
    assert bench._grad_error(got, ref) < 1e-10


def test_a_baseline_under_autocast_trains_as_pytorchs_mixed_precision_does():
    """`bench --train --precision bf16` runs PyTorch's own baselines under torch.autocast: their training
    pass takes the wrapped model's parameters (float32 leaves) and gives gradients within bf16's bound of
    the float32 model's, and not the same ones."""
    torch = pytest.importorskip("torch")
    from cellfuse.codegen.precision import gradient_tolerance
    from cellfuse.gpu_runtime.torch_baselines import Autocast, TorchCell

    cell, _, params, x, initial, dy, _ = baseline_problem("lstm")
    params = {k: v.astype(np.float32) for k, v in params.items()}
    x, dy = x.astype(np.float32), dy.astype(np.float32)
    initial = {s: v.astype(np.float32) for s, v in initial.items()}
    full = baseline_gradients(TorchCell(cell, params, LAYERS, device="cpu", train=True), cell, x, initial, dy)
    mixed = baseline_gradients(Autocast(TorchCell(cell, params, LAYERS, device="cpu", train=True),
                                        torch.bfloat16), cell, x, initial, dy)
    assert all(g.dtype == np.float32 for g in mixed.dparams.values())
    assert 0 < bench._grad_error(mixed, full, "bf16") < gradient_tolerance("bf16")


def test_an_inference_baseline_keeps_no_graph():
    torch = pytest.importorskip("torch")
    from cellfuse.gpu_runtime.torch_baselines import CompiledCell, CudnnCell, TorchCell

    cell, width, params, x, initial, _, _ = baseline_problem("lstm")
    init = [torch.from_numpy(initial[s]) for s in cell.updates]
    for model in (TorchCell(cell, params, LAYERS, device="cpu"),
                  CompiledCell(cell, params, LAYERS, None, device="cpu"),
                  CudnnCell("lstm", params, LAYERS, width, HIDDEN, device="cpu")):
        assert not model(torch.from_numpy(x), init).requires_grad


# -- on the GPU, with the PyTorch baselines in training mode ----------------------------------------

GPU_SIZES = Sizes(seq=6, batch=4, input=32, hidden=48, layers=2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm"])
def test_gpu_training_benchmark_checks_and_times_every_implementation(gpu, name):
    pytest.importorskip("torch")
    result = run_benchmark(load_template(name), BenchConfig(GPU_SIZES, "cuda", repeats=4, warmup=1,
                                                            train=True))
    names = [r.name for r in result.rows]
    assert names[:len(SCHEDULES)] == list(SCHEDULES)
    expected = {"numpy reference", "pytorch eager", "torch.compile", "torch.compile default"}
    if name != "peephole_lstm":
        expected.add("cudnn")
    assert set(names[len(SCHEDULES):]) == expected
    for r in result.rows:
        assert r.ok, (r.name, r.note)
        assert r.rel_error < TOLERANCE and 0 < r.min_ms <= r.median_ms <= r.max_ms
    assert result.train and result.backend == "cuda" and "CUDA events" in result.timing


@pytest.mark.gpu
def test_gpu_training_benchmark_reports_a_wrong_backward_pass(gpu, monkeypatch):
    from cellfuse.gpu_runtime.cuda_backward import CudaBackward

    original = CudaBackward.run

    def off_by_one(self, dy, dfinal=None):
        grads = original(self, dy, dfinal)
        grads.dx += 1.0
        return grads

    monkeypatch.setattr(CudaBackward, "run", off_by_one)
    result = run_benchmark(load_template("mgu"), BenchConfig(GPU_SIZES, "cuda", baselines=[], repeats=2,
                                                             train=True))
    assert all(not r.ok and "wrong result" in r.note and r.median_ms is None for r in result.rows)
    assert np.isfinite([r.rel_error for r in result.rows]).all()


@pytest.mark.gpu
def test_gpu_timed_training_runs_give_the_checked_gradients(gpu, monkeypatch):
    """A timed run restores the seeded gradient buffers before its backward launches add into them: after
    the timing, the buffers hold the checked gradients again, not a sum over the runs."""
    from cellfuse.gpu_runtime.cuda_backward import CudaBackward

    kept = []
    original = CudaBackward.__init__

    def keep(self, forward):
        original(self, forward)
        kept.append(self)

    monkeypatch.setattr(CudaBackward, "__init__", keep)
    monkeypatch.setattr(CudaBackward, "close", lambda self: None)  # read after the benchmark, then freed
    cell = load_template("lstm")
    result = run_benchmark(cell, BenchConfig(GPU_SIZES, "cuda", schedules=["graph"], baselines=[], repeats=3,
                                             train=True))
    assert result.row("graph").ok
    backward = kept[0]
    plan = backward.plan
    drv = backward.forward.drv
    try:
        def read(name):
            out = np.empty(plan.buffer_elements(name), np.float32)
            drv.memcpy_dtoh(out, backward.forward.addr[name])
            return out

        s = GPU_SIZES
        params = init_params(cell, s.layers, s.input, s.hidden, 0)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((s.seq, s.batch, s.input)).astype(np.float32)
        dy = rng.standard_normal((s.seq, s.batch, s.hidden)).astype(np.float32)
        initial = {st: np.zeros((s.layers, s.batch, s.hidden), np.float32) for st in cell.updates}
        ref = run_reference_backward(cell, params, {"x": x, **initial}, s.layers, dy)
        assert bench._grad_error(plan.gradients(read), ref) < TOLERANCE
    finally:
        backward.memory.free()
