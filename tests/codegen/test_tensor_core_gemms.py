"""Which GEMMs run on tensor cores with float32's accuracy (three fp16 products), as the plan, the executor
and the exported launcher decide it, and the arithmetic of their splits. The GPU tests check the results;
these, the decisions."""

from __future__ import annotations

from dataclasses import replace

import pytest
from f16x3_pieces import f16x3_pieces, f16x3_scale

from cellfuse.codegen import generate_cuda, make_plan
from cellfuse.codegen.gemm_routes import (
    F16X3_MAX_K,
    F16X3_MIN_MACS,
    RANGE_WORDS,
    Ref,
    f16x3_layout,
    f16x3_steps,
    on_tensor_cores,
)
from cellfuse.codegen.lowering import lower
from cellfuse.codegen.plan_text import describe, summary, tensor_core_groups
from cellfuse.codegen.tiling import MMA_K_BLOCK, mma_stride
from cellfuse.gpu_runtime.cuda_executor import split_bytes
from cellfuse.graph_model import Sizes, load_template


def test_the_rule_is_the_size_of_the_gemm_and_a_k_short_enough_for_float32s_accuracy():
    assert on_tensor_cores(1024, 2048, 512) and F16X3_MIN_MACS == 1024 * 2048 * 512
    assert not on_tensor_cores(1023, 2048, 512)
    assert not on_tensor_cores(1, 2**20, 2**30)  # a column sum
    assert not on_tensor_cores(2**24, 2**20, 32)
    # a weight's gradient sums over K = T x B rows: on tensor cores up to F16X3_MAX_K of them
    assert on_tensor_cores(512, 2048, 100 * 64) and F16X3_MAX_K == 8192
    assert on_tensor_cores(512, 2048, F16X3_MAX_K) and not on_tensor_cores(512, 2048, F16X3_MAX_K + 1)
    assert not on_tensor_cores(512, 2048, 1000 * 64)


def test_a_long_sequences_weight_gradients_run_in_float32():
    """At T=1000, B=64 the LSTM's weights' gradients (K = 64,000) run through cuBLAS's float32 GEMM, as
    on tensor cores (3xTF32) they were 1.8e-4 from float64 on an H200; at T=100 (K = 6,400) on tensor
    cores still."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.lowering import Gemm, Loop

    def gradient_routes(seq):
        plan = make_plan(load_template("lstm"), Sizes(seq, 64, 512, 512), "tensor", save_steps=True)
        flat = [i for instr in backward_plan(plan).instructions()
                for i in (instr.body if isinstance(instr, Loop) else (instr,))]
        return {i.route for i in flat if isinstance(i, Gemm) and i.launch.row_kind in ("input", "hidden")}

    assert gradient_routes(100) == {"f16x3"} and gradient_routes(1000) == {"float32"}


def test_hoisted_gemms_of_large_runs_go_to_tensor_cores():
    lstm = load_template("lstm")

    def groups(schedule, batch):
        return tensor_core_groups(make_plan(lstm, Sizes(100, batch, 512, 512), schedule))

    assert groups("persistent", 64) == groups("persistent", 11) != []  # 1100 rows: 1.1 x 2^30
    assert groups("persistent", 10) == []  # 1000 rows
    assert groups("graph", 64) == []  # in chunks of 10 steps beside the loop: 640 rows
    assert groups("graph", 128) != []


def test_each_gemm_instruction_carries_its_route():
    """The lowering decides each GEMM's route once, from the rows it computes: the LSTM's input GEMM of
    6400 rows on tensor cores, where the warpgroup GEMM takes its shape too; in chunks of 640 rows, and
    its recurrent GEMM of 64 rows a step, in float32; a weight's gradient (x^T read transposed) through
    the split copies only."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.lowering import Gemm, Loop

    def routes(instructions):
        flat = [i for instr in instructions for i in (instr.body if isinstance(instr, Loop) else (instr,))]
        return {(i.launch.group, i.launch.trans_a): (i.rows, i.route) for i in flat if isinstance(i, Gemm)}

    lstm = load_template("lstm")
    assert routes(lower(make_plan(lstm, Sizes(100, 64, 512, 512), "persistent")).instructions) == {
        ("gemm0", False): (6400, "f16x3-or-wgmma")}
    assert routes(lower(make_plan(lstm, Sizes(100, 64, 512, 512), "hoisted")).instructions) == {
        ("gemm0", False): (640, "float32"), ("gemm1", False): (64, "float32")}
    back = backward_plan(make_plan(lstm, Sizes(100, 64, 512, 512), "hoisted", save_steps=True))
    assert "f16x3" in {route for (_, trans_a), (_, route) in routes(back.instructions()).items() if trans_a}


