"""The persistent schedule: its barriers, its blocks' columns and shared memory, and a numpy run that
executes it block by block, so that a barrier missing from a plan shows on a machine without a GPU."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from compile_cuda import nvcc_cubin
from hypothesis import HealthCheck, given, settings
from random_cells import random_cell, random_cells

from cellfuse.codegen import make_plan, persistent, plan_kernels
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.cuda_kernels import PRELUDE
from cellfuse.codegen.lowering import SIDE
from cellfuse.codegen.persistent import barriers
from cellfuse.codegen.persistent_cuda import PERSISTENT_PRELUDE, persistent_source
from cellfuse.codegen.persistent_cuda.gemm_fma import _reduction
from cellfuse.codegen.plan import H100, GemmLaunch, KernelLaunch, Plan, Target, owned
from cellfuse.codegen.plan_text import describe, summary
from cellfuse.codegen.tiling import gemm_tiling
from cellfuse.gpu_runtime.numpy_executor import NumpyExecutor
from cellfuse.graph_model import (
    CellBuilder,
    Sizes,
    analyze,
    init_params,
    load_template,
    run_reference,
    sigmoid,
    tanh,
    template_names,
)
from cellfuse.graph_model.builder import apply

# The layer-normalised LSTM's step: its recurrent GEMM, then its kernel, a block per row, behind a barrier
# (it reads every block's columns of the GEMM's output).
BARRIERS_PER_STEP = {"lstm": 1, "peephole_lstm": 1, "cifg_lstm": 1, "gru": 1, "elman": 1, "indrnn": 0,
                     "gru_cho": 2, "mgu": 2, "sru": 0, "residual_lstm": 1, "slstm": 1, "layernorm_lstm": 2}
TEMPLATES = template_names()
# Few SMs, so that blocks own several columns each, and uneven shares at these widths.
SMALL = Target(sm_count=2, smem_per_block=48 * 1024)
# Eight SMs and a batch of 19: two row groups of 10 and 9 rows, four column blocks.
EIGHT = Target(sm_count=8, smem_per_block=48 * 1024)


def run(plan: Plan, cell, layers: int, initial: bool, reverse_blocks: bool, seed: int = 0):
    s = plan.sizes
    rng = np.random.default_rng(seed)
    params = init_params(cell, layers, s.input, s.hidden, seed)
    inputs = {"x": rng.uniform(-1, 1, (s.seq, s.batch, s.input)).astype(np.float32)}
    init = {st: (rng.uniform(-1, 1, (layers, s.batch, s.hidden)) if initial
                 else np.zeros((layers, s.batch, s.hidden))).astype(np.float32) for st in cell.updates}
    got = NumpyExecutor(plan, params, np.float64, SIDE, reverse_blocks).run(inputs["x"], init)
    ref = run_reference(cell, params, {**inputs, **init}, layers)
    return max(float(np.abs(got.y - ref.y).max()),
               *(float(np.abs(got.final[k] - ref.final[k]).max()) for k in ref.final))


@pytest.mark.parametrize("name", TEMPLATES)
def test_barriers_per_step_of_every_template(name):
    cell = load_template(name)
    plan = make_plan(cell, Sizes(5, 3, 6 if analyze(cell).ties else 7, 6), "persistent")
    launch = plan.layers[0].persistent
    assert launch.waits_per_step == BARRIERS_PER_STEP[name]
    # Every wait is for a GEMM operand that one elementwise launch writes: it goes through an exchange,
    # and no step waits at a grid-wide barrier, but before a kernel that runs a block per row.
    exchanged = name not in ("indrnn", "sru")
    assert bool(launch.exchange) == exchanged
    by_rows = sum(item.by_rows for item in launch.items)
    assert launch.barriers_per_step == (by_rows if exchanged else BARRIERS_PER_STEP[name])
    assert launch.exchange_waits_per_step == (BARRIERS_PER_STEP[name] - by_rows if exchanged else 0)
    assert plan.launches_per_step == 0 and plan.chunk_steps == 0 and plan.cuda_graph
    assert [item.launch for item in launch.items] == plan.layers[0].step
    by_rows = [item.by_rows for item in launch.items]
    assert by_rows == [name == "layernorm_lstm" and isinstance(i.launch, KernelLaunch) for i in launch.items]
    assert all(item.barrier == (isinstance(item.launch, GemmLaunch) or item.by_rows) for item in launch.items)


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("target, batch", [(H100, 3), (SMALL, 3), (EIGHT, 19)],
                         ids=["h100", "two-sms", "row-groups"])
@pytest.mark.parametrize("layers", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_every_template_matches_the_reference_block_by_block(name, target, batch, layers):
    cell = load_template(name)
    plan = make_plan(cell, Sizes(5, batch, 6 if analyze(cell).ties else 7, 6, layers), "persistent", target)
    if batch == 19:
        assert plan.layers[0].persistent.row_groups == 2
    for initial in (False, True):
        for reverse in (False, True):
            assert run(plan, cell, layers, initial, reverse) < 1e-9


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells())
def test_random_cells_match_the_reference_block_by_block(cell):
    for layers, target, batch in ((1, SMALL, 2), (3, H100, 2), (1, EIGHT, 17)):
        plan = make_plan(cell, Sizes(4, batch, 5, 3, layers), "persistent", target)
        for reverse in (False, True):
            assert run(plan, cell, layers, True, reverse) < 1e-6


def without_barrier(plan: Plan, index: int) -> Plan:
    lp = plan.layers[0]
    items = list(lp.persistent.items)
    items[index] = dataclasses.replace(items[index], barrier=False)
    persistent = dataclasses.replace(lp.persistent, items=tuple(items))
    return dataclasses.replace(plan, layers=[dataclasses.replace(lp, persistent=persistent)])


@pytest.mark.parametrize("name", ["lstm", "gru_cho", "mgu"])
def test_a_missing_barrier_shows_in_the_numpy_run(name):
    cell = load_template(name)
    plan = make_plan(cell, Sizes(5, 3, 7, 6), "persistent", SMALL)
    assert max(run(plan, cell, 1, True, r) for r in (False, True)) < 1e-9
    for i, item in enumerate(plan.layers[0].persistent.items):
        if item.barrier:
            broken = without_barrier(plan, i)
            errors = [run(broken, cell, 1, True, r) for r in (False, True)]
            assert max(errors) > 1e-3 or any(np.isnan(errors)), f"barrier before item {i} not needed?"


def test_an_operand_overwritten_before_the_first_barrier_gets_a_barrier():
    """v = tanh(h) is written before the GEMM that reads it: next step's v must wait until every block
    has read this step's, so a barrier goes before its kernel too."""
    b = CellBuilder("early operand")
    x, h = b.input("x"), b.state("h")
    W, U = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden")
    v = tanh(h).named("v")
    h_new = tanh(x @ W + v @ U).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    plan = make_plan(cell, Sizes(5, 3, 7, 6), "persistent", SMALL)
    step = plan.layers[0].step
    assert barriers(step) == [True, True, False]
    broken = without_barrier(plan, 0)
    assert max(run(broken, cell, 1, False, r) for r in (False, True)) > 1e-3


