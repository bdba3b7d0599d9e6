"""cuDNN's persistent algorithms as a baseline: the module imports and says what is missing without torch or
a GPU, finds cuDNN's sub-libraries, turns a refusing status into a message that names the call, and places
the cell's weights where cuDNN's own equations (checked here on the CPU against the reference) expect them;
on the GPU (`-m gpu`), each algorithm against the reference, or refused with cuDNN's status."""

from __future__ import annotations

import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from cellfuse.codegen.precision import forward_tolerance
from cellfuse.gpu_runtime import bench
from cellfuse.gpu_runtime import cudnn_persistent as cp
from cellfuse.gpu_runtime.bench import TOLERANCE, BenchConfig, run_benchmark
from cellfuse.graph_model import Forward, Sizes, init_params, load_template, run_reference

ROOT = Path(__file__).resolve().parents[2]
SEQ, BATCH, INPUT, HIDDEN, LAYERS = 5, 3, 4, 6, 2


def test_the_module_imports_without_torch_and_says_so():
    code = ("import sys\n"
            "from cellfuse.gpu_runtime import bench, cudnn_persistent\n"
            "assert 'torch' not in sys.modules, 'imported torch'\n"
            "sys.modules['torch'] = None  # as if it were not installed\n"
            "print(cudnn_persistent.unavailable_reason())\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "PyTorch is not installed"


def fake_torch(gpu: bool = True, cudnn: bool = True, version: int | None = 90600):
    return types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: gpu),
        backends=types.SimpleNamespace(cudnn=types.SimpleNamespace(is_available=lambda: cudnn,
                                                                   version=lambda: version)))


@pytest.mark.parametrize(("torch", "reason"), [
    (fake_torch(gpu=False), "PyTorch sees no CUDA GPU"),
    (fake_torch(cudnn=False), "this PyTorch was built without cuDNN"),
    (fake_torch(version=8902), "PyTorch's cuDNN is version 8902; this baseline calls cuDNN 9's RNN library "
                               "libcudnn_adv.so.9"),
])
def test_what_is_missing_is_said(monkeypatch, torch, reason):
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert cp.unavailable_reason() == reason


def test_without_a_gpu_each_persistent_baseline_is_listed_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", fake_torch(gpu=False))
    cell, sizes = load_template("lstm"), Sizes(SEQ, BATCH, INPUT, HIDDEN, LAYERS)
    params = init_params(cell, LAYERS, INPUT, HIDDEN)
    x = np.zeros((SEQ, BATCH, INPUT), np.float32)
    problem = bench._Problem(cell, sizes, params, x, {}, BenchConfig(sizes), runs=1)
    assert len(cp.ALGORITHMS) == 3 and set(cp.ALGORITHMS) <= set(bench.BASELINES)
    for name in cp.ALGORITHMS:
        row, timed = bench._prepare_torch(problem, name)
        assert timed is None and not row.ok and row.median_ms is None
        assert row.note.startswith("not available: PyTorch sees no CUDA GPU; cuDNN's CUDNN_RNN_ALGO_PERSIST_")


# -- finding cuDNN's sub-libraries --------------------------------------------------------------------

def maps_line(path: Path) -> str:
    return f"7f3a1c000000-7f3a1c200000 r-xp 00000000 103:02 4242                       {path}"


def test_the_sub_libraries_are_found_beside_the_loaded_libcudnn(tmp_path):
    for name in ("libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_ops.so.9", "libcudnn_adv.so.9"):
        (tmp_path / name).touch()
    elsewhere = tmp_path / "other" / "libcudnn_graph.so.9.6.0"  # one already loaded is used as it is
    maps = "\n".join(["00400000-00401000 r-xp 00000000 00:00 0", maps_line(tmp_path / "libcudnn.so.9"),
                      maps_line(elsewhere), maps_line(tmp_path / "libcudnn_engines_precompiled.so.9"),
                      "7ffd5000-7ffd6000 rw-p 00000000 00:00 0                          [stack]"])
    assert cp.find_libraries(maps) == {"graph": elsewhere, "ops": tmp_path / "libcudnn_ops.so.9",
                                       "adv": tmp_path / "libcudnn_adv.so.9"}


