"""The warpgroup GEMM on an sm_90 GPU (H100, H200): against float64 sums, at the edges of its tiles, and
each route of a GEMM on tensor cores in the executor against the reference."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.codegen import make_plan
from cellfuse.codegen.plan_text import tensor_core_groups
from cellfuse.graph_model import Sizes, init_params, load_template, run_reference

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def sm90(gpu):
    drv = gpu[0]
    if drv.Context.get_device().compute_capability() != (9, 0):
        pytest.skip("the warpgroup GEMM needs an sm_90 GPU (H100, H200)")
    return drv


@pytest.mark.parametrize("m, n, k, lda, ldc, trans_w, accumulate, bias", [
    (6400, 512, 512, 512, 512, False, False, False),  # IndRNN's input GEMM at B=64
    (6400, 2048, 512, 512, 2048, False, False, True),  # the LSTM's at B=64, its bias in the epilogue
    (200, 256, 96, 100, 260, True, True, True),  # a last block of 72 rows, padded x and C, W as [n, k]
    (5, 768, 32, 32, 768, False, True, False),  # fewer rows than a warp's, one stage of K
    (300, 512, 160, 160, 512, False, False, False),  # an odd number of stages (5): the second half unused
])
def test_the_warpgroup_gemm_matches_float64_sums(sm90, m, n, k, lda, ldc, trans_w, accumulate, bias):
    """C (+)= x @ W (+ bias) to float32's accuracy (3xTF32), with values over many magnitudes; nothing
    written past C's m rows and n columns."""
    from cellfuse.gpu_runtime.cuda_executor import warpgroup_gemms
    from cellfuse.gpu_runtime.wgmma_gemms import Operands, usable

    drv = sm90
    rng = np.random.default_rng(m + n + k)
    x = (rng.standard_normal((m, lda)) * 2.0 ** rng.integers(-8, 8, (m, lda))).astype(np.float32)
    w = (rng.standard_normal((n, k) if trans_w else (k, n)) / np.sqrt(k)).astype(np.float32)
    c0 = rng.standard_normal((m + 3, ldc)).astype(np.float32)
    want = (x[:, :k].astype(np.float64) @ (w.T if trans_w else w).astype(np.float64))
    if accumulate:
        want += c0[:m, :n]
    b = rng.standard_normal(n).astype(np.float32)
    if bias:
        want += b
    x_d, w_d, c_d, b_d = drv.to_device(x), drv.to_device(w), drv.to_device(c0), drv.to_device(b)
    pieces = drv.mem_alloc(4 * 2 * n * k)
    op = Operands(int(c_d), int(x_d), int(w_d), int(pieces), m, n, k, lda, k if trans_w else n, ldc, trans_w,
                  accumulate, int(b_d) if bias else 0)
    assert usable((9, 0), op)
    stream = drv.Stream()
    for call in warpgroup_gemms().calls(op, stream):
        call()
    stream.synchronize()
    got = drv.from_device(c_d, c0.shape, np.float32)
    assert np.max(np.abs(got[:m, :n] - want)) <= 1e-5 * np.max(np.abs(want))
    np.testing.assert_array_equal(got[m:], c0[m:])
    np.testing.assert_array_equal(got[:, n:], c0[:, n:])


@pytest.mark.parametrize("route", ["copies", "wgmma"])
@pytest.mark.parametrize("name, schedule, batch", [
    ("indrnn", "persistent", 64), ("lstm", "persistent", 80), ("gru", "graph", 160),
])
def test_either_route_matches_the_reference(sm90, monkeypatch, route, name, schedule, batch):
    """Whichever route the measurement picks, the forward pass matches: each forced in turn, for a GEMM
    with the bias rows before it (the LSTM's, accumulating) and one without (IndRNN's)."""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    monkeypatch.setattr(CudaExecutor, "_route", lambda self, g, op, s, handles, kept: route)
    cell = load_template(name)
    seq = 100 if name == "indrnn" else 16
    rng = np.random.default_rng(5)
    params = init_params(cell, 1, 512, 512, 5)
    x = rng.standard_normal((seq, batch, 512)).astype(np.float32)
    initial = {s: (0.5 * rng.standard_normal((1, batch, 512))).astype(np.float32) for s in cell.updates}
    ref = run_reference(cell, params, {"x": x, **initial}, 1)
    plan = make_plan(cell, Sizes(seq, batch, 512, 512), schedule, device_target())
    assert tensor_core_groups(plan)
    ex = CudaExecutor(plan, params)
    out = ex.run(x, initial)
    ex.close()
    rel = float(np.max(np.abs(out.y - ref.y)) / np.max(np.abs(ref.y)))
    assert rel < 1e-4