def test_one_number_per_row_is_read_by_other_blocks_behind_a_barrier():
    """row_mean(h) is one number per row: the block owning the first column writes it, and the launch after
    it reads it on every block, so a barrier goes between them (without one, a block that runs first reads
    the previous step's mean)."""
    cell = dataclasses.replace(random_cell(7125, reductions=True, ties=True),
                               sizes={"input": 40, "hidden": 40})
    plan = make_plan(cell, Sizes(6, 5, 40, 40), "persistent")
    items = plan.layers[0].persistent.items
    reader = next(i for i, item in enumerate(items) if isinstance(item.launch, KernelLaunch)
                  and any(acc.kind == "col" for _, acc in item.launch.inputs))
    assert items[reader].barrier
    assert max(run(plan, cell, 1, True, r) for r in (False, True)) < 1e-9
    broken = without_barrier(plan, reader)
    errors = [run(broken, cell, 1, True, r) for r in (False, True)]
    assert max(errors) > 1e-3 or any(np.isnan(errors))
    source = plan_kernels(plan).sources
    assert any("__ldcg(p1 + (long long)r * 1)" in text for text in source.values())  # through L2, not L1


def test_blocks_own_every_column_once():
    for width in (1, 5, 7, 512, 1000):
        for blocks in (1, 2, 3, 128, 132):
            cols = [c for p in range(blocks) for c in range(*owned(width, blocks, p))]
            assert cols == list(range(width))


def test_weights_that_do_not_fit_are_read_from_l2_and_the_plan_says_so():
    cell = load_template("lstm")
    small = Target(sm_count=4, smem_per_block=12 * 1024)
    plan = make_plan(cell, Sizes(3, 2, 64, 64), "persistent", small)
    launch = plan.layers[0].persistent
    (gemm,) = [item for item in launch.items if isinstance(item.launch, GemmLaunch)]
    assert not gemm.on_chip and "do not fit" in launch.note and "gemm1 (17 KiB)" in launch.note
    assert launch.smem_bytes <= small.smem_per_block
    assert "read from L2" in describe(plan)
    assert run(plan, cell, 1, True, False) < 1e-9


def test_an_h1024_lstm_keeps_its_recurrent_weights_on_chip():
    plan = make_plan(load_template("lstm"), Sizes(100, 8, 1024, 1024), "persistent")
    launch = plan.layers[0].persistent
    assert all(item.on_chip for item in launch.items if isinstance(item.launch, GemmLaunch))
    assert launch.blocks * launch.smem_bytes >= 16 * 2**20  # all of U, 1024 x 4096 floats
    assert launch.smem_bytes <= H100.smem_per_block and launch.blocks <= H100.sm_count


@pytest.mark.parametrize("name", TEMPLATES)
def test_shared_memory_arrays_start_on_16_byte_boundaries(name):
    """The kernel reads its shared-memory arrays as float4s: an array after a GEMM output of an odd
    size would be misaligned (the GPU stops with "misaligned address")."""
    cell = load_template(name)
    for sizes in (Sizes(7, 5, 24, 40, 2), Sizes(3, 19, 7, 6), Sizes(100, 64, 512, 512)):
        if analyze(cell).ties:  # a cell that ties the two widths runs only where they are equal
            sizes = dataclasses.replace(sizes, input=sizes.hidden)
        for body in plan_kernels(make_plan(cell, sizes, "persistent")).sources.values():
            for offset in re.findall(r"cf_smem \+ (\d+);", body):
                assert int(offset) % 4 == 0, f"{sizes}: an array at float {offset}"


# -- row reductions: a block per row ------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_cells(reductions=True))
def test_random_cells_with_row_reductions_match_the_reference_block_by_block(cell):
    for layers, target, batch in ((1, SMALL, 2), (1, EIGHT, 17), (2, EIGHT, 3)):
        plan = make_plan(cell, Sizes(4, batch, 5, 7, layers), "persistent", target)
        for reverse in (False, True):
            assert run(plan, cell, layers, True, reverse) < 1e-6


@pytest.mark.parametrize("seed", [*range(7000, 7010),
                                  *(pytest.param(s, marks=pytest.mark.slow) for s in range(7010, 7060))])
def test_seeded_random_cells_with_row_reductions_and_ties_match_block_by_block(seed):
    """A kernel with row reductions runs a block per row, reading what other blocks wrote and writing
    what they read: the barriers around it must be where the plan puts them, in either block order. (The
    seeds of random_cell_checks, whose cells with a row mean of a state once raced on the GPU.)"""
    cell = dataclasses.replace(random_cell(seed, reductions=True, ties=True), sizes={"input": 6, "hidden": 6})
    for layers, target, batch in ((1, SMALL, 2), (2, H100, 3), (1, EIGHT, 17)):
        plan = make_plan(cell, Sizes(4, batch, 6, 6, layers), "persistent", target)
        for reverse in (False, True):
            assert run(plan, cell, layers, True, reverse) < 1e-6


def test_a_kernel_with_a_row_reduction_runs_a_block_per_row_behind_a_barrier():
    """m = row_mean(v): the kernel runs a block per row, every column, so that it sums its rows alone;
    but it reads the GEMM's output, which every block wrote its columns of, and writes the state that
    the next step's GEMM reads: a barrier before it, and one before the GEMM. Without the first, a block
    reads columns that other blocks have not written yet."""
    b = CellBuilder("norm")
    x, h = b.input("x"), b.state("h")
    W, U = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden")
    v = tanh(x @ W + h @ U).named("v")
    m = apply("row_mean", v).named("m")
    h_new = (v - m).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    plan = make_plan(cell, Sizes(5, 3, 7, 10), "persistent", SMALL)
    items = plan.layers[0].persistent.items
    assert [(i.barrier, i.by_rows) for i in items] == [(True, False), (True, True)]
    assert not items[0].output_on_chip  # the other blocks read it
    assert plan.layers[0].persistent.column_blocks == 2
    assert max(run(plan, cell, 1, True, r) for r in (False, True)) < 1e-9
    broken = without_barrier(plan, 1)
    errors = [run(broken, cell, 1, True, r) for r in (False, True)]
    assert max(errors) > 1e-3 or any(np.isnan(errors))