def test_the_plan_says_which_groups_run_on_tensor_cores():
    plan = make_plan(load_template("gru"), Sizes(100, 64, 512, 512), "persistent")
    groups_said = summary(plan)["gemm_groups"]
    assert [g["tensor_cores"] for g in groups_said] == [g["hoisted"] for g in groups_said]
    said = "on tensor cores (3xFP16, rows and columns scaled), or 3xTF32 in the warpgroup GEMM"
    assert sum(line.count(said) for line in describe(plan).splitlines()
               if "hoisted" in line) == 1


def test_each_stream_has_room_for_its_largest_split():
    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512, 2), "wavefront")
    program = lower(plan)
    need = split_bytes(program.instructions, program.streams)
    # the hoisted GEMMs of 10 steps: 640 rows, too small; the recurrent ones of 64 rows too
    assert need == [0] * program.streams
    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "persistent")
    program = lower(plan)
    # fp16 copies of A and W, A's row maxima and W's column maxima each followed by their range of 4
    # words, the GEMM's alpha and beta (no sums: the input GEMM does not accumulate), each part from a
    # multiple of 256 bytes
    def aligned(n):
        return -(-n // 256) * 256
    assert split_bytes(program.instructions, program.streams)[0] == (
        2 * 3 * (6400 * 512 + 512 * 2048) + aligned(4 * (6400 + 4)) + 256 + aligned(4 * (2048 + 4)))


def test_a_gemm_that_accumulates_sums_into_its_workspace_first():
    """Where a GEMM adds onto C (a backward pass's gradients), cuBLAS writes its sums into the workspace,
    after A's copies, maxima (their range after them) and the GEMM's alpha and beta, and before W's region
    (W's copies, maxima and range, which an executor may keep elsewhere), and the pass adds them to C; each
    part starts on 256 bytes."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.lowering import Gemm, Loop

    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "tensor", save_steps=True)
    gemms = [i for instr in backward_plan(plan).instructions()
             for i in (instr.body if isinstance(instr, Loop) else (instr,))
             if isinstance(i, Gemm) and i.route.startswith("f16x3")]
    assert gemms and all(g.launch.accumulate for g in gemms)
    for gemm in gemms:
        g = gemm.launch
        lay = f16x3_layout(g, gemm.rows, g.k)
        parts = [lay.a.pieces, lay.a.maxima, lay.scalars, lay.sums, lay.kept_at, lay.kept_at + lay.w.maxima]
        assert [int(p) % 256 for p in parts] == [0] * 6 and sorted(map(int, parts)) == list(map(int, parts))
        assert int(lay.a.range) == int(lay.a.maxima) + 4 * gemm.rows
        assert int(lay.scalars) >= int(lay.a.range) + 4 * RANGE_WORDS
        assert int(lay.sums) >= int(lay.scalars) + 8
        assert int(lay.kept_at) >= int(lay.sums) + 4 * gemm.rows * g.n
        assert int(lay.w.range) == int(lay.w.maxima) + 4 * g.n
        assert int(lay.w.pieces) == 0 and int(lay.kept_bytes) >= int(lay.w.range) + 4 * RANGE_WORDS
        assert int(lay.nbytes) == int(lay.kept_at + lay.kept_bytes)
        # a weight's gradient reads x^T: A's copies transposed, its maxima per column of x (A's rows)
        assert (lay.a.per_column, int(lay.a.scales)) == (g.trans_a, gemm.rows)
        # its pass has work for certain (C to add onto): a thread per 4 columns of every row of C
        assert int(f16x3_steps(g, gemm.rows, g.k)[-1].threads) == gemm.rows * -(-g.n // 4)


@pytest.mark.parametrize("schedule, batch, layers, folded", [
    ("tensor", 8, 1, True),  # 800 rows: cuBLAS's float32 GEMM, which adds the bias by beta = 1
    ("tensor", 64, 1, False),  # 6400 rows on tensor cores
    ("graph", 64, 1, True),  # chunks of 640 rows beside the loop
    ("graph", 256, 1, False),  # chunks of 2560 rows, on tensor cores
    ("tensor", 8, 2, True),
    ("persistent", 64, 2, False),
])
def test_a_bias_folds_into_a_hoisted_gemm_only_where_that_runs_on_cuda_cores(schedule, batch, layers, folded):
    """The GRU's input biases are added by its hoisted GEMM where cuBLAS's float32 GEMM runs it; where it
    runs on tensor cores they are left to the fused kernel that reads its output, so that the pass after
    the GEMM has nothing to do (gemm_splits.cuh), as for the LSTM, whose biases never fold."""
    plan = make_plan(load_template("gru"), Sizes(100, batch, 512, 512, layers), schedule)
    hoisted = next(g for g in plan.groups if g.hoisted)
    assert bool(hoisted.folded) == folded
    routes = {i.route for i in lower(plan).instructions if getattr(i, "launch", None) is not None
              and getattr(i.launch, "group", "") == hoisted.name}
    assert routes and routes <= ({"float32"} if folded else {"f16x3", "f16x3-or-wgmma"})


def test_each_operand_is_measured_before_it_is_split_and_as_splits_write_the_gemms_alpha():
    """The steps of the LSTM's input GEMM: W's region (its column maxima and their range zeroed, found,
    W split), then x's row maxima and their range (the range zeroed first), x's split, which alone is
    given W's range and where the GEMM's alpha and beta go, the GEMM reading them there, and the pass
    given both operands' maxima and ranges."""
    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "persistent")
    gemm = next(i for i in lower(plan).instructions if getattr(i, "route", "").startswith("f16x3"))
    g = gemm.launch
    lay = f16x3_layout(g, gemm.rows, g.k)

    def plain(value):  # (constant expressions as ints)
        return Ref(value.of, int(value.offset), value.ctype) if isinstance(value, Ref) else int(value)

    steps = [replace(s, args=tuple(map(plain, s.args))) for s in f16x3_steps(g, gemm.rows, g.k)]
    assert [(s.kind, s.name, s.of_w) for s in steps] == [
        ("zero", "zeroing the column maxima", True), ("kernel", "cf_f16x3_maxima", True),
        ("kernel", "cf_split_f16x3_copies", True),
        ("zero", "zeroing the row maxima's range", False), ("kernel", "cf_f16x3_row_maxima", False),
        ("kernel", "cf_split_f16x3_copies", False),
        ("gemm", "cuBLAS's fp16 GEMM", False), ("kernel", "cf_f16x3_unscale_sums", False)]
    w_max, a_max = plain(Ref("kept", lay.w.maxima)), plain(Ref("workspace", lay.a.maxima))
    w_range = plain(Ref("kept", lay.w.range, "unsigned"))
    a_range = plain(Ref("workspace", lay.a.range, "unsigned"))
    scalars = plain(Ref("workspace", lay.scalars))
    assert steps[0].args == (w_max, 2048 + RANGE_WORDS)
    assert steps[1].args[:2] == (w_max, w_range)
    assert steps[2].args[3:6] == (w_range, 0, 0)  # W's split: its range, no other's, no scalars
    assert steps[3].args == (a_range, RANGE_WORDS)
    assert steps[4].args[:2] == (a_max, a_range)
    assert steps[5].args[3:6] == (a_range, w_range, scalars)
    assert steps[6].args[-1] == scalars
    assert steps[7].args[2:6] == (a_max, a_range, w_max, w_range)
    # the pass, likely to return at once (no bias, nothing to add onto): a thread per 4 columns of every
    # 8th row, so that its blocks are few
    assert int(steps[7].threads) == 6400 // 8 * 2048 // 4


