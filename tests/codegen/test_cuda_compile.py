"""The generated kernels compile with nvcc for sm_90, without a warning: a kernel of every kind in one
nvcc run to PTX (the default tier), every template's under every schedule, and row reductions at every
width, each through ptxas (the slow tier)."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
from compile_cuda import nvcc_cubin, nvcc_ptx, renamed_apart

from cellfuse.codegen import SCHEDULES, generate_cuda, make_plan, plan_kernels
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.codegen.cuda_kernels import PRELUDE
from cellfuse.codegen.kernel_set import backward_kernels
from cellfuse.codegen.persistent_cuda import PERSISTENT_PRELUDE
from cellfuse.graph_model import Sizes, analyze, load_template, template_names

pytestmark = [pytest.mark.nvcc,
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")]

SIZES = Sizes(seq=6, batch=3, input=24, hidden=40, layers=2)


def fit(sizes: Sizes, cell) -> Sizes:
    """The sizes, with input = hidden for a cell that ties the two widths (it runs at no others)."""
    return replace(sizes, input=sizes.hidden) if analyze(cell).ties else sizes


def test_a_kernel_of_every_kind_compiles(tmp_path):
    """One nvcc run, to PTX: the layer-normalised LSTM's kernels a node each (`naive`, row reductions in
    kernels of their own), fused (`hoisted`, a block per row), persistent (a block per row behind a
    barrier, exchanges) and on tensor cores; its fused kernel where a row is narrower than a warp, where
    every thread holds as many columns (unrolled) and where they are more than are unrolled; a
    persistent kernel that multiplies one row at a time in registers (Cho's GRU at B=1) and one of
    independent blocks (IndRNN); the backward kernels: adjoints that reduce rows, a persistent reverse loop
    with an exchange and one on tensor cores; and the prelude's kernels (the TF32 split, the bias rows).
    The inline PTX is assembled by the exports' compile (test_export_hostile) and the warpgroup GEMM's
    (test_wgmma_gemm); the slow tier compiles every template under every schedule to cubins."""
    cell = load_template("layernorm_lstm")
    parts = [PERSISTENT_PRELUDE, PRELUDE]
    for schedule in ("naive", "hoisted", "persistent", "tensor"):
        parts += renamed_apart(plan_kernels(make_plan(cell, SIZES, schedule)).sources, schedule)
    for hidden in (7, 256, 9000):
        parts += renamed_apart(plan_kernels(make_plan(cell, Sizes(4, 3, 24, hidden, 1), "hoisted")).sources,
                               f"h{hidden}")
    parts += renamed_apart(plan_kernels(make_plan(load_template("gru_cho"), Sizes(6, 1, 24, 64),
                                                  "persistent")).sources, "b1")
    parts += renamed_apart(plan_kernels(make_plan(load_template("indrnn"), SIZES, "persistent")).sources,
                           "independent")
    for name, schedule in (("layernorm_lstm", "hoisted"), ("lstm", "persistent"), ("gru_cho", "tensor")):
        forward = make_plan(load_template(name), SIZES, schedule, save_steps=True)
        parts += renamed_apart(backward_kernels(backward_plan(forward)).sources, f"{schedule}_grad")
    source = "\n".join(parts)
    for kind in ("cf_lanes_sum(", "_rows1(", "cf_deviations(", "cf_publish(", "cf_split_f16x3(a4",
                 "cf_warp_sums<", "griddepcontrol.wait", "for (int t = seq - 1",
                 "__shared__ float cf_partial", "cf_split_f16x3_copies(", "cf_f16x3_unscale_sums(",
                 "cf_bias_rows("):
        assert kind in source, kind
    ptx = nvcc_ptx(source, tmp_path)
    assert ptx.count(".entry ") == source.count("__global__")


@pytest.mark.slow
@pytest.mark.parametrize("name", template_names())
def test_kernels_of_every_schedule_compile(name, tmp_path):
    cell = load_template(name)
    parts = [PERSISTENT_PRELUDE, PRELUDE]
    for schedule in SCHEDULES:
        ks = plan_kernels(make_plan(cell, fit(SIZES, cell), schedule))
        for kname, body in ks.sources.items():
            parts.append(body.replace(kname, f"{kname}_{schedule}"))
    nvcc_cubin("\n".join(parts), tmp_path)


def test_exported_kernels_are_the_runtime_kernels():
    cell = load_template("lstm")
    plan = make_plan(cell, SIZES, "hoisted")
    text = generate_cuda(cell, SIZES, "hoisted").text
    for body in plan_kernels(plan).sources.values():
        assert body in text


def test_export_names_its_sizes_and_build_command():
    text = generate_cuda(load_template("gru"), SIZES, "hoisted").text
    head = "\n".join(text.splitlines()[:12])
    assert "input 24, hidden 40, 2 layer(s)" in head
    assert "nvcc -O3 -arch=sm_90 -DCELLFUSE_DEMO_MAIN" in head
    assert "int cellfuse_gru_forward(cublasHandle_t handle, cudaStream_t stream" in text
    assert "#ifdef CELLFUSE_DEMO_MAIN" in text


@pytest.mark.parametrize("schedule", ["naive", "graph"])
def test_export_reports_the_line_of_every_kernel_and_gemm(schedule):
    src = generate_cuda(load_template("gru_cho"), Sizes(100, 64, 32, 48, 2), schedule)
    lines = src.text.split("\n")
    assert set(src.kernel_of_node.values()) <= set(src.kernel_line)
    for name, number in src.kernel_line.items():
        line = lines[number - 1]
        assert (f" {name}(" in line and "__global__" in lines[number - 2] + line) or f"/* {name} */" in line


@pytest.mark.slow
@pytest.mark.parametrize("hidden", [7, 256, 1000, 9000])
def test_kernels_that_reduce_rows_compile_at_every_width(hidden, tmp_path):
    """A row narrower than a warp, one thread per column, several columns per thread, and more than are
    unrolled (kept in local memory); with a random cell's reductions spread over rows, hoisted and
    across kernels."""
    from random_cells import random_cell

    parts = [PRELUDE]
    cells = [load_template("layernorm_lstm"), *(random_cell(seed, reductions=True) for seed in range(6))]
    for i, cell in enumerate(cells):
        ks = plan_kernels(make_plan(cell, Sizes(4, 3, 24, hidden, 1), "fused" if i % 2 else "hoisted"))
        parts += [body.replace(name, f"{name}_{i}") for name, body in ks.sources.items()]
    source = "\n".join(parts)
    assert "cf_lanes_sum(" in source and "__syncthreads();" in source
    # variances from deviation sums where every thread holds as many columns, unrolled
    assert ("cf_deviations(ts_" in source) == (hidden == 256)
    nvcc_cubin(source, tmp_path)


@pytest.mark.slow  # four cells' kernels, forward and backward, under several rungs: about 12 s on 2 cores
def test_the_kernels_of_the_drop_ins_cells_compile(tmp_path):
    """torch.nn.LSTM's and GRU's cells (two biases a gate, or none), and the LSTM rewritten to stop each
    batch row at its own length (graph_model.lengths), forward and backward under the rungs that keep
    states on chip or step layers side by side: one nvcc run to PTX."""
    from cellfuse.graph_model.lengths import masked
    from cellfuse.nn.torch_rnn import torch_cell

    parts = [PERSISTENT_PRELUDE, PRELUDE]
    cells = {"lengths": masked(load_template("lstm")), "torch_lstm": torch_cell("lstm"),
             "torch_gru": torch_cell("gru"), "torch_lstm_unbiased": torch_cell("lstm", bias=False)}
    for name, cell in cells.items():
        parts += _kernels_of(cell, name)
    nvcc_ptx("\n".join(parts), tmp_path)


def _kernels_of(cell, name: str) -> list[str]:
    parts = []
    for schedule in ("wavefront", "persistent", "tensor"):
        forward = make_plan(cell, SIZES, schedule, save_steps=True)
        parts += renamed_apart(plan_kernels(forward).sources, f"{name}_{schedule}")
        parts += renamed_apart(backward_kernels(backward_plan(forward)).sources, f"{name}_{schedule}_grad")
    return parts