def test_what_a_block_per_row_writes_other_blocks_read_after_a_barrier_through_l2(tmp_path):
    """A block per row (the layer norm of v) writes n, which the next GEMM reads, and which the kernel
    after that, each block on its own columns, reads too: a barrier before each, and the loads of n go
    through L2 (an SM's L1 may hold an older n), in the kernel nvcc builds without a warning."""
    b = CellBuilder("norm then gate")
    x, h = b.input("x"), b.state("h")
    W, U, V = (b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"),
               b.weight("V", "hidden", "hidden"))
    v = tanh(x @ W + h @ U).named("v")
    n = (v - apply("row_mean", v).named("m")).named("n")
    h_new = (sigmoid(n @ V).named("g") * n).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
    plan = make_plan(cell, Sizes(5, 3, 7, 10), "persistent", SMALL)
    p = plan.layers[0].persistent
    assert [(type(i.launch).__name__, i.barrier, i.by_rows) for i in p.items] == [
        ("GemmLaunch", True, False), ("KernelLaunch", True, True), ("GemmLaunch", True, False),
        ("KernelLaunch", False, False)]
    assert max(run(plan, cell, 1, True, r) for r in (False, True)) < 1e-9
    source = plan_kernels(plan).sources
    (kernel,) = [body for body in source.values() if "grid_group" in body]
    written = {acc.buffer for _, acc in p.items[1].launch.outputs}
    last = p.items[3].launch
    reads = [n for n, (_, acc) in enumerate(last.inputs) if acc.buffer in written]
    assert reads and all(f"__ldcg(p{n} + " in kernel for n in reads)
    nvcc_cubin(PERSISTENT_PRELUDE + PRELUDE + "\n".join(source.values()), tmp_path)


def test_a_block_per_row_loads_its_operands_at_once_and_only_what_the_kernel_writes_through_l2():
    """The layer-normalised LSTM's block per row loads every operand in its first pass over the row (a
    later pass's loads would wait for a row sum first), the GEMM's output and the state through L2,
    which other blocks (or steps) of the kernel write, and the gains and biases, which nothing writes,
    through the read-only cache."""
    plan = make_plan(load_template("layernorm_lstm"), Sizes(100, 64, 512, 512), "persistent")
    (kernel,) = [body for body in plan_kernels(plan).sources.values() if "grid_group" in body]
    rows = kernel[kernel.index("_rows1("):kernel.index("extern \"C\"")]
    first, later = rows.split("// pass 2 over the row")
    loaded = set(re.findall(r"= (?:__ldcg\()?(p\d+_\w+)[ \[]", first))
    assert len(loaded) == 23  # the four gates of h U, ten gains and biases, x's four, b's four, c
    assert not re.search(r"= (?:__ldcg\()?p\d+_", later)
    through_l2 = set(re.findall(r"__ldcg\((p\d+_\w+) ", rows))
    assert through_l2 == {"p0_hi", "p1_hf", "p2_ho", "p3_hg", "p20_c"}


@pytest.mark.parametrize("hidden, rounds", [(512, 2), (40, 4)])
def test_a_variance_takes_no_round_of_row_sums_of_its_own_where_every_thread_holds_as_many_columns(
        hidden, rounds):
    """The layer-normalised LSTM's block per row: the variances of h U's gates and of the cell, each
    mean((v - mu)^2) with mu a mean of the row, come from v's sum and its sum of squared deviations from
    its own mean, which the pass that computes v gathers beside its plain sum: two rounds of row sums a
    step instead of four, where every thread holds two of the row's 512 columns; at 40 (some threads
    hold none, which the pairwise update does not allow for), four as before."""
    plan = make_plan(load_template("layernorm_lstm"), Sizes(100, 64, hidden, hidden), "persistent")
    (kernel,) = [body for body in plan_kernels(plan).sources.values() if "grid_group" in body]
    rows = kernel[kernel.index("_rows1("):kernel.index("extern \"C\"")]
    assert rows.count("__syncthreads();  // every thread has read the row sums before these") == rounds
    assert f"// pass {rounds + 1} over the row" in rows and f"// pass {rounds + 2} over" not in rows
    deviations = re.findall(r"const float v_(var_\w+) = \(cf_deviations\(ts_\d_0, tq_\d_0, v_mu_h|"
                            r"const float v_(var_c) = \(cf_deviations\(ts_0_1, tq_0_1, v_mu_c", rows)
    assert len(deviations) == (5 if rounds == 2 else 0)
    assert ("cf_lanes_deviations(" in rows) == (rounds == 2)


@pytest.mark.parametrize("seed", [*range(5),
                                  *(pytest.param(s, marks=pytest.mark.slow) for s in range(5, 30))])
def test_random_cells_that_tie_the_widths_match_the_reference_block_by_block(seed):
    """Input-wide rows meeting hidden-wide ones, and row reductions."""
    cell = random_cell(seed + 9000, reductions=True, ties=True)
    for layers, target, batch in ((1, EIGHT, 17), (2, EIGHT, 3)):
        plan = make_plan(cell, Sizes(4, batch, 8, 8, layers), "persistent", target)
        for reverse in (False, True):
            assert run(plan, cell, layers, True, reverse) < 1e-6