@pytest.mark.parametrize("schedule", ["tensor", "persistent"])
def test_rows_of_their_own_lengths_match_the_reference_on_the_warpgroup_gemm(sm90, monkeypatch, schedule):
    """A two-layer LSTM whose rows have lengths of their own (uniform in 4..24, longest first, as a
    PackedSequence's), each layer's input GEMM on the warpgroup GEMM skipping the ended rows: outputs
    and final states match the reference."""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target
    from cellfuse.graph_model.lengths import STEPS_LEFT, masked

    monkeypatch.setattr(CudaExecutor, "_route", lambda self, g, op, s, handles, kept: "wgmma")
    cell = masked(load_template("lstm"))
    T, B, H = 24, 64, 512
    rng = np.random.default_rng(9)
    lengths = np.sort(rng.integers(4, T + 1, B))[::-1]
    params = init_params(cell, 2, H, H, 9)
    x = rng.standard_normal((T, B, H)).astype(np.float32)
    x[np.arange(T)[:, None] >= lengths[None, :]] = 0.0  # (a PackedSequence's padding)
    initial = {s: (0.5 * rng.standard_normal((2, B, H))).astype(np.float32) for s in ("h", "c")}
    initial[STEPS_LEFT] = np.broadcast_to(lengths[None, :, None], (2, B, H)).astype(np.float32)
    ref = run_reference(cell, params, {"x": x, **initial}, 2)
    plan = make_plan(cell, Sizes(T, B, H, H, 2), schedule, device_target())
    assert tensor_core_groups(plan)
    ex = CudaExecutor(plan, params)
    out = ex.run(x, initial)
    ex.close()
    assert float(np.max(np.abs(out.y - ref.y)) / np.max(np.abs(ref.y))) < 1e-4
    for s in ("h", "c"):
        assert float(np.max(np.abs(out.final[s] - ref.final[s])) / np.max(np.abs(ref.final[s]))) < 1e-4


@pytest.mark.parametrize("route, made", [("wgmma", 1), ("copies", 3)])
def test_new_weights_reach_the_kept_image_once_the_executor_is_told(sm90, monkeypatch, route, made):
    """The forward pass reads what it makes of W (the warpgroup GEMM's image, or W's copies and column
    maxima: a zeroing, the maxima, the copies) made when the weights were written, not by every run:
    weights written into the executor's buffers (as cellfuse.nn writes them) and `weights_changed`
    called, the next run (its CUDA graph replayed) matches the reference with the new weights; those
    calls are not among the forward pass's own."""
    from cellfuse.gpu_runtime.cuda_executor import CudaExecutor, device_target

    monkeypatch.setattr(CudaExecutor, "_route", lambda self, g, op, s, handles, kept: route)
    cell = load_template("indrnn")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((100, 64, 512)).astype(np.float32)
    initial = {"h": (0.5 * rng.standard_normal((1, 64, 512))).astype(np.float32)}
    plan = make_plan(cell, Sizes(100, 64, 512, 512), "persistent", device_target())
    ex = CudaExecutor(plan, init_params(cell, 1, 512, 512, 7))
    try:
        ((key, calls),) = ex.image_calls.items()
        assert key[1] == route and len(calls) == made and not set(calls) & set(ex.calls)
        ex.run(x, initial)
        params = init_params(cell, 1, 512, 512, 8)
        for name, arr in plan.weight_arrays(params, np.float32).items():
            ex.drv.memcpy_htod(ex.addr[name], np.ascontiguousarray(arr))
        ex.drv.Context.synchronize()  # (a copy from pageable memory may return before it lands)
        ex.weights_changed()
        out = ex.run(x, initial)
    finally:
        ex.close()
    ref = run_reference(cell, params, {"x": x, **initial}, 1)
    assert float(np.max(np.abs(out.y - ref.y)) / np.max(np.abs(ref.y))) < 1e-4


