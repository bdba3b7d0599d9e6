"""The warpgroup GEMM (cuda_wgmma): the shapes it takes, and its source compiling for sm_90a with no
fence that ptxas has to add (one between a stage's wgmmas would serialize them). The GPU tests check
its results."""

from __future__ import annotations

import subprocess

import pytest

from cellfuse.codegen import backward_plan, make_plan
from cellfuse.codegen.cuda_wgmma import SOURCE, RowEnds, gemm_grid, row_ends
from cellfuse.codegen.gemm_routes import wgmma_shape_fits
from cellfuse.codegen.lowering import Gemm, Loop, lower
from cellfuse.graph_model import Sizes, load_template
from cellfuse.graph_model.lengths import masked


def test_the_shapes_it_takes_are_whole_tiles_of_columns_and_stages():
    assert wgmma_shape_fits(512, 512, False) and wgmma_shape_fits(2048, 32, False)
    assert not wgmma_shape_fits(512, 512, True)  # x transposed (a weight gradient's x^T)
    assert not wgmma_shape_fits(384, 512, False)  # a part of a tile of 256 columns
    assert not wgmma_shape_fits(512, 48, False)  # a part of a stage of 32
    assert not wgmma_shape_fits(0, 512, False)
    assert gemm_grid(6400, 512) == (2, 50) and gemm_grid(6401, 512) == (2, 51)
    # rows of a batch with lengths: blocks of 8 steps of 16 rows (100 steps: 13 blocks of steps)
    assert gemm_grid(6400, 512, 64) == (2, 52) and gemm_grid(416, 256, 32) == (1, 4)
    for m, batch in ((6400, 40), (6401, 64)):  # not whole blocks of 16 rows; not whole steps
        with pytest.raises(ValueError, match="whole steps"):
            gemm_grid(m, 512, batch)


def _gemms(instructions):
    for i in instructions:
        if isinstance(i, Loop):
            yield from _gemms(i.body)
        elif isinstance(i, Gemm):
            yield i


@pytest.mark.parametrize("schedule", ["tensor", "graph", "wavefront"])
def test_a_plan_whose_rows_have_lengths_gives_its_input_gemms_their_ends(schedule):
    """Each layer's input GEMM (over x, then over the layer below's y), whole or a range of steps at a
    time, reads the rows' lengths from the steps-left state's initial value; the step's GEMMs over B
    rows do not, nor a plan without lengths, a batch that is not whole blocks of 16 rows, or a backward
    plan (whose GEMMs run after the forward's buffers may have been reused)."""
    sizes = Sizes(100, 64, 512, 512, 2)
    plan = make_plan(masked(load_template("lstm")), sizes, schedule, save_steps=True)
    ends = {(i.launch.a.buffer, i.steps): row_ends(plan, i.launch, i.rows, i.steps)
            for i in _gemms(lower(plan).instructions)}
    hoisted = {key: e for key, e in ends.items() if e is not None}
    assert {a for a, _ in hoisted} == {"x", "l0.out.y"}
    assert all(e == RowEnds("init.cf_len_left", 512, 64, steps[0] if steps else 0)
               for (_, steps), e in hoisted.items())
    assert any(steps for _, steps in hoisted) == (schedule != "tensor")  # the graph rungs' ranges of steps
    assert all(e is None for (a, _), e in ends.items() if a not in ("x", "l0.out.y"))
    plain = make_plan(load_template("lstm"), sizes, schedule)
    assert all(row_ends(plain, i.launch, i.rows, i.steps) is None for i in _gemms(lower(plain).instructions))
    odd = make_plan(masked(load_template("lstm")), Sizes(100, 40, 512, 512, 2), schedule)
    assert all(row_ends(odd, i.launch, i.rows, i.steps) is None for i in _gemms(lower(odd).instructions))
    backward = backward_plan(plan)
    assert all(row_ends(backward, i.launch, i.rows, i.steps) is None for i in _gemms(backward.instructions()))


def test_the_source_compiles_for_sm_90a_without_a_fence_added(tmp_path):
    cu = tmp_path / "wgmma.cu"
    cu.write_text(SOURCE)
    proc = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-O3", "-Werror", "all-warnings",
                           "-Xptxas", "-v", "-o", str(tmp_path / "wgmma.cubin"), str(cu)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "cf_wgmma_gemm" in proc.stderr  # ptxas reported on it
    assert "injected" not in proc.stderr and "serialized" not in proc.stderr, proc.stderr
    spills = [line for line in proc.stderr.splitlines() if "spill stores" in line]
    assert spills and all(" 0 bytes spill stores, 0 bytes spill loads" in line for line in spills)