@pytest.mark.parametrize("name, batch", [("lstm", 64), ("lstm", 8), ("gru_cho", 64), ("lstm", 1)])
def test_the_tensor_rung_puts_the_gemms_whose_weights_fit_on_tensor_cores(name, batch):
    """`tensor` is `persistent` with each on-chip GEMM in warp tiles of mma.sync products, 16 rows by 8
    columns each: the operand's rows padded to 16 (zeros), the warps sharing each tile's K, their
    partial tiles in shared memory, every part of it 32-byte aligned; the plan says so."""
    cell = load_template(name)
    sizes = Sizes(100, batch, 512, 512)
    plan, fp32 = make_plan(cell, sizes, "tensor"), make_plan(cell, sizes, "persistent")
    launch = plan.layers[0].persistent
    gemms = [item for item in launch.items if isinstance(item.launch, GemmLaunch)]
    assert gemms and all(item.mma and item.on_chip for item in gemms)
    assert not any(item.mma for item in fp32.layers[0].persistent.items)
    assert [item.launch for item in launch.items] == [item.launch for item in fp32.layers[0].persistent.items]
    assert launch.smem_bytes <= H100.smem_per_block and launch.smem_bytes % 32 == 0
    for item in gemms:
        tiling = gemm_tiling(item.columns, launch.column_blocks, launch.row_tile, item.launch.k, mma=True,
                             f16x3=True)
        assert tiling == item.tiling
        assert tiling.padded_rows % 16 == 0 and tiling.padded_cols % 8 == 0
        assert tiling.padded_rows >= launch.row_tile and tiling.padded_cols >= tiling.cols
        assert tiling.padded_cols - tiling.cols < tiling.cols_per_thread  # no warp tile of padding alone
        assert tiling.output_threads * tiling.k_split <= 8 or tiling.k_split == 1  # no warp idle
        assert tiling.mma_floats == tiling.output_threads * tiling.k_split * 16 * tiling.cols_per_thread
        assert tiling.w_stride(item.launch.k) % 32 == 16  # a lane group's float4s in different banks
    assert summary(plan)["persistent"]["tensor_cores"]
    assert "on tensor cores (3xFP16, rows and columns scaled)" in describe(plan)
    source = plan_kernels(plan).module_source()
    # three fp16 products each, the two small ones apart; the rows scaled by each warp
    assert source.count("cf_mma_f16(acc[x]") == len(gemms)
    assert source.count("cf_mma_f16(small[x]") == 2 * len(gemms)
    assert source.count("s0 = cf_f16x3_scale(m0), s1 = cf_f16x3_scale(m1)") == len(gemms)


def test_a_gemm_zeroes_the_columns_past_its_k_that_a_longer_one_may_have_staged():
    """The step's GEMMs share the stage: where K is not a whole block of the products' reads (16 k on
    tensor cores, a float4 on the CUDA cores), a GEMM zeroes its rows' columns past K after staging them
    (a longer GEMM's values there would count in its rows' fp16 scales, an inf or NaN would make NaN), in
    the last chunk only where K is staged in chunks; at K = 512 nothing is emitted."""
    from cellfuse.codegen.kernel_set import backward_kernels

    def zeroing(name, sizes, schedule):
        plan = make_plan(load_template(name), sizes, schedule, save_steps=True)
        source = plan_kernels(plan).module_source() + backward_kernels(backward_plan(plan)).module_source()
        return [line.strip() for line in source.splitlines() if "cf_stage[(e / " in line]

    lines = zeroing("gru_cho", Sizes(10, 8, 40, 40), "tensor")  # K = 40: columns 40 .. 47 of each row
    assert lines and all(line.endswith("cf_stage[(e / 8) * 48 + 40 + e % 8] = 0.0f;") for line in lines)
    # K = 598 forward, staged whole: 598 .. 607; 4H = 2392 backward, at B=1 in chunks of 2048 (at B=64 of
    # 512): the last one's 344 .. 351
    for batch, stride in [(1, 2064), (64, 528)]:
        whole, last = zeroing("lstm", Sizes(12, batch, 512, 598), "tensor")
        assert whole.startswith("for ") and whole.endswith("* 624 + 598 + e % 10] = 0.0f;")
        assert last.startswith("if (kc == 2048) ") and last.endswith(f"* {stride} + 344 + e % 8] = 0.0f;")
    (line, *_) = zeroing("lstm", Sizes(6, 3, 37, 37), "persistent")  # on the CUDA cores: K = 37, 37 .. 39
    assert "+ 37 + e % 3] = 0.0f;" in line
    assert zeroing("lstm", Sizes(12, 64, 512, 512), "tensor") == []


@pytest.mark.slow
@pytest.mark.parametrize("name, batch", [("lstm", 64), ("layernorm_lstm", 64), ("gru_cho", 8)])
def test_the_tensor_rung_s_kernels_compile_forward_and_backward(name, batch, tmp_path):
    """Its GEMMs' outputs go on chip or, for a block per row or a backward pass, to memory: both compile."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.kernel_set import backward_kernels

    plan = make_plan(load_template(name), Sizes(100, batch, 512, 512), "tensor", save_steps=True)
    assert any(item.mma for item in plan.layers[0].persistent.items)
    nvcc_cubin(plan_kernels(plan).module_source(), tmp_path)
    nvcc_cubin(backward_kernels(backward_plan(plan)).module_source(), tmp_path)


def test_final_states_that_blocks_per_row_write_are_copied_out_after_a_grid_barrier():
    """The layer-normalised LSTM's block per row writes its states, every column of a row: a block's own
    elements of them are another block's work, so the copies of the final states wait for every block."""
    source = plan_kernels(make_plan(load_template("layernorm_lstm"), Sizes(100, 8, 512, 512),
                                    "persistent")).module_source()
    assert "grid.sync();  // blocks per row wrote the final states" in source
    assert "the block wrote its final states" not in source


def test_initial_states_that_a_block_per_row_reads_are_copied_in_before_a_grid_barrier(tmp_path):
    """h' = tanh(x + h - row_mean(h)): the step has no GEMM and no barrier, its one kernel a block per row
    that reads whole rows of h; the blocks copy their own columns of the initial h in, so the first step
    waits for every block's copy (and the last block per row's writes are copied out after another).
    Without the first barrier the numpy executor's blocks, run one by one, read columns not copied yet."""
    b = CellBuilder("centred")
    x, h = b.input("x"), b.state("h")
    h_new = tanh(x + (h - apply("row_mean", h).named("m"))).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    # (no weight says the hidden size: the cell does)
    cell = dataclasses.replace(b.build(), sizes={"input": 10, "hidden": 10})
    plan = make_plan(cell, Sizes(5, 3, 10, 10), "persistent", SMALL)
    launch = plan.layers[0].persistent
    assert [(i.barrier, i.by_rows) for i in launch.items] == [(False, True)] and launch.column_blocks > 1
    assert launch.initial_barrier and launch.final_barrier and launch.cooperative
    source = plan_kernels(plan).module_source()
    assert "grid.sync();  // every block's initial states are where the first step reads them" in source
    assert "grid.sync();  // blocks per row wrote the final states" in source
    nvcc_cubin(source, tmp_path)
    assert max(run(plan, cell, 1, True, r) for r in (False, True)) < 1e-9
    without = dataclasses.replace(plan, layers=[dataclasses.replace(
        plan.layers[0], persistent=dataclasses.replace(launch, initial_barrier=False))])
    errors = [run(without, cell, 1, True, r) for r in (False, True)]
    assert max(errors) > 1e-3 or any(np.isnan(errors))


