"""Every schedule of every template on the GPU, against the reference interpreter."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import numpy as np
import pytest
from forward_errors import relative_error

from cellfuse.codegen import SCHEDULES, generate_cuda, make_plan
from cellfuse.codegen.plan_text import tensor_core_groups
from cellfuse.gpu_runtime.execute import run_schedule
from cellfuse.graph_model import (
    CellError,
    Sizes,
    analyze,
    expected_params,
    init_params,
    load_template,
    run_reference,
    template_names,
)

pytestmark = pytest.mark.gpu

LAYERS, SEQ, BATCH, INPUT, HIDDEN = 2, 7, 5, 24, 40


def width(cell) -> int:
    """The input size a run of the cell takes: the hidden size for a cell that ties the two widths."""
    return HIDDEN if analyze(cell).ties else INPUT


def data(cell, seed=0):
    rng = np.random.default_rng(seed)
    params = init_params(cell, LAYERS, width(cell), HIDDEN, seed)
    inputs = {"x": rng.standard_normal((SEQ, BATCH, width(cell))).astype(np.float32)}
    for s in cell.updates:
        inputs[s] = (0.5 * rng.standard_normal((LAYERS, BATCH, HIDDEN))).astype(np.float32)
    return params, inputs


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", template_names())
def test_schedule_matches_reference_on_gpu(gpu, name, schedule):
    cell = load_template(name)
    params, inputs = data(cell)
    ref = run_reference(cell, params, inputs)
    out = run_schedule(cell, params, inputs, None, schedule, "cuda")
    assert rel(out.y, ref.y) < 1e-4
    for s in ref.final:
        assert rel(out.final[s], ref.final[s]) < 1e-4


def test_graph_replay_gives_the_same_result_twice(gpu):
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor

    cell = load_template("lstm")
    params, inputs = data(cell, 3)
    plan = make_plan(cell, Sizes(SEQ, BATCH, INPUT, HIDDEN, LAYERS), "graph")
    ex = CudaExecutor(plan, params)
    initial = {s: inputs[s] for s in cell.updates}
    first = ex.run(inputs["x"], initial)
    second = ex.run(inputs["x"], initial)  # replays the captured graph on freshly poisoned buffers
    assert ex.graph_exec is not None
    np.testing.assert_array_equal(first.y, second.y)
    ex.close()


@pytest.mark.parametrize("chunk", [0, 1, 3, SEQ])
@pytest.mark.parametrize("schedule", ["hoisted", "graph"])
@pytest.mark.parametrize("name", ["lstm", "gru_cho", "mgu"])
def test_hoisted_chunks_beside_the_loop_match_reference(gpu, name, schedule, chunk):
    """Chunks of 1, 3 (the last one short) and all steps on the side stream, and no side stream at all,
    over two layers (layer 1's chunks wait for layer 0's steps), run twice on the same buffers."""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor

    cell = load_template(name)
    params, inputs = data(cell, 5)
    sizes = Sizes(SEQ, BATCH, width(cell), HIDDEN, LAYERS)
    plan = replace(make_plan(cell, sizes, schedule), chunk_steps=chunk)
    assert any(lp.prologue for lp in plan.layers)
    ref = run_reference(cell, params, inputs)
    ex = CudaExecutor(plan, params)
    initial = {s: inputs[s] for s in cell.updates}
    for _ in range(2):
        out = ex.run(inputs["x"], initial)
        assert rel(out.y, ref.y) < 1e-4
        for s in ref.final:
            assert rel(out.final[s], ref.final[s]) < 1e-4
    ex.close()


def test_out_of_memory_is_reported_with_the_size_needed(gpu):
    cell = load_template("lstm")
    huge = Sizes(seq=100000, batch=4096, input=1024, hidden=1024, layers=1)
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor

    plan = make_plan(cell, huge, "hoisted")
    params = {k: np.zeros(s, np.float32) for k, s in expected_params(cell, 1, 1024, 1024).items()}
    with pytest.raises(CellError, match="out of GPU memory: these sizes need"):
        CudaExecutor(plan, params)


def exported_y(cell, schedule: str, params: dict, x: np.ndarray, tmp_path, **options) -> np.ndarray:
    """y of the demo program of the cell's export (generate_cuda's `options`), built with nvcc and run on
    x from zero states with the parameters, through its files."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    src = generate_cuda(cell, Sizes(SEQ, BATCH, width(cell), HIDDEN, LAYERS), schedule, **options)
    cu = tmp_path / "export.cu"
    cu.write_text(src.text)
    exe = tmp_path / "export"
    build = subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-DCELLFUSE_DEMO_MAIN", str(cu), "-lcublas",
                            "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    keys = list(expected_params(cell, LAYERS, INPUT, HIDDEN))
    np.concatenate([params[k].reshape(-1) for k in keys]).astype(np.float32).tofile(tmp_path / "d.params.f32")
    x.tofile(tmp_path / "d.x.f32")
    proc = subprocess.run([str(exe), str(SEQ), str(BATCH), str(tmp_path / "d")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(tmp_path / "d.y.f32", np.float32).reshape(SEQ, BATCH, HIDDEN)


@pytest.mark.parametrize("schedule", ["hoisted", "persistent"])
@pytest.mark.parametrize("name", template_names())
def test_exported_program_matches_reference(gpu, name, schedule, tmp_path):
    cell = load_template(name)
    params, inputs = data(cell, 1)
    inputs = {"x": inputs["x"]}  # the demo program starts from zero states
    y = exported_y(cell, schedule, params, inputs["x"], tmp_path)
    assert rel(y, run_reference(cell, params, inputs).y) < 1e-4


EXPORTS_16 = [(name, schedule, precision, None) for name in ("lstm", "gru", "slstm")
              for schedule in ("hoisted", "persistent", "tensor") for precision in ("bf16", "fp16")]


@pytest.mark.parametrize("name, schedule, precision, float32_states",
                         [*EXPORTS_16, ("lstm", "hoisted", "bf16", ())])
def test_exported_16_bit_program_is_within_its_bound(gpu, name, schedule, precision, float32_states,
                                                     tmp_path):
    """The demo program of an export in 16 bits (float32 arrays converted at the launcher's edges) within
    the precision's bound of the reference, as the executor's run of the same plan is (the LSTM with c in
    bf16 too: emulated, 1.2 units of its rounding at T=100)."""
    from cellfuse.codegen.precision import forward_tolerance

    cell = load_template(name)
    params, inputs = data(cell, 1)
    inputs = {"x": inputs["x"]}
    y = exported_y(cell, schedule, params, inputs["x"], tmp_path, precision=precision,
                   float32_states=float32_states)
    ref = run_reference(cell, params, inputs).y
    assert 1e-6 < rel(y, ref) < forward_tolerance(precision), f"{rel(y, ref):.2e}"  # rounded, in bound


@pytest.mark.parametrize("schedule", ["graph", "persistent", "tensor"])
@pytest.mark.parametrize("name", ["lstm", "indrnn"])
def test_exported_launcher_of_both_directions_matches_reference(gpu, name, schedule, tmp_path):
    """The demo program of an export with --bidirectional runs both directions (side by side, or one after
    the other where the persistent kernels have exchanges) and writes y [seq, batch, 2 * hidden]: the
    reference's forward direction, then its reverse one over x reversed in time."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    from cellfuse.gpu_runtime.directions import Directions

    cell = load_template(name)
    params = init_params(cell, 1, width(cell), HIDDEN, seed=2, bidirectional=True)
    x = np.random.default_rng(2).standard_normal((SEQ, BATCH, width(cell))).astype(np.float32)
    src = generate_cuda(cell, Sizes(SEQ, BATCH, width(cell), HIDDEN, 1), schedule, bidirectional=True)
    cu, exe = tmp_path / f"{name}.cu", tmp_path / name
    cu.write_text(src.text)
    build = subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-DCELLFUSE_DEMO_MAIN", str(cu), "-lcublas",
                            "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    keys = list(expected_params(cell, 1, width(cell), HIDDEN, bidirectional=True))
    np.concatenate([params[k].reshape(-1) for k in keys]).astype(np.float32).tofile(tmp_path / "d.params.f32")
    x.tofile(tmp_path / "d.x.f32")
    proc = subprocess.run([str(exe), str(SEQ), str(BATCH), str(tmp_path / "d")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "both directions" in proc.stdout
    y = np.fromfile(tmp_path / "d.y.f32", np.float32).reshape(SEQ, BATCH, 2 * HIDDEN)
    d = Directions(2, HIDDEN)
    zeros = {s: np.zeros((2, BATCH, HIDDEN), np.float32) for s in cell.updates}
    want = d.forward([run_reference(cell, ps, {"x": xs, **init})
                      for ps, (xs, init) in zip(d.params(params), d.inputs(x, zeros), strict=True)])
    assert rel(y, want.y) < 1e-4


@pytest.mark.parametrize("schedule", ["graph", "persistent"])
@pytest.mark.parametrize("name", ["lstm", "gru_cho", "layernorm_lstm", "indrnn"])
def test_exported_backward_agrees_with_finite_differences(gpu, name, schedule, tmp_path):
    """The demo program of an export with --backward checks the gradients of three parameter elements
    against finite differences of the forward pass, and fails where they disagree (IndRNN's relu has kinks
    near any point: the one-sided differences are what it passes on)."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    cell = load_template(name)
    src = generate_cuda(cell, Sizes(SEQ, BATCH, width(cell), HIDDEN, LAYERS), schedule, backward=True)
    cu = tmp_path / f"{name}.cu"
    cu.write_text(src.text)
    exe = tmp_path / name
    build = subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-DCELLFUSE_DEMO_MAIN", str(cu), "-lcublas",
                            "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    proc = subprocess.run([str(exe), str(SEQ), str(BATCH)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("central difference") == 3, proc.stdout


def _broken_kernels(monkeypatch, tag: str):
    """Makes the next executor compile a module with an error in it (unique, so no cache answers)."""
    from cellfuse.gpu_runtime import cuda_executor

    original = cuda_executor.plan_kernels

    def broken(plan):
        kernels = original(plan)
        name = next(iter(kernels.sources))
        kernels.sources[name] = kernels.sources[name].replace("{", "{ float oops = " + tag + ";", 1)
        return kernels

    monkeypatch.setattr(cuda_executor, "plan_kernels", broken)


def test_gpu_compile_error_is_reported_with_its_line(gpu, monkeypatch):
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor

    _broken_kernels(monkeypatch, "undefined_thing_1")
    cell = load_template("elman")
    params, _ = data(cell)
    plan = make_plan(cell, Sizes(SEQ, BATCH, INPUT, HIDDEN, LAYERS), "fused")
    with pytest.raises(CellError, match="nvcc could not compile") as e:
        CudaExecutor(plan, params)
    assert '"undefined_thing_1" is undefined' in str(e.value)
    assert "float oops = undefined_thing_1;" in str(e.value)


def test_gpu_without_nvcc_says_so(gpu, monkeypatch, tmp_path):
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor

    _broken_kernels(monkeypatch, "2")  # valid code, but a source no cache has seen
    monkeypatch.setenv("PATH", str(tmp_path))
    cell = load_template("elman")
    params, _ = data(cell)
    plan = make_plan(cell, Sizes(SEQ, BATCH, INPUT, HIDDEN, LAYERS), "fused")
    with pytest.raises(CellError, match="nvcc could not be run"):
        CudaExecutor(plan, params)


def test_gpu_nan_in_the_output_is_an_error(gpu):
    cell = load_template("lstm")
    params, inputs = data(cell)
    params["l1.U_f"][0, 0] = np.nan
    with pytest.raises(CellError, match="NaN or infinity"):
        run_schedule(cell, params, inputs, None, "graph", "cuda")


@pytest.mark.parametrize("schedule, name, batch, hidden, layers", [
    ("persistent", "lstm", 1, 512, 1), ("persistent", "lstm", 8, 512, 1), ("persistent", "lstm", 64, 512, 1),
    ("persistent", "lstm", 80, 512, 3), ("persistent", "gru_cho", 1, 512, 1),
    ("persistent", "gru", 1, 512, 1), ("persistent", "elman", 1, 512, 1), ("persistent", "mgu", 1, 256, 2),
    ("persistent", "gru_cho", 64, 512, 2), ("persistent", "mgu", 8, 512, 1),
    ("persistent", "indrnn", 64, 512, 3), ("persistent", "sru", 19, 512, 2),
    ("persistent", "sru", 64, 512, 1), ("persistent", "peephole_lstm", 64, 256, 1),
    ("persistent", "lstm", 8, 1024, 1), ("wavefront", "lstm", 1, 512, 3), ("wavefront", "lstm", 64, 512, 4),
    ("wavefront", "gru_cho", 8, 512, 3), ("wavefront", "indrnn", 64, 512, 3), ("wavefront", "sru", 8, 512, 2),
    ("wavefront", "residual_lstm", 8, 512, 2), ("wavefront", "lstm", 8, 256, 2),
    ("tensor", "lstm", 1, 512, 1), ("tensor", "lstm", 8, 512, 1), ("tensor", "lstm", 64, 512, 1),
    ("tensor", "lstm", 80, 512, 3), ("tensor", "gru_cho", 64, 512, 2), ("tensor", "mgu", 8, 512, 1),
    ("tensor", "peephole_lstm", 64, 256, 1), ("tensor", "lstm", 8, 1024, 1), ("tensor", "lstm", 64, 1024, 1),
    ("tensor", "gru", 64, 600, 2), ("tensor", "lstm", 64, 900, 1),
])
def test_persistent_at_full_sizes_matches_reference(gpu, schedule, name, batch, hidden, layers):
    """Every block count, tiling and split of K the H100 sizes give: 128 blocks at hidden 512, a batch of
    one (each thread's two k times the weights in its registers: 16, 12 padded to 16, 8 and 4, 4 and 2
    columns, K of 512 and 256) and of 80 (two row tiles, the second partial), 16 MiB of U on chip;
    steps with no GEMM in row groups (IndRNN and the SRU at B=64: eight of 8 rows; at B=19 two, the
    second of 9 rows);
    wavefronts of 2 to 4 layers, each on streams of its own with cuBLAS planning its GEMMs for its share
    of the SMs, over two chunks of steps; and the persistent kernels on
    tensor cores (a batch of one padded to 16 rows, warps splitting K, K staged whole where it fits beside
    the weights (hidden 600, and 1024 at B=8) and else in chunks of 512, with a partial last one at hidden
    900, the weights that do not fit with the larger tiles on the CUDA cores)."""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    cell = load_template(name)
    seq, rng = 12, np.random.default_rng(1)
    params = init_params(cell, layers, 512, hidden, 1)
    x = rng.standard_normal((seq, batch, 512)).astype(np.float32)
    initial = {s: (0.5 * rng.standard_normal((layers, batch, hidden))).astype(np.float32)
               for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, layers)
    plan = make_plan(cell, Sizes(seq, batch, 512, hidden, layers), schedule, device_target())
    ex = CudaExecutor(plan, params)
    out = ex.run(x, initial)
    again = ex.run(x, initial)  # the captured graph replayed
    ex.close()
    assert rel(out.y, ref.y) < 1e-4
    for s in ref.final:
        assert rel(out.final[s], ref.final[s]) < 1e-4
    np.testing.assert_array_equal(out.y, again.y)


def test_the_tensor_rungs_products_keep_float32s_accuracy_at_any_scale(gpu):
    """Each float32 product of the tensor rung's step GEMM is three fp16 ones over rows and columns scaled
    by powers of two (f16x3.cuh's cf_split_f16x3): a linear cell, h' = h @ U + x @ W with x = 0,
    whose batch rows lie 1e-20 to 1e20 apart (one of them zero) and U's columns 1e-3 to 1e3, gives at
    every step, element by element, the float64 product of its own previous output within 2^-20 of the
    sum of the terms' magnitudes (unscaled, fp16 would flush the small rows to zero and overflow the
    large ones); a row with an inf in it gives non-finite values in that row alone."""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target
    from cellfuse.graph_model import CellBuilder

    b = CellBuilder("linear", "a linear RNN")
    x, h = b.input("x"), b.state("h")
    W, U = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden")
    h_new = (x @ W + h @ U).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    seq, batch, hidden, rng = 3, 16, 512, np.random.default_rng(7)
    u = rng.standard_normal((hidden, hidden)) / np.sqrt(hidden) * np.logspace(-3, 3, hidden)[None, :]
    params = {"l0.W": rng.standard_normal((hidden, hidden)).astype(np.float32), "l0.U": u.astype(np.float32)}
    h0 = rng.standard_normal((1, batch, hidden)) * np.logspace(-20, 20, batch)[None, :, None]
    h0[0, 3] = 0.0
    h0[0, 5, 17] = np.inf
    plan = make_plan(cell, Sizes(seq, batch, hidden, hidden, 1), "tensor", device_target())
    assert any(item.mma for item in plan.layers[0].persistent.items)
    ex = CudaExecutor(plan, params)
    out = ex.run(np.zeros((seq, batch, hidden), np.float32), {"h": h0.astype(np.float32)})
    ex.close()
    finite = np.arange(batch) != 5
    assert not np.isfinite(out.y[0, 5]).any() and np.isfinite(out.y[:, finite]).all()
    uu = params["l0.U"].astype(np.float64)
    before = h0[0].astype(np.float32).astype(np.float64)
    for t in range(seq):
        got = out.y[t, finite].astype(np.float64)
        want, size = before[finite] @ uu, np.abs(before[finite]) @ np.abs(uu)
        assert np.all(np.abs(got - want) <= 2.0 ** -20 * size), t
        assert np.all(got[3] == 0.0)  # the zero row
        before = out.y[t].astype(np.float64)


@pytest.mark.parametrize("schedule, name, seq, batch, layers", [
    ("persistent", "lstm", 16, 80, 1), ("persistent", "slstm", 16, 80, 2), ("graph", "gru", 12, 160, 1),
    ("wavefront", "residual_lstm", 12, 128, 2),
])
def test_hoisted_gemms_on_tensor_cores_match_reference(gpu, schedule, name, seq, batch, layers):
    """Hoisted GEMMs of at least 2^30 multiply-adds run on tensor cores, three fp16 products each (whole,
    or in chunks of 10 steps beside the loop): float32's accuracy, the captured graph replayed alike. (The
    sLSTM starts from zero states: from random ones, its normaliser n can start near 0, and h = c / n
    amplifies any rounding.)"""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    cell = load_template(name)
    rng = np.random.default_rng(3)
    params = init_params(cell, layers, 512, 512, 3)
    x = rng.standard_normal((seq, batch, 512)).astype(np.float32)
    scale = 0.0 if name == "slstm" else 0.5
    initial = {s: (scale * rng.standard_normal((layers, batch, 512))).astype(np.float32)
               for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, layers)
    plan = make_plan(cell, Sizes(seq, batch, 512, 512, layers), schedule, device_target())
    assert tensor_core_groups(plan)
    ex = CudaExecutor(plan, params)
    out = ex.run(x, initial)
    again = ex.run(x, initial)
    ex.close()
    assert rel(out.y, ref.y) < 1e-4
    for s in ref.final:
        assert rel(out.final[s], ref.final[s]) < 1e-4
    np.testing.assert_array_equal(out.y, again.y)


def test_a_captured_graph_chooses_one_scale_or_a_scale_per_row_at_each_replay(gpu):
    """The hoisted GEMM's split decides on the GPU, at every replay of the captured pass, whether one power
    of two serves all of x (its rows' largest values within 2^20: the GEMM's alpha undoes the scales) or
    each row needs its own (rows 2^-24 below the others: the pass undoes them): x of each kind in turn,
    each against the reference, and the first x again gives the first run's output to the bit (the
    ranges zeroed at every replay, none left from the run before)."""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    cell, seq, batch = load_template("lstm"), 16, 80
    rng = np.random.default_rng(5)
    params = init_params(cell, 1, 512, 512, 5)
    plain = rng.standard_normal((seq, batch, 512)).astype(np.float32)
    spread = plain.copy()
    spread[:, :8] *= np.float32(2.0**-24)
    initial = {s: (0.5 * rng.standard_normal((1, batch, 512))).astype(np.float32) for s in cell.updates}
    plan = make_plan(cell, Sizes(seq, batch, 512, 512), "persistent", device_target())
    assert tensor_core_groups(plan) and plan.cuda_graph
    ex = CudaExecutor(plan, params)
    outs = [ex.run(x, initial) for x in (plain, spread, plain)]
    ex.close()
    for x, out in zip((plain, spread), outs, strict=False):
        ref = run_reference(cell, params, {"x": x, **initial}, 1)
        assert rel(out.y, ref.y) < 1e-4
        for s in ref.final:
            assert rel(out.final[s], ref.final[s]) < 1e-4
    np.testing.assert_array_equal(outs[2].y, outs[0].y)
    assert not np.array_equal(outs[1].y, outs[0].y)


def _split_kernels(drv):
    """gemm_splits.cuh's maxima (of rows, of columns) and split kernels, prepared."""
    from cellfuse.codegen.cuda_kernels import PRELUDE
    from cellfuse.gpu_runtime.cuda_executor import _compile

    module = drv.module_from_buffer(_compile(PRELUDE))
    return (module.get_function("cf_f16x3_row_maxima").prepare("PPPiii"),
            module.get_function("cf_f16x3_maxima").prepare("PPPiii"),
            module.get_function("cf_split_f16x3_copies").prepare("PPPPPPiiiii"))


def _measured(drv, kernels, src_at: int, rows: int, cols: int, ld: int, per_column: bool):
    """An operand's maxima and range on the GPU, as f16x3_steps makes them (the range zeroed first)."""
    from cellfuse.codegen.gemm_routes import SIDE_BY_SIDE, maxima_threads, split_threads
    from cellfuse.codegen.kernel_abi import BLOCK, grid_blocks

    row_maxima, maxima, _ = kernels
    m_d = drv.to_device(np.zeros(cols if per_column else rows, np.float32))
    range_d = drv.to_device(np.zeros(4, np.uint32))
    kernel, threads = ((maxima, maxima_threads(rows, cols)) if per_column
                       else (row_maxima, split_threads(rows, cols, SIDE_BY_SIDE)))
    kernel.prepared_call((grid_blocks(int(threads)), 1), (BLOCK, 1, 1), m_d, range_d, src_at, rows, cols, ld)
    return m_d, range_d


@pytest.mark.parametrize("layout, lo_piece", [(0, 2), (1, 1), (2, 2), (0, 1)])  # A's and W's orders
@pytest.mark.parametrize("rows, cols, ld, offset", [
    (64, 512, 512, 0),  # whole 16-byte groups
    (37, 5, 7, 0),  # a row length that is not a multiple of 4: one value at a time
    (9, 12, 12, 3),  # a source that does not start on 16 bytes
    (600, 8, 12, 0),  # more threads than one block, rows of 8 in rows of 12, columns of 3 blocks of rows
    (70, 45, 50, 1),  # tiles of 32 x 32 cut at both edges, transposed
])
@pytest.mark.parametrize("spread", ["wide", "narrow"])
def test_the_split_writes_three_copies_of_scaled_fp16_pieces(gpu, rows, cols, ld, offset, layout, lo_piece,
                                                             spread):
    """cf_split_f16x3_copies after cf_f16x3_row_maxima (side by side) or cf_f16x3_maxima (where the
    maxima are its columns') against numpy's fp16 (which rounds as __float2half_rn): each row's or
    column's largest magnitude and their range, the values scaled by a power of two, the pieces hi,
    hi / 2^11 and lo (lo piece 2: A's order) or hi, lo and hi / 2^11 (lo piece 1: W's) one copy after
    another along K (side by side along the rows, stacked, or side by side in the transposed source's
    rows), to the bit. "wide": rows and columns of values 1e-30 and 1e30 beside ordinary ones, and an
    infinity and a NaN (left out of the maxima; an infinite largest magnitude scales by 1, its lo pieces
    NaN): each row or column by its own scale. "narrow": ordinary values, all by the largest's scale;
    nothing past the copies written."""
    from f16x3_pieces import f16x3_one_max, f16x3_pieces, f16x3_range, f16x3_scale

    from cellfuse.codegen.gemm_routes import split_threads
    from cellfuse.codegen.kernel_abi import BLOCK, grid_blocks

    drv = gpu[0]
    rng = np.random.default_rng(rows + cols)
    src = rng.standard_normal(offset + rows * ld).astype(np.float32)
    x = src[offset:].reshape(rows, ld)[:, :cols]
    if spread == "wide":
        x[1] *= np.float32(1e-30)
        x[2] *= np.float32(1e30)
        x[:, 1] *= np.float32(2.0**-20)
        x[rows - 1, cols - 1] = np.inf
        x[rows - 2, cols - 2] = np.nan
    per_column = layout != 0
    m = np.nanmax(np.abs(x), 0 if per_column else 1)
    one = f16x3_one_max(m)
    assert (one is None) == (spread == "wide")
    kernels = _split_kernels(drv)
    src_d = drv.to_device(src)
    n = 3 * rows * cols
    out_d = drv.to_device(np.full(n + 64, 7.0, np.float16))
    m_d, range_d = _measured(drv, kernels, int(src_d) + 4 * offset, rows, cols, ld, per_column)
    kernels[2].prepared_call((grid_blocks(int(split_threads(rows, cols, layout))), 1), (BLOCK, 1, 1), out_d,
                             int(src_d) + 4 * offset, m_d, range_d, 0, 0, rows, cols, ld, layout, lo_piece)
    np.testing.assert_array_equal(drv.from_device(m_d, m.shape, np.float32), m)
    np.testing.assert_array_equal(drv.from_device(range_d, (4,), np.uint32)[:2], f16x3_range(m))
    got = drv.from_device(out_d, (n + 64,), np.float16)
    np.testing.assert_array_equal(got[n:], np.float16(7.0))
    copies = (got[:n].reshape(rows, 3, cols).transpose(1, 0, 2), got[:n].reshape(3, rows, cols),
              got[:n].reshape(cols, 3, rows).transpose(1, 2, 0))[layout]
    scale = f16x3_scale(m if one is None else np.full_like(m, one))
    wants = f16x3_pieces(x * (scale[None, :] if per_column else scale[:, None]), lo_piece)
    for got_piece, want in zip(copies, wants, strict=True):
        np.testing.assert_array_equal(got_piece, want)  # (NaN where NaN: their bits may differ)
        finite = np.isfinite(want)
        np.testing.assert_array_equal(got_piece[finite].view(np.uint16), want[finite].view(np.uint16))


@pytest.mark.parametrize("a_size, w_size, by_alpha", [
    (1.0, 0.05, True),  # the usual: both one scale, 2^-(ea + ew) a normal float
    (1e-30, 1e-30, False),  # both one scale, but 2^-(ea + ew) below float32's normal range
    ("wide", 0.05, False),  # A's rows 2^30 apart: a scale each
])
def test_as_split_writes_the_gemms_alpha(gpu, a_size, w_size, by_alpha):
    """A's split, given W's range and where the GEMM's scalars go, writes alpha 2^-(A's exponent + W's)
    where both operands have one scale and that is a normal float, else 1, and beta 0."""
    from f16x3_pieces import f16x3_scale

    from cellfuse.codegen.gemm_routes import SIDE_BY_SIDE, split_threads
    from cellfuse.codegen.kernel_abi import BLOCK, grid_blocks

    drv = gpu[0]
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 32)).astype(np.float32)
    if a_size == "wide":
        a[1] *= np.float32(2.0**-30)
    else:
        a *= np.float32(a_size)
    w = (rng.standard_normal((32, 48)) * w_size).astype(np.float32)
    kernels = _split_kernels(drv)
    a_d, w_d = drv.to_device(a), drv.to_device(w)
    _, w_range = _measured(drv, kernels, int(w_d), 32, 48, 48, per_column=True)
    am, a_range = _measured(drv, kernels, int(a_d), 64, 32, 32, per_column=False)
    out_d = drv.mem_alloc(2 * 3 * a.size)
    scalars = drv.to_device(np.array([7.0, 7.0], np.float32))
    kernels[2].prepared_call((grid_blocks(int(split_threads(64, 32, SIDE_BY_SIDE))), 1), (BLOCK, 1, 1), out_d,
                             a_d, am, a_range, w_range, scalars, 64, 32, 32, SIDE_BY_SIDE, 2)
    alpha, beta = drv.from_device(scalars, (2,), np.float32)
    assert beta == 0.0
    if by_alpha:
        assert alpha == 1.0 / (f16x3_scale(np.abs(a).max()) * f16x3_scale(np.abs(w).max()))
        assert alpha < 1.0
    else:
        assert alpha == 1.0