def test_a_missing_sub_library_or_cudnn_is_named(tmp_path):
    (tmp_path / "libcudnn_graph.so.9").touch()
    (tmp_path / "libcudnn_ops.so.9").touch()
    with pytest.raises(cp.CudnnUnavailable, match=f"libcudnn_adv.so.9 is not loaded and not in {tmp_path}"):
        cp.find_libraries(maps_line(tmp_path / "libcudnn.so.9"))
    with pytest.raises(cp.CudnnUnavailable, match=r"not a shared library libcudnn\.so\.9"):
        cp.find_libraries(f"{maps_line(Path('/usr/lib/libcudnn.so.8'))}\n{maps_line(Path('/lib/libc.so.6'))}")


# -- calls and their statuses ---------------------------------------------------------------------------

class FakeLibrary:
    """Every cuDNN function: each succeeds but `refuses`, which returns CUDNN_STATUS_NOT_SUPPORTED_SHAPE."""

    def __init__(self, refuses: str = "", lacks: str = ""):
        self.refuses, self.lacks = refuses, lacks

    def __getattr__(self, name: str):
        if name.startswith("_") or name == self.lacks:
            raise AttributeError(name)

        def function(*args):
            if name == "cudnnGetErrorString":
                return {3002: b"CUDNN_STATUS_NOT_SUPPORTED_SHAPE"}.get(args[0])
            if name == "cudnnGetLastErrorString":
                args[0].value = b"CUDNN_STATUS_NOT_SUPPORTED_SHAPE;\n Reason: hiddenSize too large"
                return None
            return 3002 if name == self.refuses else 0

        return function


def test_a_refusing_status_names_the_call_and_cudnns_status():
    lib = FakeLibrary(refuses="cudnnBuildRNNDynamic")
    cudnn = cp.Cudnn({"graph": lib, "ops": lib, "adv": lib}, 90600)
    cudnn("cudnnCreate", None)
    with pytest.raises(cp.CudnnRefused) as refused:
        cudnn("cudnnBuildRNNDynamic", None, None, 8)
    e = refused.value
    assert (e.call, e.status) == ("cudnnBuildRNNDynamic", 3002)
    assert e.status_name == "CUDNN_STATUS_NOT_SUPPORTED_SHAPE"
    assert str(e) == ("cudnnBuildRNNDynamic returned CUDNN_STATUS_NOT_SUPPORTED_SHAPE (3002): "
                      "CUDNN_STATUS_NOT_SUPPORTED_SHAPE; Reason: hiddenSize too large")
    assert cudnn.status_name(1234) == "cudnnStatus_t 1234"  # a status cuDNN has no string for


def test_a_function_missing_from_its_library_is_named():
    with pytest.raises(cp.CudnnUnavailable, match="cudnnRNNForward is missing from libcudnn_adv.so.9"):
        cp.Cudnn({"graph": FakeLibrary(), "ops": FakeLibrary(), "adv": FakeLibrary(lacks="cudnnRNNForward")},
                 90600)


# -- the weights, placed by linLayerID ------------------------------------------------------------------