def test_the_lstm_s_initial_states_need_no_barrier_of_their_own():
    """The LSTM's GEMM reads h through an exchange, whose initial values each block publishes from its
    own copies behind a grid-wide barrier: no second one after the copies, nor before the copies out."""
    launch = make_plan(load_template("lstm"), Sizes(5, 3, 10, 10), "persistent", SMALL).layers[0].persistent
    assert launch.exchange and not launch.initial_barrier and not launch.final_barrier


def _recurrent_tilings(name: str, batch: int, hidden: int, schedule: str = "persistent"):
    plan = make_plan(load_template(name), Sizes(100, batch, hidden, hidden), schedule)
    launch = plan.layers[0].persistent
    return plan, [(item, item.tiling) for item in launch.items if isinstance(item.launch, GemmLaunch)]


@pytest.mark.parametrize("name, hidden, widths", [
    ("lstm", 512, [16]), *(pytest.param(*case, marks=pytest.mark.slow) for case in [
        ("gru", 512, [16]), ("elman", 512, [4]), ("mgu", 256, [2, 2]), ("gru_cho", 512, [8, 4])])])
def test_one_row_at_a_time_multiplies_in_registers(name, hidden, widths, tmp_path):
    """At B=1 each thread polls its two k of h and multiplies them by its two rows of the block's columns
    of U held in registers (a power of two of them, the GRU's 12 padded to 16); the island adds the
    warps' partial sums: no staged operand, one barrier after the products, and it compiles."""
    plan, gemms = _recurrent_tilings(name, 1, hidden)
    assert [t.cols_per_thread for _, t in gemms if t.in_registers] == widths
    assert all(item.in_registers for item, _ in gemms) and "products in registers" in describe(plan)
    source = plan_kernels(plan).module_source()
    loop = source.index("for (int t = 0; t < seq; ++t)")
    assert "the stage is free again" not in source[loop:] and "cf_stage[r *" not in source[loop:]
    assert all(f"const cf_warp_sums<{w}, 8> cf_c" in source for w in widths)
    assert source[loop:].count("__syncwarp();") == len(widths)
    nvcc_cubin(source, tmp_path)


@pytest.mark.parametrize("name, batch, hidden, schedule", [("lstm", 8, 512, "persistent"),
                                                           ("lstm", 1, 1024, "persistent"),
                                                           ("lstm", 1, 512, "tensor"),
                                                           ("layernorm_lstm", 1, 512, "persistent")])
def test_products_stay_tiled_where_registers_do_not_hold_them(name, batch, hidden, schedule):
    """Several rows at a time, more than two k a thread (K = 1024), tensor cores, or an output that the
    elementwise work does not read from shared memory: the tiled GEMM."""
    plan, gemms = _recurrent_tilings(name, batch, hidden, schedule)
    assert gemms and not any(t.in_registers or item.in_registers for item, t in gemms)
    assert "products in registers" not in describe(plan)


def test_a_gemm_on_tensor_cores_falls_back_to_the_cuda_cores_where_its_larger_tiles_do_not_fit():
    """At hidden 1280 the LSTM's GEMMs, forward and backward, with their weights padded to whole
    K_BLOCKs and 16 staged rows beside them, pass the 227 KiB a block may have: they stay on the CUDA
    cores, weights still on chip. At hidden 1024 they fit, the backward dA GEMM's K (4H = 4096) staged in
    eight chunks of 512."""
    from cellfuse.codegen.backward_plan import backward_plan

    for hidden, fits in [(1280, False), (1024, True)]:
        plan = make_plan(load_template("lstm"), Sizes(100, 64, hidden, hidden), "tensor", save_steps=True)
        back = backward_plan(plan).layers[0].persistent
        gemm = next(item for item in back.items if isinstance(item.launch, GemmLaunch))
        assert gemm.on_chip and gemm.mma == fits and back.reverse and back.smem_bytes <= H100.smem_per_block
        assert plan.layers[0].persistent.items[0].mma == fits  # the forward's GEMM, K = hidden
    tiling = gemm_tiling(gemm.columns, back.column_blocks, back.row_tile, gemm.launch.k, mma=True)
    assert gemm.launch.k == 4096 and tiling.k_chunk == 512
    assert plan_kernels(plan).module_source().count("kc += 512") == 1


def test_fewer_row_groups_where_they_put_every_gemm_on_tensor_cores():
    """The GRU at B=64: eight row groups keep its weights on chip for the CUDA cores' tiles, not for
    16-row ones; four groups do, and the tensor rung takes them."""
    sizes = Sizes(100, 64, 512, 512)
    cell = load_template("gru")
    assert make_plan(cell, sizes, "persistent").layers[0].persistent.row_groups == 8
    launch = make_plan(cell, sizes, "tensor").layers[0].persistent
    assert launch.row_groups == 4 and all(item.mma for item in launch.items if isinstance(item.launch,
                                                                                          GemmLaunch))


@pytest.mark.parametrize("name", ["indrnn", "sru"])
def test_a_step_with_no_gemm_splits_the_rows_so_that_a_warp_reads_along_one(name):
    """IndRNN and the SRU at B=64 on an H100: 8 row groups of 8 rows and 16 column blocks of 32 units, so
    that each warp's elements are one row's 32 adjacent units (with every row, a block owned 4 units of
    64 rows and a warp read 8 runs of 16 bytes); forward and backward alike."""
    cell = load_template(name)
    plan = make_plan(cell, Sizes(100, 64, 512, 512), "persistent", save_steps=True)
    for launch in (plan.layers[0].persistent, backward_plan(plan).layers[0].persistent):
        assert (launch.row_groups, launch.column_blocks, launch.blocks) == (8, 16, 128)
        assert launch.unit(512) == 32
    source = plan_kernels(plan).module_source()
    assert "const int r = row0 + e / 32, j = cb * 32 + e % 32;" in source


