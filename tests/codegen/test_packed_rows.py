"""The packed rows' kernels (codegen.packed_rows): their source compiles with nvcc for each element size
and the largest capacity, with no memory of a thread's own (the arguments are read where the launch put
them), and the arguments' layouts the host describes (gpu_runtime.packed_rows' structs) are the C
structs', field by field, as nvcc lays them out. (quick_lane.cpp writes its own heads: their sizes are
checked here, their fields by tests/nn/test_quick_lane.py.)"""

from __future__ import annotations

import ctypes
import subprocess

import numpy as np
import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen.kernel_abi import MAX_GRID
from cellfuse.codegen.packed_rows import (
    ARGS,
    LENGTHS_ARGS,
    MAX_STEPS,
    MIN_CAPACITY,
    args_fields,
    capacity,
    launch_blocks,
    lengths_args_fields,
    packed_rows_source,
)
from cellfuse.gpu_runtime import driver
from cellfuse.gpu_runtime.packed_rows import PackedRows, args_struct


@pytest.mark.parametrize("itemsize", [2, 4])
def test_the_kernels_compile(tmp_path, itemsize):
    nvcc_cubin(packed_rows_source(itemsize, 128), tmp_path)


def test_the_largest_arguments_stay_where_the_launch_put_them(tmp_path):
    """At MAX_STEPS the arguments take 16 KiB: read through __grid_constant__, no thread of any of the four
    kernels copies them."""
    cu = tmp_path / "rows.cu"
    cu.write_text(packed_rows_source(4, MAX_STEPS))
    proc = subprocess.run(["nvcc", "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", "-o",
                           str(tmp_path / "rows.cubin"), str(cu)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    frames = [line for line in proc.stderr.splitlines() if "stack frame" in line]
    assert len(frames) == 4 and all(line.strip().startswith("0 bytes stack frame") for line in frames)


def test_the_hosts_layout_of_the_arguments_is_the_structs(tmp_path):
    steps, checks = 64, []
    for struct_name, fields, lengths in ((ARGS, args_fields(steps), False),
                                         (LENGTHS_ARGS, lengths_args_fields(steps), True)):
        size = args_struct(steps, lengths=lengths).size
        checks.append(f"static_assert(sizeof({struct_name}) == {size}, \"size\");")
        for n, (name, _ctype, _count) in enumerate(fields):
            at = args_struct(steps, n, lengths).size
            checks.append(f"static_assert(offsetof({struct_name}, {name}) == {at}, \"{name}\");")
    # (quick_lane.cpp writes cf_zero_rows's head as a struct of its own, 64 bytes, then the lengths)
    assert args_struct(steps, len(lengths_args_fields(steps)) - 1, True).size == 64
    nvcc_cubin("#include <cstddef>\n" + packed_rows_source(4, steps) + "\n".join(checks) + "\n", tmp_path)


def test_a_launch_carries_its_batchs_sizes_and_its_own_fields(monkeypatch):
    """What the driver is given: the arguments' bytes with the batch's sizes and offsets, T, B and the
    launch's own addresses and counts (here a padding with the steps-left state, then a packing)."""
    steps, launches = 64, []

    def launch(function, blocks, threads, stream, table, doing):
        address = np.frombuffer(bytes((ctypes.c_char * 8).from_address(table)), np.uint64)[0]
        launches.append((function, blocks, stream, ctypes.string_at(int(address), args_struct(steps).size)))

    monkeypatch.setattr(driver, "launch", launch)
    rows = PackedRows.__new__(PackedRows)
    rows._unpack, rows._pack, rows.capacity, rows.what = 11, 12, steps, "the kernels"
    a = rows.rows_args(np.array([3, 3, 2, 1]))
    assert (a.T, a.B, a.rows) == (4, 3, 9)
    rows.unpack(1000, 2000, 3000, a, 8, 5, 6, 1, 77)
    rows.pack(4000, 5000, a, 5, 78)
    fields = [name for name, _, _ in args_fields(steps)]
    (f0, blocks0, s0, raw0), (f1, _, s1, raw1) = launches
    assert (f0, s0, f1, s1) == (11, 77, 12, 78) and blocks0 == launch_blocks(8 * 3 + 3)
    for raw, head in ((raw0, (1000, 2000, 3000, 8 * 3 * 5, 3 * 6, 4, 3, 5, 6)),
                      (raw1, (4000, 5000, 0, 9 * 5, 0, 4, 3, 5, 0))):
        values = args_struct(steps).unpack(raw)
        assert dict(zip(fields[:9], values[:9], strict=True)) == dict(zip(fields[:9], head, strict=True))
        assert list(values[9:13]) == [3, 3, 2, 1] and list(values[9 + steps:9 + steps + 4]) == [0, 3, 6, 8]
        assert not any(values[13:9 + steps]) and not any(values[9 + steps + 4:])
    with pytest.raises(ValueError, match=f"{steps + 1} steps do not fit"):
        rows.rows_args(np.ones(steps + 1, np.int64))


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
