"""Compiling generated CUDA with nvcc, for the tests that check it compiles without a warning."""

from __future__ import annotations

import subprocess


def nvcc_cubin(source: str, tmp_path) -> None:
    """Compiles `source` for sm_90 with every warning an error; fails the test with nvcc's output."""
    cu = tmp_path / "kernels.cu"
    cu.write_text(source)
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Werror", "all-warnings",
                           "-o", str(tmp_path / "kernels.cubin"), str(cu)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr
