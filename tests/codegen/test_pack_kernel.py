"""The packing kernel (codegen.pack_kernel): its source compiles with nvcc, and its arithmetic (emulated
here in numpy, line by line as the kernel computes each element's places) puts every element where a
copy per part would, reading each source with its strides (a transposed one down its columns)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen.kernel_abi import BLOCK, MAX_GRID, grid_blocks
from cellfuse.codegen.pack_kernel import PackCopy, pack_kernel_source, total_elements

COPIES = [PackCopy(at=0, ld=8, rows=3, width=2, itemsize=4, row_stride=2, col_stride=1),  # two column
          PackCopy(at=8, ld=8, rows=3, width=6, itemsize=4, row_stride=1, col_stride=3),  # blocks, the 2nd
          PackCopy(at=96, ld=5, rows=1, width=5, itemsize=4, row_stride=10, col_stride=2),  # transposed;
          PackCopy(at=128, ld=4, rows=2, width=4, itemsize=2, row_stride=4, col_stride=1)]  # a strided row


def test_the_kernel_compiles(tmp_path):
    nvcc_cubin(pack_kernel_source(COPIES), tmp_path)


def test_each_element_lands_where_a_copy_per_part_puts_it():
    source = pack_kernel_source(COPIES)
    branches = re.findall(r"if \(e < (\d+)LL\) \{\n\s+const long long k = e - (\d+)LL, (.+?);\n\s+"
                          r"\(\((.+?)\*\)\(packing \+ (\d+)LL\)\)\[r \* (\d+)LL \+ col\] = "
                          r"\(\(const .+?\*\)s\d+\)\[r \* (\d+)LL \+ col \* (\d+)LL\]", source)
    assert len(branches) == len(COPIES)
    assert [c.by_columns for c in COPIES] == [False, True, False, False]
    rng = np.random.default_rng(0)
    packing, want = np.zeros(160, np.uint8), np.zeros(160, np.uint8)
    for i, c in enumerate(COPIES):
        size = c.itemsize
        memory = rng.integers(1, 255, (c.rows * c.row_stride + c.width * c.col_stride) * size, dtype=np.uint8)

        def element(r, col, c=c, memory=memory, size=size):
            at = (r * c.row_stride + col * c.col_stride) * size
            return memory[at:at + size]
        for r in range(c.rows):  # a copy per part
            for col in range(c.width):
                place = c.at + (r * c.ld + col) * size
                want[place:place + size] = element(r, col)
        end, start, place_of, bits, at, ld, row_stride, col_stride = branches[i]  # the kernel's own numbers
        assert {"unsigned int": 4, "unsigned short": 2}[bits] == size
        assert (int(row_stride), int(col_stride)) == (c.row_stride, c.col_stride)
        for e in range(int(start), int(end)):
            k = e - int(start)
            names = {"k": k}
            for assignment in place_of.split(", "):  # "r = k / 2", "col = k - r * 2" or by columns
                name, expr = assignment.split(" = ")
                names[name] = eval(expr.replace("/", "//"), {}, names)  # noqa: S307 (the kernel's own text)
            place = int(at) + (names["r"] * int(ld) + names["col"]) * size
            packing[place:place + size] = element(names["r"], names["col"])
    assert np.array_equal(packing, want)


def test_the_grid_covers_the_elements_or_strides():
    assert grid_blocks(total_elements(COPIES)) == 1
    big = [PackCopy(0, 2048, 512, 2048, 4, 2048, 1)]
    assert grid_blocks(total_elements(big)) == 512 * 2048 // BLOCK
    assert grid_blocks(total_elements([PackCopy(0, 1 << 16, 1 << 14, 1 << 16, 4, 1 << 16, 1)])) == MAX_GRID


def test_no_copies_is_refused():
    with pytest.raises(ValueError):
        pack_kernel_source([])