def test_a_write_overtakes_a_read_only_where_their_rows_can_meet():
    """A block's write at step t ahead of the step's first barrier lands while slower blocks may still
    read the step before (t-1; t+1 in a reverse loop): a conflict only where those rows meet."""
    from cellfuse.codegen.persistent import overtakes
    from cellfuse.codegen.plan import Access

    def acc(slot, buffer="v"):
        return Access(buffer, "row", 4, slot=slot)

    assert not overtakes(acc("t"), acc("t", "w"), False)  # other buffers never meet
    assert not overtakes(acc("t"), acc("t"), False) and not overtakes(acc("t"), acc("t"), True)
    assert overtakes(acc("t"), acc("t+1"), False)  # row t is what step t-1 reads as t+1
    assert not overtakes(acc("t"), acc("t+1"), True)
    assert overtakes(acc("t+1"), acc("t"), True)  # row t+1 is what step t+1 reads as t
    assert overtakes(acc("t%2"), acc("(t+1)%2"), False) and overtakes(acc("t%2"), acc("(t+1)%2"), True)
    assert not overtakes(acc("t%2"), acc("t%2"), False)
    assert overtakes(acc("fixed"), acc("t"), False) and overtakes(acc("t"), acc("all"), True)


@pytest.mark.parametrize("name", ["lstm", "gru", "mgu"])
def test_a_reverse_loop_loads_what_its_gradients_add_to_all_at_once(name):
    """The backward's persistent kernel adds into gradients in memory. `p[i] += v` would make each load
    wait for the store before it (the compiler cannot tell the pointers apart): twelve loads from DRAM
    in a row, most of the LSTM's reverse step. Every old value is loaded before the first store, and
    the GEMM's ones before its products."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.kernel_set import backward_kernels

    plan = make_plan(load_template(name), Sizes(100, 64, 512, 512), "persistent", save_steps=True)
    source = backward_kernels(backward_plan(plan)).module_source()
    body = source[source.index("for (int t = seq - 1"):]
    assert not re.search(r"\bp\d+\[[^\]]*\] \+=", body) and not re.search(r"\bc\[[^\]]*\] \+=", body)
    islands = [part for part in body.split("{  // ")[1:] if "cf_old_" in part]
    assert islands
    for island in islands:
        stores = [m.start() for m in re.finditer(r"\bp\d+\[[^\]]*\] = cf_old_\d+ \+", island)]
        loads = [m.start() for m in re.finditer(r"const float cf_old_\d+ = ", island)]
        assert stores and len(loads) == len(stores) and max(loads) < min(stores)
    gemm = body[body.index("dA += "):]
    assert gemm.index("cf_old[m] = ") < gemm.index("for (int it = 0") < gemm.index("= cf_old[m] +")


def test_outputs_of_one_accumulating_kernel_may_not_share_a_place():
    from cellfuse.codegen.c_text import CWriter
    from cellfuse.codegen.cuda_kernels import element_body
    from cellfuse.codegen.kernel_abi import Param
    from cellfuse.codegen.plan import Access

    out = Access("g", "row", 8)
    params = [Param("a", Access("x", "row", 8), False), Param("a", out, True), Param("a", out, True)]
    with pytest.raises(AssertionError, match="share a place"):
        element_body(CWriter(), params, ["p0", "p1", "p2"], (), adds=lambda acc: True)
    w = CWriter()
    element_body(w, params[:2], ["p0", "p1"], (), adds=lambda acc: True)
    assert w.lines[-1] == "p1[(long long)r * 8 + j] = cf_old_1 + v_a;"


@pytest.mark.parametrize("name", ["sru", "indrnn"])
def test_a_recurrence_without_barriers_loads_steps_ahead_and_keeps_its_state_in_registers(name):
    """With no recurrent GEMM each thread owns its elements for all T steps: the inputs of a chunk of
    steps are loaded at once (none of them is written in the loop) and the state the step wrote is
    read from a register, not from memory, by the next; where a GEMM needs the others' h, neither."""
    sizes = Sizes(100, 64, 512, 512)
    source = plan_kernels(make_plan(load_template(name), sizes, "persistent")).module_source()
    depth = int(re.search(r"for \(int t0 = 0; t0 < seq; t0 \+= (\d+)\)", source).group(1))
    assert 1 < depth <= 16 and re.search(rf"float cf_ahead0_\d+\[{depth}\]\[1\];", source)
    (carry,) = set(re.findall(r"float (cf_carry0_\d+)\[1\];", source))
    assert re.search(rf"const float v_\w+ = {carry}\[u\];", source)  # the state, from its register
    assert re.search(rf"{carry}\[u\] = v_\w+;", source)  # and the new state put there
    lstm = plan_kernels(make_plan(load_template("lstm"), sizes, "persistent")).module_source()
    assert "cf_ahead" not in lstm and "cf_carry" not in lstm