def cudnn_equations(kind: str, placed: dict, layers: int, x: np.ndarray, initial: list[np.ndarray]):
    """The forward pass as cuDNN's documentation of cudnnRNNMode_t writes it, on the matrices [out, in]
    and biases that cudnnGetRNNWeightParams hands out by linLayerID: for the LSTM, ids 0-3 act on x and
    4-7 on h for the gates i, f, c' (g) and o; for the GRU, 0-2 on x and 3-5 on h for r, z (cuDNN's
    update gate i) and h' (n), h' = tanh(W x + b_W + r * (R h + b_R)). Returns y and the final states."""
    def sigmoid(v):
        return 1.0 / (1.0 + np.exp(-v))

    seq, finals = x.astype(np.float64), []
    for layer in range(layers):
        def lin(i, v, layer=layer):
            matrix, bias = placed[layer, i]
            return v @ matrix.astype(np.float64).T + bias

        h = initial[0][layer].astype(np.float64)
        c = initial[1][layer].astype(np.float64) if kind == "lstm" else None
        ys = []
        for xt in seq:
            if kind == "lstm":
                i, f = sigmoid(lin(0, xt) + lin(4, h)), sigmoid(lin(1, xt) + lin(5, h))
                g, o = np.tanh(lin(2, xt) + lin(6, h)), sigmoid(lin(3, xt) + lin(7, h))
                c = f * c + i * g
                h = o * np.tanh(c)
            else:
                r, z = sigmoid(lin(0, xt) + lin(3, h)), sigmoid(lin(1, xt) + lin(4, h))
                n = np.tanh(lin(2, xt) + r * lin(5, h))
                h = (1 - z) * n + z * h
            ys.append(h)
        seq = np.stack(ys)
        finals.append([h] if kind == "gru" else [h, c])
    return seq, [np.stack(f) for f in zip(*finals, strict=True)]


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_weights_placed_by_lin_layer_id_compute_the_cell(kind):
    cell = load_template(kind)
    params = init_params(cell, LAYERS, INPUT, HIDDEN, seed=5)
    placed = cp.cudnn_weights(kind, params, LAYERS)
    gates = 4 if kind == "lstm" else 3
    assert sorted(placed) == [(layer, i) for layer in range(LAYERS) for i in range(2 * gates)]
    for (layer, i), (matrix, bias) in placed.items():
        width = INPUT if layer == 0 and i < gates else HIDDEN  # cuDNN's [out, in]: the cell's W transposed
        assert matrix.shape == (HIDDEN, width) and matrix.flags.c_contiguous and matrix.dtype == np.float32
        assert bias.shape == (HIDDEN,) and bias.dtype == np.float32
        if kind == "lstm" and i >= gates:
            assert not bias.any()  # the LSTM's one bias per gate is the input bias
    rng = np.random.default_rng(6)
    x = rng.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)
    initial = {s: rng.standard_normal((LAYERS, BATCH, HIDDEN)).astype(np.float32) for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, LAYERS)
    y, finals = cudnn_equations(kind, placed, LAYERS, x, [initial[s] for s in cell.updates])
    np.testing.assert_allclose(y, ref.y, rtol=1e-5, atol=1e-6)
    for s, final in zip(cell.updates, finals, strict=True):
        np.testing.assert_allclose(final, ref.final[s], rtol=1e-5, atol=1e-6)


# -- on the GPU -----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cuda_torch():
    """torch, where it runs on a GPU with cuDNN 9; else the test is skipped with the reason."""
    reason = cp.unavailable_reason()
    if reason:
        pytest.skip(reason)
    import torch

    return torch


