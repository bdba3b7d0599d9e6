"""The warpgroup GEMM (cuda_wgmma): the shapes it takes, and its source compiling for sm_90a with no
fence that ptxas has to add (one between a stage's wgmmas would serialize them). The GPU tests check
its results."""

from __future__ import annotations

import subprocess

from cellfuse.codegen.cuda_wgmma import SOURCE, gemm_grid
from cellfuse.codegen.gemm_routes import wgmma_shape_fits


def test_the_shapes_it_takes_are_whole_tiles_of_columns_and_stages():
    assert wgmma_shape_fits(512, 512, False) and wgmma_shape_fits(2048, 32, False)
    assert not wgmma_shape_fits(512, 512, True)  # x transposed (a weight gradient's x^T)
    assert not wgmma_shape_fits(384, 512, False)  # a part of a tile of 256 columns
    assert not wgmma_shape_fits(512, 48, False)  # a part of a stage of 32
    assert not wgmma_shape_fits(0, 512, False)
    assert gemm_grid(6400, 512) == (2, 50) and gemm_grid(6401, 512) == (2, 51)


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

