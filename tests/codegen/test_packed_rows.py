"""The packed rows' kernels (codegen.packed_rows): their source compiles with nvcc for each element size
and the largest capacity, with no memory of a thread's own (the arguments are read where the launch put
them), and the arguments' layout the host writes (gpu_runtime.packed_rows) is the C struct's, field by
field, as nvcc lays it out."""

from __future__ import annotations

import subprocess

import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen.kernel_abi import MAX_GRID
from cellfuse.codegen.packed_rows import (
    ARGS,
    MAX_STEPS,
    MIN_CAPACITY,
    args_fields,
    capacity,
    launch_blocks,
    packed_rows_source,
)
from cellfuse.gpu_runtime.packed_rows import _args_dtype


@pytest.mark.parametrize("itemsize", [2, 4])
def test_the_kernels_compile(tmp_path, itemsize):
    nvcc_cubin(packed_rows_source(itemsize, 128), tmp_path)


def test_the_largest_arguments_stay_where_the_launch_put_them(tmp_path):
    """At MAX_STEPS the arguments take 16 KiB: read through __grid_constant__, no thread copies them."""
    cu = tmp_path / "rows.cu"
    cu.write_text(packed_rows_source(4, MAX_STEPS))
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", "-o",
                           str(tmp_path / "rows.cubin"), str(cu)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    frames = [line for line in proc.stderr.splitlines() if "stack frame" in line]
    assert len(frames) == 2 and all(line.strip().startswith("0 bytes stack frame") for line in frames)


def test_the_hosts_layout_of_the_arguments_is_the_structs(tmp_path):
    steps = 64
    dtype = _args_dtype(steps)
    checks = [f"static_assert(sizeof({ARGS}) == {dtype.itemsize}, \"size\");"]
    for name, _ctype, _count in args_fields(steps):
        checks.append(f"static_assert(offsetof({ARGS}, {name}) == {dtype.fields[name][1]}, \"{name}\");")
    nvcc_cubin("#include <cstddef>\n" + packed_rows_source(4, steps) + "\n".join(checks) + "\n", tmp_path)


def test_capacities_are_few_and_bounded():
    assert [capacity(n) for n in (1, 64, 65, 100, 1000, MAX_STEPS)] == [MIN_CAPACITY, 64, 128, 128, 1024,
                                                                        MAX_STEPS]
    for refused in (0, MAX_STEPS + 1):
        with pytest.raises(ValueError):
            capacity(refused)


def test_a_launch_has_a_warp_a_row_up_to_the_largest_grid():
    assert [launch_blocks(rows) for rows in (0, 1, 8, 9, 6464, 8 * MAX_GRID + 1)] == [1, 1, 1, 2, 808,
                                                                                     MAX_GRID]


def test_elements_of_other_sizes_are_refused():
    with pytest.raises(ValueError):
        packed_rows_source(8, 64)