@pytest.mark.parametrize("rows, n, ldc, accumulate, bias, offset", [
    (64, 512, 512, False, True, 0),  # whole 16-byte groups, C itself the sums
    (37, 5, 7, True, False, 0),  # rows of 5 in rows of 7: one value at a time; onto C
    (9, 12, 12, True, True, 1),  # C not on 16 bytes
    (64, 512, 512, False, False, 0),  # nothing to add: with one scale each, nothing to do
])
@pytest.mark.parametrize("spread", ["wide A", "wide W", "narrow"])
def test_the_pass_undoes_both_scales_adds_the_bias_and_accumulates(gpu, rows, n, ldc, accumulate, bias,
                                                                    offset, spread):
    """cf_f16x3_unscale_sums: C = D * 2^-(A's row exponent + W's column exponent) (+ bias) (+ C), both
    exponents at once, so that rows of A near 1e34 times W's columns near 1e-2 give their finite products
    (undone one at a time, the first would overflow); an operand whose maxima lie within 2^20 of each
    other was split by one scale, its largest's (gemm_splits.cuh); where both were, the GEMM's alpha
    undid them and D holds the products ("narrow"): only the bias and C are added, and with neither C
    is left as the GEMM wrote it. D in the workspace (row length n) where the GEMM accumulates, else C
    itself."""
    from f16x3_pieces import f16x3_one_max, f16x3_range

    from cellfuse.codegen.cuda_kernels import PRELUDE
    from cellfuse.codegen.gemm_routes import UNSCALE_ROWS, unscale_threads
    from cellfuse.codegen.kernel_abi import BLOCK, grid_blocks
    from cellfuse.gpu_runtime.cuda_executor import _compile

    drv = gpu[0]
    rng = np.random.default_rng(rows + n)
    wide_a, wide_w = spread == "wide A", spread == "wide W"
    ma = (rng.uniform(0.5, 2.0, rows) * 10.0 ** rng.integers(*((-30, 34) if wide_a else (-2, 2)), rows)
          ).astype(np.float32)
    ma[0], ma[1] = 0.0, np.float32(3e34 if wide_a else 3.0)
    mw = (rng.uniform(0.5, 2.0, n) * 10.0 ** rng.integers(*((-9, 3) if wide_w else (-3, 0)), n)
          ).astype(np.float32)
    mw[0], mw[-1] = np.float32(0.03), np.float32(1e-9 if wide_w else 0.5)
    one_a, one_w = f16x3_one_max(ma), f16x3_one_max(mw)
    assert (one_a is None, one_w is None) == (wide_a, wide_w)

    def exponent(m):  # cf_f16x3_exponent: the scale 2^(14 - e) for m in [2^e, 2^(e + 1)), 0 for m = 0
        return np.where(m > 0, np.minimum(15 - np.frexp(m)[1], 126), 0)

    ea = exponent(ma if one_a is None else np.full_like(ma, one_a))
    ew = exponent(mw if one_w is None else np.full_like(mw, one_w))
    by_alpha = not (wide_a or wide_w)
    want = rng.standard_normal((rows, n)) * np.abs(ma)[:, None].clip(1e-30) * np.abs(mw)[None, :]
    want = want.astype(np.float32)  # the true products, float32
    scaled = np.ldexp(want.astype(np.float64), ea[:, None] + ew[None, :]).astype(np.float32)
    sums = want if by_alpha else scaled
    b = rng.standard_normal(n).astype(np.float32)
    old = rng.standard_normal((rows, ldc)).astype(np.float32)
    module = drv.module_from_buffer(_compile(PRELUDE))
    unscale = module.get_function("cf_f16x3_unscale_sums").prepare("PPPPPPPiiiii")
    c_d = drv.to_device(np.concatenate([np.zeros(offset, np.float32), old.ravel(),
                                        np.full(16, 7.0, np.float32)]))
    c_at = int(c_d) + 4 * offset
    if accumulate:
        d_d = drv.to_device(sums)
        d_at, ldd = int(d_d), n
    else:
        drv.memcpy_htod(c_at, np.ascontiguousarray(
            np.concatenate([sums, old[:, n:]], 1) if ldc > n else sums))
        d_at, ldd = c_at, ldc
    ranges = [np.concatenate([f16x3_range(m), np.zeros(2, np.uint32)]) for m in (ma, mw)]
    ma_d, a_range, mw_d, w_range, b_d = (drv.to_device(v) for v in (ma, ranges[0], mw, ranges[1], b))
    # (a thread per 4 columns of every 8th row: each strides over rows, as after a forward GEMM)
    threads = unscale_threads(rows, n, UNSCALE_ROWS)
    unscale.prepared_call((grid_blocks(int(threads)), 1), (BLOCK, 1, 1), c_at, d_at, ma_d, a_range, mw_d,
                          w_range, int(b_d) if bias else 0, rows, n, ldc, ldd, int(accumulate))
    got = drv.from_device(c_d, (offset + rows * ldc + 16,), np.float32)
    np.testing.assert_array_equal(got[offset + rows * ldc:], 7.0)  # nothing past C written
    got = got[offset:offset + rows * ldc].reshape(rows, ldc)
    expect = want + (b if bias else 0) + (old[:, :n] if accumulate else 0)
    assert np.all(np.isfinite(got[:, :n]))
    np.testing.assert_allclose(got[:, :n], expect, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(got[:, n:], old[:, n:])  # past each row's n: as it was


def test_exported_program_runs_its_large_gemms_on_tensor_cores(gpu, tmp_path):
    """The exported launcher decides at run time by the same rule: at seq 16, batch 80 the LSTM's input
    GEMM (and, in its backward pass, the weights' and x's gradients) run on tensor cores; the forward
    output matches the reference and the demo's finite differences agree with the backward pass."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed")
    cell, seq, batch = load_template("lstm"), 16, 80
    src = generate_cuda(cell, Sizes(seq, batch, 512, 512, 1), "persistent", backward=True)
    assert "cublasGemmEx" in src.text
    cu, exe = tmp_path / "lstm.cu", tmp_path / "lstm"
    cu.write_text(src.text)
    build = subprocess.run(["nvcc", "-O3", "-arch=sm_90", "-DCELLFUSE_DEMO_MAIN", str(cu), "-lcublas",
                            "-o", str(exe)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    params = init_params(cell, 1, 512, 512, 4)
    x = np.random.default_rng(4).standard_normal((seq, batch, 512)).astype(np.float32)
    keys = list(expected_params(cell, 1, 512, 512))
    np.concatenate([params[k].reshape(-1) for k in keys]).astype(np.float32).tofile(tmp_path / "d.params.f32")
    x.tofile(tmp_path / "d.x.f32")
    proc = subprocess.run([str(exe), str(seq), str(batch), str(tmp_path / "d")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("central difference") == 3, proc.stdout
    y = np.fromfile(tmp_path / "d.y.f32", np.float32).reshape(seq, batch, 512)
    assert rel(y, run_reference(cell, params, {"x": x}).y) < 1e-4


@pytest.mark.parametrize("schedule", ["persistent", "wavefront", "tensor"])
@pytest.mark.parametrize("seed", range(24))
def test_persistent_random_cells_match_reference_on_gpu(gpu, seed, schedule):
    """Seeded random cells (their ops, shapes and state wiring drawn from the op table), with 1 and 3
    layers and initial states, under the persistent schedule (2 and 3 under the wavefront); blocks of
    several columns at these sizes."""
    from random_cells import random_cell

    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    cell = random_cell(seed)
    layers = 2 + seed % 2 if schedule == "wavefront" else 1 + 2 * (seed % 2)
    rng = np.random.default_rng(seed)
    params = init_params(cell, layers, INPUT, HIDDEN, seed)
    x = rng.uniform(-1, 1, (SEQ, BATCH, INPUT)).astype(np.float32)
    initial = {s: rng.uniform(-1, 1, (layers, BATCH, HIDDEN)).astype(np.float32) for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, layers)
    plan = make_plan(cell, Sizes(SEQ, BATCH, INPUT, HIDDEN, layers), schedule, device_target())
    ex = CudaExecutor(plan, params)
    out = ex.run(x, initial)
    ex.close()
    assert relative_error(out, ref, floor=1.0) < 1e-4


@pytest.mark.parametrize("seed", range(12))
def test_persistent_random_cells_at_a_batch_of_one_match_reference_on_gpu(gpu, seed):
    """Seeded random cells at B=1, 1 and 3 layers, with initial states: their recurrent GEMMs one row at a
    time, in registers (K of 40, less than two k per thread)."""
    from random_cells import random_cell

    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    cell = random_cell(seed)
    layers = 1 + 2 * (seed % 2)
    rng = np.random.default_rng(seed)
    params = init_params(cell, layers, INPUT, HIDDEN, seed)
    x = rng.uniform(-1, 1, (SEQ, 1, INPUT)).astype(np.float32)
    initial = {s: rng.uniform(-1, 1, (layers, 1, HIDDEN)).astype(np.float32) for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, layers)
    ex = CudaExecutor(make_plan(cell, Sizes(SEQ, 1, INPUT, HIDDEN, layers), "persistent", device_target()),
                      params)
    out = ex.run(x, initial)
    ex.close()
    assert relative_error(out, ref, floor=1.0) < 1e-4


@pytest.mark.parametrize("schedule", ["fused", "persistent", "tensor"])
def test_random_cells_with_variances_from_deviation_sums_match_reference_on_gpu(gpu, schedule):
    """At 256 columns, one a thread, the layer norms of seeded random cells take their variances from
    deviation sums (`cf_lanes_deviations`), in the kernels before the loop and in the step's: six such
    cells, x of a mean far from 0 beside its spread in every other one. Against the reference."""
    from random_cells import random_cell

    from cellfuse.codegen import plan_kernels
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    checked = 0
    for seed in range(100):
        cell = random_cell(seed + 300, reductions=True)
        plan = make_plan(cell, Sizes(SEQ, BATCH, 256, 256, 1), schedule, device_target())
        if "cf_lanes_deviations(ds_" not in plan_kernels(plan).module_source():
            continue  # no variance in it, or one taken in a pass of its own
        rng = np.random.default_rng(seed)
        params = init_params(cell, 1, 256, 256, seed)
        x = (rng.uniform(-1, 1, (SEQ, BATCH, 256)) + 8.0 * (checked % 2)).astype(np.float32)
        initial = {s: rng.uniform(-1, 1, (1, BATCH, 256)).astype(np.float32) for s in cell.updates}
        ref = run_reference(cell, params, {"x": x, **initial}, 1)
        ex = CudaExecutor(plan, params)
        out = ex.run(x, initial)
        ex.close()
        assert relative_error(out, ref, floor=1.0) < 1e-4, seed
        checked += 1
        if checked == 6:
            break
    assert checked == 6


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("hidden", [40, 512, 1500])
def test_layer_norm_kernels_match_reference_on_gpu(gpu, schedule, hidden):
    """The kernels that reduce rows at a row narrower than a block, of two columns per thread, and of
    six: the layer-normalised LSTM and the sLSTM, two layers, against the reference."""
    for name in ("layernorm_lstm", "slstm"):
        cell = load_template(name)
        rng = np.random.default_rng(hidden)
        params = init_params(cell, 2, INPUT, hidden, 1)
        inputs = {"x": rng.standard_normal((SEQ, BATCH, INPUT)).astype(np.float32)}
        ref = run_reference(cell, params, inputs)
        out = run_schedule(cell, params, inputs, None, schedule, "cuda")
        assert rel(out.y, ref.y) < 1e-4, name
        for s in ref.final:
            assert rel(out.final[s], ref.final[s]) < 1e-4, (name, s)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("schedule", ["fused", "graph", "wavefront", "persistent", "tensor"])
@pytest.mark.parametrize("name", template_names())
def test_a_16_bit_schedule_is_within_its_bound_on_gpu(gpu, name, schedule, precision):
    """x, weights, outputs and states in 16 bits, GEMMs through cublasGemmEx (the tensor rung's in its
    kernels): within the bound of the float64 reference that the numpy executor's emulation meets
    (codegen.precision), and not float32's result. From zero initial states, as the bound is stated: the
    sLSTM's normalizer n drawn near zero would amplify any rounding by its conditioning (emulated, 0.07
    from random states)."""
    from cellfuse.codegen.precision import forward_tolerance

    cell = load_template(name)
    params, inputs = data(cell)
    inputs = {"x": inputs["x"]}
    ref = run_reference(cell, params, inputs)
    out = run_schedule(cell, params, inputs, None, schedule, "cuda", precision=precision)
    error = relative_error(out, ref)
    assert error < forward_tolerance(precision), f"{error:.2e}"
    fp32 = run_schedule(cell, params, inputs, None, schedule, "cuda")
    assert relative_error(out, fp32) > 1e-5
