"""The probes written in CUDA C++ (benchmarks/probes/*.cu) that need no cuBLAS compile: they include the
kernels' own headers (persistent.cuh, f16x3.cuh) and probe_check.cuh, so a change to those that breaks a
probe shows here, not on the GPU machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

PROBES = Path(__file__).resolve().parents[2] / "benchmarks" / "probes"
# the warpgroup instructions need sm_90a
ARCH = {"step_gemm_wgmma_probe.cu": "sm_90a"}

pytestmark = [pytest.mark.slow, pytest.mark.nvcc,
              pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")]


@pytest.mark.parametrize("probe", sorted(p.name for p in PROBES.glob("*.cu")
                                         if "cublas" not in p.read_text()))
def test_a_probe_compiles(probe, tmp_path):
    arch = ARCH.get(probe, "sm_90")
    proc = subprocess.run(["nvcc", "-O3", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-cubin",
                           "-o", str(tmp_path / "probe.cubin"), str(PROBES / probe)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