def test_the_exported_launcher_decides_at_run_time():
    text = generate_cuda(load_template("lstm"), Sizes(100, 64, 512, 512), "persistent", backward=True).text
    assert f">= {F16X3_MIN_MACS}.0" in text and f"k <= {F16X3_MAX_K};" in text
    # the input GEMM, then in the backward pass x's gradient and the two weights' gradients (not the
    # column sums of the bias's gradient, nor the steps' dh = dG @ U^T in the persistent kernel)
    assert text.count("cublasGemmEx(") == 4
    assert "ws += cf_aligned(cf_split_bytes(seq, batch));" in text
    assert text.count("cf_f16x3_unscale_sums<<<") == 4 and "CUDA_R_16F" in text and "FAST_TF32" not in text
    # each GEMM's alpha and beta read from the workspace, the handle's pointer mode put back after it
    assert text.count("cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE);") == 4
    assert text.count("cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST);") == 4


def test_the_splits_rounding_is_tf32s_to_nearest_ties_away():
    """The split's integer rounding (adding half of the dropped bits' unit, then dropping them) is
    rounding the magnitude to 10 bits of mantissa, ties away from zero, as cvt.rna.tf32.f32 rounds; and
    hi + lo, both TF32, holds x to about 2^-21 of it."""
    import numpy as np

    from cellfuse.codegen.cuda_wgmma import SOURCE

    assert "(__float_as_uint(v) + 0x1000u) & 0xffffe000u" in SOURCE

    def tf32(v):
        return ((v.view(np.uint32) + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)

    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_000) * 10.0 ** rng.integers(-30, 30, 100_000)).astype(np.float32)
    ties = np.array([1 + 2**-11, -(1 + 2**-11), 1 + 3 * 2**-11, 2**-140 + 2**-151], np.float32)  # halfway
    for v in (x, ties):
        m, e = np.frexp(v.astype(np.float64))  # |m| in [0.5, 1): 11 significant bits are m * 2^11
        scaled = np.abs(m) * 2.0**11
        want = np.sign(m) * np.floor(scaled + 0.5) * 2.0 ** (e - 11)
        normal = np.abs(v) >= np.finfo(np.float32).tiny
        np.testing.assert_array_equal(tf32(v)[normal].astype(np.float64), want[normal])
    hi = tf32(x)
    lo = tf32((x - hi).astype(np.float32))
    assert np.all(np.abs((hi.astype(np.float64) + lo) - x) <= 2.0**-21 * np.abs(x))