def run_persistent(torch, kind: str, algo: int, sizes: Sizes, initial: bool, seed: int = 0,
                   half: bool = False):
    """(the reference's Forward, the persistent RNN's Forward, in float32), or CudnnRefused; with `half`,
    cuDNN's RNN in float16."""
    cell = load_template(kind)
    params = init_params(cell, sizes.layers, sizes.input, sizes.hidden, seed=seed)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((sizes.seq, sizes.batch, sizes.input)).astype(np.float32)
    states = {s: 0.5 * rng.standard_normal((sizes.layers, sizes.batch, sizes.hidden)).astype(np.float32)
              for s in cell.updates} if initial else {}
    ref = run_reference(cell, params, {"x": x, **states}, sizes.layers)
    model = cp.CudnnPersistentRNN(kind, params, sizes.layers, sizes.input, sizes.hidden, sizes.batch,
                                  sizes.seq, algo, half=half)
    dtype = torch.float16 if half else torch.float32
    side = torch.cuda.Stream()  # on torch's current stream, whichever it is
    with torch.cuda.stream(side):
        y = model(torch.from_numpy(x).cuda().to(dtype),
                  [torch.from_numpy(states[s]).cuda().to(dtype) for s in cell.updates] if initial else None)
    side.synchronize()
    finals = {s: f.float().cpu().numpy() for s, f in zip(cell.updates, model.final, strict=True)}
    got = Forward(y.float().cpu().numpy(), finals)
    model.close()
    return ref, got


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("batch", [1, 8])
def test_gpu_each_algorithm_computes_the_cell_or_is_refused(cuda_torch, kind, layers, batch):
    sizes = Sizes(seq=7, batch=batch, input=40, hidden=64, layers=layers)
    ran = []
    for name, algo in cp.ALGORITHMS.items():
        try:
            ref, got = run_persistent(cuda_torch, kind, algo, sizes, initial=True, seed=layers * 10 + batch)
        except cp.CudnnRefused as e:
            assert e.status != 0 and e.status_name.startswith("CUDNN_STATUS_"), e
            continue
        assert bench._rel_error(got, ref) < TOLERANCE, name
        ran.append(name)
    # At these small sizes the static kernel holds the weights on chip: it must run.
    assert "cudnn persistent static" in ran


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gpu_in_float16_each_algorithm_is_within_fp16s_bound_or_is_refused(cuda_torch, kind):
    sizes = Sizes(seq=7, batch=8, input=64, hidden=64, layers=2)
    ran = []
    for name, algo in cp.ALGORITHMS.items():
        try:
            ref, got = run_persistent(cuda_torch, kind, algo, sizes, initial=True, seed=3, half=True)
        except cp.CudnnRefused:
            continue
        assert bench._rel_error(got, ref) < forward_tolerance("fp16"), name
        ran.append(name)
    assert "cudnn persistent static" in ran


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_gpu_without_initial_states_they_start_at_zero(cuda_torch, kind):
    sizes = Sizes(seq=6, batch=4, input=64, hidden=64, layers=2)
    ref, got = run_persistent(cuda_torch, kind, cp.CUDNN_RNN_ALGO_PERSIST_STATIC, sizes, initial=False)
    assert bench._rel_error(got, ref) < TOLERANCE


@pytest.mark.gpu
def test_gpu_a_baseline_row_is_checked_and_timed_or_not_applicable(cuda_torch):
    cell, sizes = load_template("lstm"), Sizes(seq=5, batch=2, input=512, hidden=512, layers=1)
    params = init_params(cell, sizes.layers, sizes.input, sizes.hidden)
    x = np.random.default_rng(1).standard_normal((sizes.seq, sizes.batch, sizes.input)).astype(np.float32)
    initial = {s: np.zeros((sizes.layers, sizes.batch, sizes.hidden), np.float32) for s in cell.updates}
    problem = bench._Problem(cell, sizes, params, x, initial, BenchConfig(sizes, "cuda", warmup=1), runs=2)
    problem.ref = run_reference(cell, params, {"x": x, **initial})
    row, timed = bench._prepare_torch(problem, "cudnn persistent static")
    assert timed is not None and row.rel_error < TOLERANCE and "; cuDNN 9" in row.note
    assert timed.once() > 0
    # The kernel for small hidden sizes does not take 512: cuDNN says so, and the row says it.
    row, timed = bench._prepare_torch(problem, "cudnn persistent small h")
    assert timed is None and not row.ok and row.rel_error is None
    refused = r"not applicable: cudnn\w+ returned CUDNN_STATUS_NOT_SUPPORTED\w* \(30\d\d\)"
    assert re.match(refused, row.note), row.note


@pytest.mark.gpu
def test_gpu_the_benchmark_checks_and_times_them_or_says_why_not(gpu, cuda_torch):
    sizes = Sizes(seq=6, batch=4, input=32, hidden=48, layers=2)
    config = BenchConfig(sizes, "cuda", schedules=[], baselines=list(cp.ALGORITHMS), repeats=3, warmup=1)
    result = run_benchmark(load_template("lstm"), config)
    assert [r.name for r in result.rows] == list(cp.ALGORITHMS)
    for r in result.rows:
        if r.ok:
            assert r.rel_error < TOLERANCE and 0 < r.min_ms <= r.median_ms <= r.max_ms and "cuDNN 9" in r.note
        else:
            assert r.note.startswith("not applicable: cudnn") and " returned CUDNN_STATUS_" in r.note, r.note
    assert result.row("cudnn persistent static").ok