def test_a_step_loads_the_next_steps_read_only_inputs():
    """Where a barrier and a GEMM come before the elementwise work, each step loads the input
    projection of the step after it (the backward: the saved steps of the one before it), so that the
    round trip to memory runs beside them; it starts them after the barrier, whose wait they would
    lengthen. What the loop writes (the cell state) is still read in its own step."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.kernel_set import backward_kernels

    plan = make_plan(load_template("lstm"), Sizes(100, 64, 512, 512), "persistent", save_steps=True)
    for source, first, more, step, count in [
            (plan_kernels(plan).module_source(), "0", "t + 1 < seq", "t + 1", 4),  # x W of the 4 gates
            (backward_kernels(backward_plan(plan)).module_source(), "seq - 1", "t > 0", "t - 1", 9)]:
        loop = source.index("for (int t = ")
        names = set(re.findall(r"float (cf_next\d+_\d+)\[1\];", source[:loop]))
        assert len(names) == count and f"const int t = {first};" in source[:loop]
        started = (r"(grid\.sync\(\);|// no barrier: [^\n]*)\n            if \(" + re.escape(more)
                   + r"\) \{\n                const int cf_step = " + re.escape(step) + ";")
        assert re.search(started, source[loop:])
        assert all(re.search(rf"{n}\[u\] = \(b\d+ \+", source[loop:]) for n in names)
        assert re.search(r"pf\d+_\d+\[u\] = \(b\d+ \+ \(size_t\)\(?t", source[loop:])  # c, in its step


@pytest.mark.parametrize("name, count", [("lstm", 4), ("peephole_lstm", 7)])
def test_the_weights_of_the_elementwise_work_are_loaded_once_before_the_loop(name, count):
    """A bias (or a peephole's weights) is the same at every step: it is loaded into registers before
    the loop, and the step reads the registers."""
    plan = make_plan(load_template(name), Sizes(100, 8, 512, 512), "persistent")
    source = plan_kernels(plan).module_source()
    loop = source.index("for (int t = ")
    fixed = re.findall(r"(cf_fixed\d+_\d+)\[u\] = \(b\d+\)\[j\];", source[:loop])
    assert len(set(fixed)) == count
    assert all(f"= {array}[u];" in source[loop:] for array in fixed)
    assert not re.search(r"const float\* const p\d+ = b\d+;", source[loop:])  # no weight read in the loop


@pytest.mark.parametrize("batch", [8, 64])
def test_a_gru_block_s_three_gates_keep_every_thread_busy(batch):
    """A GRU block's columns are its units of three gates, 3 * 2^n: register tiles of 4 columns leave a
    quarter of the threads idle, tiles of 3 none."""
    launch = make_plan(load_template("gru"), Sizes(100, batch, 512, 512), "persistent").layers[0].persistent
    (gemm,) = [item for item in launch.items if isinstance(item.launch, GemmLaunch)]
    tiling = gemm_tiling(gemm.columns, launch.column_blocks, launch.row_tile, gemm.launch.k)
    assert tiling.cols % 3 == 0 and tiling.cols_per_thread == 3 and tiling.padded_cols == tiling.cols
    assert tiling.output_threads * tiling.k_split == launch.threads


@pytest.mark.parametrize("outputs, split", [(32, 8), (16, 32), (2, 32), (3, 4), (6, 8), (12, 16), (4, 1),
                                             (24, 2), (1, 8)])
def test_the_lanes_of_a_tile_add_up_every_output_once(outputs, split):
    """The persistent GEMM's k_split lanes add their partial sums as the generated code does (each
    lane keeps half of its values and sends the other half while they halve, then adds them all): every
    output of the tile is stored by exactly one lane, with the sum of all the lanes' partial sums."""
    scatter, n_out, owner = _reduction(outputs, split)
    partial = np.random.default_rng(outputs * split).standard_normal((split, outputs))
    v = {ks: list(partial[ks]) for ks in range(split)}
    for d, half in scatter:  # a lane keeps its half (the upper one where its bit d is set), the other's sent
        halves = {ks: (v[ks][half:2 * half] if ks & d else v[ks][:half]) for ks in v}
        v = {ks: [a + b for a, b in zip(halves[ks], (v[ks ^ d][half:2 * half] if ks & d
                                                     else v[ks ^ d][:half]), strict=True)] for ks in v}
    d = split // 2 >> len(scatter)
    while d >= 1:
        v = {ks: [a + b for a, b in zip(v[ks], v[ks ^ d], strict=True)] for ks in range(split)}
        d //= 2
    stored: dict[int, float] = {}
    for ks in range(split):
        mask = re.fullmatch(r"\(ks & (\d+)\) == 0", owner)
        if owner == "true" or mask and ks & int(mask.group(1)) == 0:
            first = sum(half for d, half in scatter if ks & d)
            for m in range(n_out):
                assert first + m not in stored
                stored[first + m] = v[ks][m]
    assert sorted(stored) == list(range(outputs))
    np.testing.assert_allclose([stored[f] for f in range(outputs)], partial.sum(axis=0), rtol=1e-12)
    assert n_out * split >= outputs and (n_out == outputs >> len(scatter))


@pytest.mark.parametrize("name, lags", [("lstm", [-1]), ("gru_cho", [-1, 0]), ("residual_lstm", [-1])])
def test_operands_pass_between_blocks_through_exchanges(name, lags, monkeypatch):
    """A forward step's GEMM operands go through exchanges of (step tag, value) pairs: the kernel has no
    grid barrier in its loop; before it, each block clears its own elements of both slots and publishes
    those of the initial state, and one barrier makes them visible; in the loop it publishes the
    operand's values as its elementwise launch writes them, and a GEMM polls its rows for the tag of
    the step it reads (the one before for h, its own for Cho's r*h). At B=8 the LSTM's backward step,
    whose operand is 2048 gates wide, keeps its barrier (see EXCHANGE_BYTES_PER_WAIT), Cho's GRU's too
    (its r*h gradient comes from the step before, in a reverse loop). The tensor rung passes them the
    same way where it stages all of K at once (at hidden 1024 too, whose K fits whole beside the weights at
    B=8; not where it is staged in two chunks of 512)."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.kernel_set import backward_kernels

    plan = make_plan(load_template(name), Sizes(100, 8, 512, 512), "persistent", save_steps=True)
    launch = plan.layers[0].persistent
    assert [ex.lag for ex in launch.exchange] == lags
    source = plan_kernels(plan).module_source()
    loop = source[source.index("for (int t = 0"):]
    assert "grid.sync()" not in loop
    assert loop.count("cf_publish(") == len(lags) and loop.count("// rounds, each one trip") == len(lags)
    assert loop.count("__trap();") == len(lags)  # a value that never comes faults instead of hanging
    for lag in lags:
        assert f"const unsigned want = t + {2 + lag};" in loop
    before = source[source.index("__launch_bounds__"):source.index("for (int t = 0")]
    assert before.count("grid.sync();") == 1 and before.count("cf_publish(") == 2 * len(lags)
    assert "grid.sync();" in backward_kernels(backward_plan(plan)).module_source()
    tensor = make_plan(load_template(name), Sizes(100, 8, 512, 512), "tensor").layers[0].persistent
    assert tensor.exchange == launch.exchange and not tensor.barriers_per_step
    wide = make_plan(load_template(name), Sizes(100, 8, 1024, 1024), "tensor").layers[0].persistent
    assert [ex.lag for ex in wide.exchange] == lags and not wide.barriers_per_step
    monkeypatch.setattr(persistent, "MMA_K_CHUNKS", (512,))
    chunked = make_plan(load_template(name), Sizes(100, 8, 1024, 1024), "tensor").layers[0].persistent
    assert not chunked.exchange and chunked.barriers_per_step == len(lags)


@pytest.mark.parametrize("name, batch, hidden, forward, backward", [
    ("lstm", 1, 512, True, True),  # 0.25 and 1 MiB of pairs a wait
    ("lstm", 64, 512, True, False),  # 4 MiB; the backward's operand, 2048 gates wide, 16 MiB
    ("lstm", 256, 512, False, False),  # 16 MiB forward
    ("lstm", 64, 1024, False, False),  # 32 MiB forward
    ("mgu", 64, 512, True, True),  # 2 MiB a wait, both ways
])
def test_exchanges_only_where_their_pairs_move_few_bytes_per_barrier(name, batch, hidden, forward, backward):
    """An exchange's pairs add 4 bytes to every value that every block of a row group reads: a step uses
    exchanges only where that adds at most EXCHANGE_BYTES_PER_WAIT to its reads from L2 for each barrier
    they take away (measured: more lost to the barrier it replaced), forward and backward alike."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.lowering import Persistent
    from cellfuse.codegen.persistent import EXCHANGE_BYTES_PER_WAIT

    plan = make_plan(load_template(name), Sizes(100, batch, hidden, hidden), "persistent", save_steps=True)
    back = [i.launch for i in backward_plan(plan).instructions() if isinstance(i, Persistent)]
    for launch, want in ((plan.layers[0].persistent, forward), (back[0], backward)):
        assert bool(launch.exchange) == want
        if want:
            moved = 4 * batch * launch.column_blocks * sum(ex.width for ex in launch.exchange)
            assert moved <= EXCHANGE_BYTES_PER_WAIT * len(launch.exchange) and launch.barriers_per_step == 0
        else:
            assert launch.barriers_per_step == launch.waits_per_step > 0