def test_rows_that_tensor_cores_read_start_where_one_load_keeps_them_apart_in_the_banks():
    for k in range(1, 2100):
        stride = mma_stride(k)
        assert k <= stride < k + 2 * MMA_K_BLOCK and stride % MMA_K_BLOCK == 0, k
        # float32: a quarter-warp's float4 loads read two rows of 16 words each, one per half of the 32 banks
        assert stride % 32 == 16, k
        # 16 bits: a half-warp's 8-byte loads read four rows of 32 bytes, each in its own quarter of the banks
        assert len({row * 2 * stride % 128 for row in range(4)}) == 4, k


def _f16x3_copies(x, m, lo_piece: int):
    """x scaled by its rows' largest magnitudes m ([rows, 1]) as the split's three copies side by side
    along the last axis, and the scales."""
    import numpy as np

    scale = f16x3_scale(m)
    return np.concatenate(f16x3_pieces((x * scale).astype(np.float32), lo_piece), axis=-1), scale


def test_three_fp16_products_over_scaled_rows_and_columns_hold_float32s_accuracy():
    """The split's arithmetic (tests/f16x3_pieces.py, as the GPU tests check the kernels against): A's pieces
    (hi, hi / 2^11, lo) against W's (hi, lo, hi / 2^11) summed over 3K in float64, both scales undone,
    miss A @ W by about 2^-22 of its rows' scale, whether a row's values span 2^20 or not, and for rows
    whose largest value is 1e-30 or 1e30 (each scaled into fp16's range by its own power of two)."""
    import numpy as np

    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 256)).astype(np.float32) * np.float32(0.5)
    a[:8] *= np.float32(2.0) ** -rng.integers(0, 20, (8, 1))  # rows far below the largest
    a[8] *= np.float32(1e-30)
    a[9] *= np.float32(1e30)
    w = (rng.standard_normal((256, 96)) * 0.05).astype(np.float32)
    a3, sa = _f16x3_copies(a, np.abs(a).max(1, keepdims=True), lo_piece=2)  # [64, 3K]
    w3, sw = _f16x3_copies(w.T, np.abs(w).max(0)[:, None], lo_piece=1)  # [96, 3K]: W's columns
    got = (a3.astype(np.float64) @ w3.astype(np.float64).T) / sa / sw.T
    want = a.astype(np.float64) @ w.astype(np.float64)
    for r in range(64):
        assert np.abs(got[r] - want[r]).max() <= 2.0**-20 * np.abs(want[r]).max(), r
