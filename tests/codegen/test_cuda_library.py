"""The fixed CUDA of the package (cellfuse/resources/cuda/*.cuh): each file compiles on its own, its
includes resolved as a module assembles them (each file once), with every warning an error."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen.cuda_library import cuda_library, library_files
from cellfuse.codegen.cuda_wgmma import SOURCE as WGMMA_SOURCE

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")

# What the demo program expects the exported file to define before it (see export_demo.cuh): here, stubs
# of a forward and a backward pass of one parameter, and of the cuBLAS calls it makes.
_DEMO_STUBS = """\
#include <cuda_runtime.h>
typedef struct cf_handle* cublasHandle_t;
static int cublasCreate(cublasHandle_t* h) { *h = 0; return 0; }
static int cf_forward(cublasHandle_t, cudaStream_t, int, int, const float*, const float* const*,
                      const float* const*, float*, float* const*, void*) { return 0; }
static int cf_backward(cublasHandle_t, cudaStream_t, int, int, const float*, const float* const*,
                       const float*, const float* const*, float*, float* const*, float* const*, void*) {
    return 0;
}
static size_t cf_workspace(int, int) { return 4; }
#define CELLFUSE_DEMO_MAIN
#define CF_DEMO_FORWARD cf_forward
#define CF_DEMO_BACKWARD cf_backward
#define CF_DEMO_WORKSPACE cf_workspace
#define CF_DEMO_PARAMS 1
#define CF_DEMO_INPUT 3
#define CF_DEMO_HIDDEN 5
#define CF_DEMO_PARAM_SIZES 15
"""

# Each file with what it needs in front of it. The warpgroup GEMM is sm_90a's alone, and is compiled for it
# by tests/codegen/test_wgmma_gemm.py, with its parameters as the package defines them.
_ALONE = {"math.cuh": "", "tf32.cuh": "", "f16x3.cuh": "", "gemm_splits.cuh": "", "persistent.cuh": "",
          "mma16.cuh": "",
          "fill_ones.cuh": "", "directions.cuh": "", "convert.cuh": "", "export_demo.cuh": _DEMO_STUBS}


def test_every_file_of_the_library_is_compiled_by_a_test():
    assert set(library_files()) == {*_ALONE, "wgmma.cuh"}
    assert WGMMA_SOURCE.startswith("#define CF_COLUMNS 256\n")  # its parameters first, from Python


def test_an_include_is_resolved_once():
    text = cuda_library("f16x3.cuh", "gemm_splits.cuh")
    assert text.count("float cf_f16x3_scale(") == 1 and "#include \"" not in text


@pytest.mark.nvcc
@needs_nvcc
@pytest.mark.parametrize("name", sorted(_ALONE))
def test_each_file_compiles_on_its_own(name, tmp_path):
    nvcc_cubin(_ALONE[name] + cuda_library(name), tmp_path)


@pytest.mark.nvcc
@needs_nvcc
def test_the_splits_kernels_keep_their_values_in_registers(tmp_path):
    """gemm_splits.cuh's kernels use no local memory (ptxas's report): an array indexed by a value known
    only at run time (which copy is the lo piece) once put the split's pieces there, and the split took
    several times as long."""
    cu = tmp_path / "splits.cu"
    cu.write_text(cuda_library("gemm_splits.cuh"))
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-O3", "-cubin", "-Xptxas", "-v",
                           "-o", str(tmp_path / "s.cubin"), str(cu)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    frames = re.findall(r"Function properties for (\w+)\n\s+(\d+) bytes stack frame", proc.stderr)
    assert {name for name, _ in frames} >= {"cf_f16x3_row_maxima", "cf_f16x3_maxima",
                                            "cf_split_f16x3_copies", "cf_f16x3_unscale_sums"}
    assert [name for name, size in frames if int(size)] == []
