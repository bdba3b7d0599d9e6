"""Compiling generated CUDA with nvcc, for the tests that check it compiles without a warning.

`nvcc_cubin` runs the whole compiler, ptxas too (which assembles inline PTX, allocates registers and
warns of what it finds); `nvcc_ptx` stops at PTX, which checks that the source is valid CUDA that
compiles without a warning, in about half the time. Each nvcc run costs a second or two before it
reads the kernels: put the kernels of a check in one source (`renamed_apart`) rather than run it often."""

from __future__ import annotations

import subprocess


def _nvcc(source: str, tmp_path, output: str, *options: str) -> None:
    cu = tmp_path / "kernels.cu"
    cu.write_text(source)
    proc = subprocess.run(["nvcc", "-arch=sm_90", *options, "-O3", "-Werror", "all-warnings",
                           "-o", str(tmp_path / output), str(cu)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def nvcc_cubin(source: str, tmp_path) -> None:
    """Compiles `source` for sm_90 with every warning an error; fails the test with nvcc's output."""
    _nvcc(source, tmp_path, "kernels.cubin", "-cubin")


def nvcc_ptx(source: str, tmp_path) -> str:
    """Compiles `source` to PTX for sm_90 with every warning an error; fails the test with nvcc's output.
    Gives the PTX. Inline PTX (asm) is copied into it unchecked: ptxas checks it (nvcc_cubin)."""
    _nvcc(source, tmp_path, "kernels.ptx", "-ptx")
    return (tmp_path / "kernels.ptx").read_text()


def renamed_apart(sources: dict[str, str], tag: str) -> list[str]:
    """The kernels of a KernelSet's `sources` with `_tag` after each kernel's name, and after what it names
    after itself (a persistent kernel's exchanges, name_x0, and its blocks per row, name_rows1), so that
    the kernels of several sets go in one source."""
    return [body.replace(name, f"{name}_{tag}") for name, body in sources.items()]