def test_a_backward_step_exchanges_the_gate_gradients_side_by_side():
    """The LSTM's backward step at B=1: its adjoint kernel writes dC, the gradients of the four stacked
    gates, as four outputs side by side, and publishes each at its columns of one exchange 2048 wide;
    the dA GEMM polls it for the tag of its own step, in a loop that runs from the last step down, with
    no grid barrier in it."""
    from cellfuse.codegen.backward_plan import backward_plan
    from cellfuse.codegen.kernel_set import backward_kernels

    plan = make_plan(load_template("lstm"), Sizes(100, 1, 512, 512), "persistent", save_steps=True)
    source = backward_kernels(backward_plan(plan)).module_source()
    loop = source[source.index("for (int t = seq - 1; t >= 0; --t)"):]
    assert "grid.sync()" not in loop and "const unsigned want = t + 2;" in loop
    published = re.findall(r"cf_publish\(\w+_x0 \+ \(size_t\)\(\(t\) & 1\) \* batch \* 2048 "
                           r"\+ \(size_t\)\(r\) \* 2048 \+ j( \+ \d+)?, t \+ 2,", loop)
    assert sorted(published) == ["", " + 1024", " + 1536", " + 512"]


@pytest.mark.parametrize("name, batch, schedule", [("lstm", 8, "persistent"), ("lstm", 64, "persistent"),
                                                    ("layernorm_lstm", 64, "tensor")])
def test_a_poll_addresses_its_pairs_from_the_rows_start_where_row_groups_split_the_rows(name, batch,
                                                                                         schedule):
    """Where row groups split the rows, a block's poll addresses pair e of its rows as their start + e;
    where every block polls every row, through the row r of e (each form the faster there)."""
    plan = make_plan(load_template(name), Sizes(100, batch, 512, 512), schedule)
    source = plan_kernels(plan).module_source()
    split = plan.layers[0].persistent.row_groups > 1
    assert split == (batch == 64)
    start = re.search(r"const unsigned long long\* const rows_at = \w+_x0 \+ \(size_t\)\(\(t \+ 1\) & 1\) "
                      r"\* batch \* 512 \+ \(size_t\)\(row0 \+ rb\) \* 512;", source)
    through_r = "(size_t)(row0 + rb + r) * 512 + e - r * 512;" in source
    assert (bool(start), "const unsigned long long* const p = rows_at + e;" in source, through_r) == (
        split, split, not split)


def test_exchanges_too_large_for_a_module_leave_the_barriers():
    """The exchanges are static arrays of the kernel's module: a batch and width that would need more
    than EXCHANGE_BYTES of them keep the grid barriers."""
    from cellfuse.codegen.persistent import EXCHANGE_BYTES

    small = make_plan(load_template("lstm"), Sizes(10, 64, 512, 512), "persistent").layers[0].persistent
    large = make_plan(load_template("lstm"), Sizes(10, 4096, 2048, 2048), "persistent").layers[0].persistent
    assert 16 * 4096 * 2048 > EXCHANGE_BYTES >= 16 * 64 * 512
    assert small.exchange and small.barriers_per_step == 0
    assert not large.exchange and large.barriers_per_step == 1 and large.waits_per_step == 1


def test_a_launch_of_independent_blocks_starts_early_and_waits_at_its_top():
    """IndRNN's blocks never wait for each other: its kernel is launched as an ordinary kernel that may
    start while the kernel before it ends, so its first statement waits for that one
    (griddepcontrol.wait, on sm_90 and later); the LSTM's kernel, whose blocks meet at a barrier every
    step, is a cooperative launch with no such wait."""
    for name, independent in (("indrnn", True), ("lstm", False), ("gru_cho", False)):
        plan = make_plan(load_template(name), Sizes(100, 64, 512, 512), "persistent")
        launch = plan.layers[0].persistent
        assert launch.cooperative != independent, name
        source = persistent_source(launch, "k")
        assert ("griddepcontrol.wait" in source) == independent, name
        assert ("cooperative launch" in source) != independent, name
        # IndRNN's inputs are loaded steps ahead: its elements are masked, not skipped by branches
        loop = source.split("for (int t0")[-1].split("// the block wrote its final states")[0]
        assert ("if (cf_ok) " in loop and "continue;" not in loop and ") break;" not in loop.replace(
            "if (t >= seq) break;", "")) == independent


@pytest.mark.parametrize(("name", "schedule", "batch", "hidden", "loops"), [
    ("lstm", "tensor", 64, 512, 2),  # 16 blocks of K a warp: its products and its rows' scales
    ("gru", "tensor", 64, 512, 0),  # 8 blocks of K a warp: unrolled whole either way
    ("lstm", "persistent", 8, 1024, 1),  # a thread's FMAs over K, W read from L2
])
def test_a_kernel_written_to_unroll_its_k_loops_8_at_a_time_does_so_only_where_they_have_more(
        name, schedule, batch, hidden, loops):
    """Planned for half an H100's SMs (a direction of two side by side), where the kernels spill as
    written (benchmarks/probes/kernel_registers.py)."""
    plan = make_plan(load_template(name), Sizes(100, batch, hidden, hidden), schedule,
                     dataclasses.replace(H100, sm_count=66))
    launch = plan.layers[0].persistent
    written, unrolled = persistent_source(launch, "k"), persistent_source(launch, "k", k_unroll=8)
    assert "#pragma unroll 8" not in written
    assert unrolled.count("#pragma unroll 8") == loops
    assert unrolled.replace("#pragma unroll 8", "#pragma unroll") == written
