"""The packing kernel (codegen.pack_kernel): its source compiles with nvcc, and its arithmetic (emulated
here in numpy, line by line as the kernel computes each element's place) puts every element where a
copy per part would."""

from __future__ import annotations

import re

import numpy as np
import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen.pack_kernel import MAX_BLOCKS, PACK_BLOCK, PackCopy, pack_grid, pack_kernel_source

COPIES = [PackCopy(at=0, ld=8, rows=3, width=2, itemsize=4),  # two column blocks of one matrix
          PackCopy(at=8, ld=8, rows=3, width=6, itemsize=4),
          PackCopy(at=96, ld=5, rows=1, width=5, itemsize=4),  # a bias row
          PackCopy(at=128, ld=4, rows=2, width=4, itemsize=2)]  # a 16-bit buffer


def test_the_kernel_compiles(tmp_path):
    nvcc_cubin(pack_kernel_source(COPIES), tmp_path)


def test_each_element_lands_where_a_copy_per_part_puts_it():
    source = pack_kernel_source(COPIES)
    branches = re.findall(r"if \(e < (\d+)LL\) \{\n\s+const long long k = e - (\d+)LL, r = k / (\d+), "
                          r"col = k - r \* (\d+);\n\s+\(\((.+?)\*\)\(packing \+ (\d+)LL\)\)"
                          r"\[r \* (\d+)LL \+ col\]", source)
    assert len(branches) == len(COPIES)
    packing = np.zeros(160, np.uint8)
    want = np.zeros(160, np.uint8)
    rng = np.random.default_rng(0)
    sources = [rng.integers(1, 255, c.elements * c.itemsize, dtype=np.uint8) for c in COPIES]
    for c, src in zip(COPIES, sources, strict=True):  # a copy per part
        rows = src.reshape(c.rows, c.width * c.itemsize)
        for r in range(c.rows):
            at = c.at + r * c.ld * c.itemsize
            want[at:at + c.width * c.itemsize] = rows[r]
    for i, (end, start, width, _, bits, at, ld) in enumerate(branches):  # the kernel's own numbers
        size = {"unsigned int": 4, "unsigned short": 2}[bits]
        for e in range(int(start), int(end)):
            k = e - int(start)
            r, col = divmod(k, int(width))
            place = int(at) + (r * int(ld) + col) * size
            packing[place:place + size] = sources[i][k * size:(k + 1) * size]
    assert np.array_equal(packing, want)


def test_the_grid_covers_the_elements_or_strides():
    assert pack_grid(COPIES) == 1
    big = [PackCopy(0, 2048, 512, 2048, 4)]
    assert pack_grid(big) == 512 * 2048 // PACK_BLOCK
    assert pack_grid([PackCopy(0, 1 << 16, 1 << 14, 1 << 16, 4)]) == MAX_BLOCKS


def test_no_copies_is_refused():
    with pytest.raises(ValueError):
        pack_kernel_source([])
