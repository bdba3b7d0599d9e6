"""The benchmark on the numpy backend (everywhere) and on the GPU with its PyTorch baselines (`-m gpu`):
every result checked before it is timed, timing in interleaved rounds, cancellation, records."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
from matplotlib.figure import Figure

from cellfuse.codegen import SCHEDULES
from cellfuse.codegen.precision import forward_tolerance, gradient_tolerance
from cellfuse.gpu_runtime import bench
from cellfuse.gpu_runtime.bench import TOLERANCE, BenchConfig, run_benchmark, run_sweep
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.gpu_runtime.plots import plot_result
from cellfuse.gpu_runtime.torch_baselines import FLASHRNN
from cellfuse.graph_model import CellError, Sizes, load_template

SMALL = Sizes(seq=4, batch=3, input=8, hidden=6, layers=2)


@pytest.fixture
def runs(monkeypatch):
    """The schedule of every numpy executor run, in the order they ran."""
    seen: list[str] = []
    original = NumpyExecutor.run

    def run(self, x, initial):
        seen.append(self.plan.schedule)
        return original(self, x, initial)

    monkeypatch.setattr(NumpyExecutor, "run", run)
    return seen


def test_every_schedule_is_checked_then_timed_in_rounds(runs):
    messages = []
    result = run_benchmark(load_template("lstm"), BenchConfig(SMALL, "numpy", repeats=3),
                           lambda done, total, m: messages.append((done, total, m)))
    assert [r.name for r in result.rows] == [*SCHEDULES, "numpy reference"]
    for r in result.rows:
        assert r.ok and r.rel_error < TOLERANCE
        assert r.min_ms <= r.median_ms <= r.max_ms
    # One checked run each, then three rounds that take every schedule in turn.
    assert runs == list(SCHEDULES) + list(SCHEDULES) * 3
    texts = [m for _, _, m in messages]
    last_check = max(i for i, t in enumerate(texts) if t.startswith("checking"))
    assert texts.index("timing, round 1 of 3") == last_check + 1
    assert [d for d, _, _ in messages] == list(range(len(messages) - 1)) + [messages[-1][1]]
    assert messages[-1][2] == "done"
    assert "median of 3 runs" in result.timing and not result.cancelled


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_wrong_result_is_reported_and_never_timed(runs, monkeypatch, precision):
    original = NumpyExecutor.run

    def wrong_when_fused(self, x, initial):
        out = original(self, x, initial)
        if self.plan.schedule == "fused":
            out.y[-1, 0, 0] += 1.0
        return out

    monkeypatch.setattr(NumpyExecutor, "run", wrong_when_fused)
    result = run_benchmark(load_template("gru"), BenchConfig(SMALL, "numpy", repeats=2, precision=precision))
    fused = result.row("fused")
    assert not fused.ok and fused.median_ms is None
    assert fused.rel_error > forward_tolerance(precision) and "wrong result" in fused.note
    assert runs.count("fused") == 1  # the checked run only
    assert all(r.ok for r in result.rows if r.name != "fused")


def test_a_schedule_that_cannot_be_planned_is_reported(monkeypatch):
    def refuse(cell, sizes, schedule, target, save_steps, precision):
        raise CellError(f"no plan for '{schedule}'")

    monkeypatch.setattr(bench, "make_plan", refuse)
    result = run_benchmark(load_template("mgu"), BenchConfig(SMALL, "numpy", schedules=["hoisted"]))
    assert not result.row("hoisted").ok and result.row("hoisted").note == "no plan for 'hoisted'"


def test_a_16_bit_benchmark_is_checked_within_its_bound_and_leaves_out_the_float32_rungs(runs):
    """In bf16 every plan stores in bf16 (an error above float32's tolerance, within bf16's bound); the
    rungs that run in float32 only are left out with the reason, not failed; the records say bf16."""
    config = BenchConfig(SMALL, "numpy", schedules=["hoisted", "graph", "persistent", "tensor"],
                         baselines=["numpy reference", "cudnn"], repeats=1, precision="bf16")
    result = run_benchmark(load_template("lstm"), config)
    assert [r.name for r in result.rows] == ["hoisted", "graph", "persistent", "tensor", "numpy reference"]
    for r in result.rows[:4]:
        assert r.ok and TOLERANCE < r.rel_error < forward_tolerance("bf16"), (r.name, r.rel_error)
    assert set(result.left_out) == {"cudnn"}
    wide = BenchConfig(Sizes(seq=2, batch=1, input=4, hidden=2048), "numpy", schedules=["graph", "tensor"],
                       baselines=[], repeats=1, precision="bf16")  # the weights do not fit on chip
    before = len(runs)
    left = run_benchmark(load_template("lstm"), wide)
    assert [r.name for r in left.rows] == ["graph"] and set(left.left_out) == {"tensor"}
    assert left.left_out["tensor"].startswith("the weights of gemm1 do not fit on chip")
    assert "float32" in left.left_out["tensor"] and "tensor" not in runs[before:]
    assert result.to_json()["precision"] == "bf16"
    assert {r["precision"] for r in csv.DictReader(io.StringIO(result.to_csv()))} == {"bf16"}
    fig = Figure()
    plot_result(result, fig)
    assert fig._suptitle.get_text().splitlines()[0].endswith(", in bf16")
    fp32 = run_benchmark(load_template("lstm"), BenchConfig(SMALL, "numpy", schedules=["graph", "persistent"],
                                                            baselines=[], repeats=1))
    assert fp32.to_json()["precision"] == "fp32" and fp32.left_out == {}
    assert all(r.ok and r.rel_error < TOLERANCE for r in fp32.rows)


def test_training_in_a_16_bit_precision_checks_the_gradients_within_its_bound():
    result = run_benchmark(load_template("gru"), BenchConfig(SMALL, "numpy", schedules=["naive", "graph"],
                                                             baselines=[], repeats=1, train=True,
                                                             precision="fp16"))
    assert [r.name for r in result.rows] == ["naive", "graph"]
    for row in result.rows:  # rounded, within the bound; a float32 run's errors are about 1e-7
        assert row.ok and 1e-5 < row.rel_error < gradient_tolerance("fp16")


def test_in_a_16_bit_precision_the_baselines_without_one_are_left_out(monkeypatch):
    """cuDNN's RNN (through torch and its persistent algorithms through its C API), FlashRNN and PyTorch's
    own programs run in bf16 (cuDNN's in fp16, FlashRNN in the type, the others under autocast); the sru
    package runs in float32 only so far. FlashRNN runs only the LSTM here."""
    from cellfuse.gpu_runtime import torch_baselines

    monkeypatch.setattr(torch_baselines, "torch_available", lambda: True)
    reasons = bench.baseline_reasons(load_template("lstm"), BenchConfig(SMALL, precision="bf16"), "cuda")
    assert {b for b, why in reasons.items() if why is None} == {"numpy reference", "cudnn", bench.FLASHRNN,
                                                               *bench.CUDNN_PERSISTENT, *bench.AUTOCAST}
    gru = bench.baseline_reasons(load_template("gru"), BenchConfig(SMALL, precision="bf16"), "cuda")
    assert gru[bench.FLASHRNN] == "not available: of FlashRNN's cells, the LSTM is the one measured here"
    assert set(bench.AUTOCAST) == {"pytorch eager", "pytorch graph", "torch.compile", "torch.compile default"}
    assert bench.baseline_reasons(load_template("sru"), BenchConfig(SMALL, precision="fp16"),
                                  "cuda")[bench.SRU_PACKAGE] == "runs in float32 only so far"
    fp32 = bench.baseline_reasons(load_template("lstm"), BenchConfig(SMALL), "cuda")
    assert all(why is None for b, why in fp32.items() if b != bench.SRU_PACKAGE)


def test_cancel_between_rounds_keeps_what_was_timed(runs):
    config = BenchConfig(SMALL, "numpy", schedules=["naive", "graph"], baselines=[], repeats=3)
    messages = []

    def cancelled() -> bool:
        return bool(messages) and messages[-1] == "timing, round 2 of 3"

    result = run_benchmark(load_template("elman"), config, lambda d, t, m: messages.append(m), cancelled)
    assert result.cancelled
    assert runs == ["naive", "graph", "naive", "graph", "naive", "graph"]  # checks, rounds 1 and 2
    assert all(r.ok and r.min_ms <= r.median_ms <= r.max_ms for r in result.rows)


def test_cancel_before_timing_reports_rows_as_untimed(runs):
    result = run_benchmark(load_template("elman"), BenchConfig(SMALL, "numpy", baselines=[]),
                           lambda d, t, m: None, lambda: len(runs) == len(SCHEDULES))
    assert result.cancelled and len(result.rows) == len(SCHEDULES)
    assert all(not r.ok and "cancelled before it was timed" in r.note for r in result.rows)


def test_sweep_records_and_csv():
    sweep = run_sweep(load_template("indrnn"), BenchConfig(SMALL, "numpy", schedules=["naive", "fused"],
                                                           baselines=[], repeats=1), "batch", [1, 5])
    assert [r.sizes.batch for r in sweep.results] == [1, 5]
    rows = list(csv.DictReader(io.StringIO(sweep.to_csv())))
    assert [(r["batch"], r["name"]) for r in rows] == [("1", "naive"), ("1", "fused"), ("5", "naive"),
                                                        ("5", "fused")]
    record = json.loads(json.dumps(sweep.to_json()))
    assert record["param"] == "batch" and record["results"][1]["sizes"]["batch"] == 5
    with pytest.raises(CellError, match="cannot sweep 'width'"):
        run_sweep(load_template("indrnn"), BenchConfig(SMALL, "numpy"), "width", [1])


# -- on the GPU, with the PyTorch baselines --------------------------------------------------------

GPU_SIZES = Sizes(seq=6, batch=4, input=32, hidden=48, layers=2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["lstm", "gru", "peephole_lstm"])
def test_gpu_benchmark_checks_and_times_every_implementation(gpu, name):
    pytest.importorskip("torch")
    result = run_benchmark(load_template(name), BenchConfig(GPU_SIZES, "cuda", repeats=4, warmup=1))
    names = [r.name for r in result.rows]
    assert names[:len(SCHEDULES)] == list(SCHEDULES)
    expected = {"numpy reference", "pytorch eager", "pytorch graph", "torch.compile", "torch.compile default"}
    if name != "peephole_lstm":
        expected.add("cudnn")  # same weights in torch.nn.LSTM / torch.nn.GRU
        expected.update(bench.CUDNN_PERSISTENT)  # and in cuDNN's persistent algorithms
    if name == "lstm":
        expected.add(FLASHRNN)
    assert set(names[len(SCHEDULES):]) == expected
    for r in result.rows:
        if r.name in bench.CUDNN_PERSISTENT and r.note.startswith("not applicable: "):
            continue  # cuDNN may refuse an algorithm at these sizes; that is not a failure
        if r.name == FLASHRNN and r.note.startswith("not available: "):
            continue  # an optional package (its own GPU test checks it where it is installed)
        assert r.ok, (r.name, r.note)
        assert r.rel_error < TOLERANCE and 0 < r.min_ms <= r.median_ms <= r.max_ms
    assert result.backend == "cuda" and "CUDA events" in result.timing


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_gpu_benchmark_in_a_16_bit_precision(gpu, precision):
    """The schedules up to persistent in the 16-bit type, cuDNN (its module and its persistent algorithm)
    with weights and inputs in fp16, PyTorch's program under autocast: each checked within the precision's
    bound, then timed."""
    pytest.importorskip("torch")
    config = BenchConfig(GPU_SIZES, "cuda", schedules=["graph", "wavefront", "persistent"],
                         baselines=["numpy reference", "cudnn", "pytorch eager", "pytorch graph",
                                    "cudnn persistent static"], repeats=4, warmup=1, precision=precision)
    result = run_benchmark(load_template("lstm"), config)
    assert [r.name for r in result.rows] == ["graph", "wavefront", "persistent", "numpy reference", "cudnn",
                                             "pytorch eager", "pytorch graph", "cudnn persistent static"]
    for r in result.rows:
        if r.name == "cudnn persistent static" and r.note.startswith("not applicable: "):
            continue  # cuDNN may refuse the algorithm at these sizes
        assert r.ok, (r.name, r.note)
        assert r.rel_error < forward_tolerance(precision) and 0 < r.min_ms <= r.median_ms <= r.max_ms
    if precision == "bf16":  # rounded to bf16, not run in float32 (fp16's rounding is nearer float32's)
        assert all(r.rel_error > TOLERANCE for r in result.rows if r.ok and r.name != "numpy reference")
    type_name = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[precision]
    # cuDNN's 16-bit RNN at its best, fp16: torch flattens no bf16 weights for cuDNN
    assert "its module and inputs in torch.float16" in result.row("cudnn").note
    assert ("flattens no bfloat16 weights" in result.row("cudnn").note) == (precision == "bf16")
    assert f"under torch.autocast to {type_name}" in result.row("pytorch eager").note
    assert not result.left_out
    assert result.to_json()["precision"] == precision


@pytest.mark.gpu
def test_gpu_benchmark_reports_a_wrong_schedule(gpu, monkeypatch):
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor

    original = CudaExecutor.results

    def off_by_one(self):
        out = original(self)
        out.y += 1.0
        return out

    monkeypatch.setattr(CudaExecutor, "results", off_by_one)
    result = run_benchmark(load_template("mgu"), BenchConfig(GPU_SIZES, "cuda", baselines=[], repeats=2))
    assert all(not r.ok and "wrong result" in r.note and r.median_ms is None for r in result.rows)
    assert np.isfinite([r.rel_error for r in result.rows]).all()


def test_a_rung_that_changes_nothing_says_so():
    result = run_benchmark(load_template("elman"), BenchConfig(SMALL, "numpy", baselines=[], repeats=1))
    notes = {r.name: r.note for r in result.rows}
    assert notes["combined"].startswith("the same launches as 'naive'")  # one matmul per left operand
    assert not any("the same launches" in notes[s] for s in ("fused", "hoisted", "graph"))
    lstm = run_benchmark(load_template("lstm"), BenchConfig(SMALL, "numpy", baselines=[], repeats=1))
    # a wavefront of steps that fit one chunk has nothing to overlap: it is the graph plan
    assert {r.name for r in lstm.rows if "the same launches" in r.note} == {"wavefront"}
    assert lstm.row("wavefront").note.startswith("the same launches as 'graph'")