def test_without_the_warpgroup_gemm_the_copies_run(sm90, monkeypatch, caplog):
    """Where nvcc cannot build the warpgroup GEMM for sm_90a, the log says so once and the copies and
    cuBLAS run the GEMM: the forward pass still matches."""
    import cellfuse.gpu_runtime.cuda_executor as cuda_executor
    from cellfuse.graph_model import CellError

    real = cuda_executor._compile

    def no_sm90a(source, arch=None):
        if arch == "sm_90a":
            raise CellError("nvcc could not compile the generated kernels: no sm_90a here")
        return real(source, arch)

    monkeypatch.setattr(cuda_executor, "_compile", no_sm90a)
    cuda_executor.warpgroup_gemms.cache_clear()
    try:
        cell = load_template("indrnn")
        rng = np.random.default_rng(6)
        params = init_params(cell, 1, 512, 512, 6)
        x = rng.standard_normal((100, 64, 512)).astype(np.float32)
        initial = {"h": (0.5 * rng.standard_normal((1, 64, 512))).astype(np.float32)}
        ref = run_reference(cell, params, {"x": x, **initial}, 1)
        plan = make_plan(cell, Sizes(100, 64, 512, 512), "persistent", cuda_executor.device_target())
        ex = cuda_executor.CudaExecutor(plan, params)
        out = ex.run(x, initial)
        ex.close()
        assert cuda_executor.warpgroup_gemms() is None
        assert "does not build here" in caplog.text
        assert float(np.max(np.abs(out.y - ref.y)) / np.max(np.abs(ref.y))) < 1e-4
    finally:
        cuda_executor.warpgroup_gemms.cache_clear()


@pytest.mark.parametrize("steps, batch, first_step, order", [
    (100, 64, 0, "longest first"),  # a PackedSequence's LSTM at B=64: lengths uniform in 10..100
    (13, 32, 40, "any"),  # a GEMM of a range of steps (a wavefront's), steps not a multiple of 8
])
def test_rows_past_their_lengths_read_as_zeros(sm90, steps, batch, first_step, order):
    """Where the rows are steps of a batch whose rows have lengths, a row past its length gives what a
    row of zeros gives, the other rows what they give without lengths: x holds NaN past each row's
    length, so that a block that multiplied an ended row would write NaN. The blocks whose 16 rows have
    all ended are skipped: with the rows longest first, about a third of them."""
    from cellfuse.codegen.cuda_wgmma import BLOCK_BATCH_ROWS, BLOCK_STEPS
    from cellfuse.gpu_runtime.cuda_executor import warpgroup_gemms
    from cellfuse.gpu_runtime.wgmma_gemms import Operands, usable

    drv = sm90
    n, k, width = 512, 256, 8
    rng = np.random.default_rng(steps + batch)
    lengths = rng.integers(10, first_step + steps + 1, batch)
    if order == "longest first":
        lengths = np.sort(lengths)[::-1]
    m = steps * batch
    x = rng.standard_normal((steps, batch, k)).astype(np.float32)
    live = first_step + np.arange(steps)[:, None] < lengths[None, :]  # [steps, batch]
    x[~live] = np.nan
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    c0 = rng.standard_normal((m, n)).astype(np.float32)
    want = np.where(live.reshape(m, 1), np.nan_to_num(x.reshape(m, k), nan=0.0).astype(np.float64) @ w, 0.0)
    want += c0 + b
    left = np.repeat(lengths.astype(np.float32)[:, None], width, axis=1)  # the steps-left state's layout
    x_d, w_d, c_d, b_d, l_d = (drv.to_device(a) for a in (x, w, c0, b, left))
    pieces = drv.mem_alloc(4 * 2 * n * k)
    op = Operands(int(c_d), int(x_d), int(w_d), int(pieces), m, n, k, k, n, n, False, True, int(b_d),
                  int(l_d), width, batch, first_step)
    assert usable((9, 0), op)
    stream = drv.Stream()
    for call in warpgroup_gemms().calls(op, stream):
        call()
    stream.synchronize()
    got = drv.from_device(c_d, c0.shape, np.float32)
    # a block of BLOCK_STEPS steps of BLOCK_BATCH_ROWS rows: skipped where all its rows ended before it
    blocks = -(-steps // BLOCK_STEPS)
    groups = lengths.reshape(-1, BLOCK_BATCH_ROWS).max(axis=1)
    skipped = groups[None, :] <= first_step + BLOCK_STEPS * np.arange(blocks)[:, None]
    if order == "longest first":
        assert 0.25 < skipped.mean() < 0.45
    rows_skipped = np.repeat(np.repeat(skipped, BLOCK_STEPS, axis=0)[:steps], BLOCK_BATCH_ROWS, axis=1)
    assert not np.isnan(got[live.reshape(m)]).any()
    assert np.max(np.abs(got[live.reshape(m)] - want[live.reshape(m)])) <= 1e-5 * np.max(np.abs(want))
    ended = rows_skipped.reshape(m)
    np.testing.assert_array_equal(got[ended], (c0 + b)[ended])
    assert np.isnan(got[~live.reshape(m) & ~ended]).all(axis=1).all()  # (ended rows of running blocks)
