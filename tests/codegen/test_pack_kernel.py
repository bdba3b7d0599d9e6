"""The packing kernel (codegen.pack_kernel): its source compiles with nvcc, and its arithmetic (emulated
here in numpy, line by line as the kernel computes each element's places, and tile by tile as
cf_pack_tile copies a transposed part) puts every element where a copy per part would, reading each
source with its strides (a transposed one down its columns)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from compile_cuda import nvcc_cubin

from cellfuse.codegen.kernel_abi import BLOCK, MAX_GRID, grid_blocks
from cellfuse.codegen.pack_kernel import TILE, PackCopy, pack_kernel_source, tiles, total_elements

COPIES = [PackCopy(at=0, ld=8, rows=3, width=2, itemsize=4, row_stride=2, col_stride=1),  # two column
          PackCopy(at=8, ld=8, rows=3, width=6, itemsize=4, row_stride=1, col_stride=3),  # blocks, the 2nd
          PackCopy(at=96, ld=5, rows=1, width=5, itemsize=4, row_stride=10, col_stride=2),  # transposed;
          PackCopy(at=128, ld=4, rows=2, width=4, itemsize=2, row_stride=4, col_stride=1),  # a strided row;
          # transposed parts of more than a tile each way, the last tiles partial, in 32 and 16 bits
          PackCopy(at=160, ld=80, rows=40, width=70, itemsize=4, row_stride=1, col_stride=40),
          PackCopy(at=160 + 40 * 80 * 4, ld=40, rows=70, width=33, itemsize=2, row_stride=1, col_stride=70)]
SIZE = 160 + 40 * 80 * 4 + 70 * 40 * 2


def test_the_kernel_compiles(tmp_path):
    nvcc_cubin(pack_kernel_source(COPIES), tmp_path)
    nvcc_cubin(pack_kernel_source(COPIES[:1]), tmp_path)  # (no transposed part: no tiles)
    nvcc_cubin(pack_kernel_source(COPIES[4:]), tmp_path)  # (transposed parts only: no elements' loop)


def _memory(c: PackCopy, rng):
    """A source's bytes, and its element (r, col) as its strides place it."""
    span = (c.rows * c.row_stride + c.width * c.col_stride) * c.itemsize
    memory = rng.integers(1, 255, span, dtype=np.uint8)

    def element(r, col):
        at = (r * c.row_stride + col * c.col_stride) * c.itemsize
        return memory[at:at + c.itemsize]
    return element


def _tile(c: PackCopy, tile: int):
    """The elements (r, col) cf_pack_tile copies of tile `tile` of c, as its code computes them."""
    tiles_down = (c.rows + TILE - 1) // TILE
    r0, c0 = tile % tiles_down * TILE, tile // tiles_down * TILE
    return [(r, col) for r in range(r0, r0 + TILE) for col in range(c0, c0 + TILE)
            if r < c.rows and col < c.width]


def test_each_element_lands_where_a_copy_per_part_puts_it():
    source = pack_kernel_source(COPIES)
    branches = re.findall(r"if \(e < (\d+)LL\) \{\n\s+const long long k = e - (\d+)LL, (.+?);\n\s+"
                          r"\(\((.+?)\*\)\(packing \+ (\d+)LL\)\)\[r \* (\d+)LL \+ col\] = "
                          r"\(\(const .+?\*\)s(\d+)\)\[r \* (\d+)LL \+ col \* (\d+)LL\]", source)
    tiled = re.findall(r"if \(t < (\d+)LL\) \{\n\s+cf_pack_tile\(\((.+?)\*\)\(packing \+ (\d+)LL\), "
                       r"(\d+)LL, \(const .+?\*\)s(\d+), (\d+), (\d+), (\d+)LL, (\d+)LL, "
                       r"t - (\d+)LL, tile\);", source)
    assert [c.by_columns for c in COPIES] == [False, True, False, False, True, True]
    assert len(branches) == 3 and len(tiled) == 3
    rng = np.random.default_rng(0)
    packing, want = np.zeros(SIZE, np.uint8), np.zeros(SIZE, np.uint8)
    elements = [_memory(c, rng) for c in COPIES]
    for c, element in zip(COPIES, elements, strict=True):  # a copy per part
        for r in range(c.rows):
            for col in range(c.width):
                place = c.at + (r * c.ld + col) * c.itemsize
                want[place:place + c.itemsize] = element(r, col)
    sizes = {"unsigned int": 4, "unsigned short": 2}
    for end, start, place_of, bits, at, ld, i, row_stride, col_stride in branches:  # the kernel's own numbers
        c, element = COPIES[int(i)], elements[int(i)]
        assert sizes[bits] == c.itemsize
        assert (int(row_stride), int(col_stride)) == (c.row_stride, c.col_stride)
        for e in range(int(start), int(end)):
            names = {"k": e - int(start)}
            for assignment in place_of.split(", "):  # "r = k / 2", "col = k - r * 2"
                name, expr = assignment.split(" = ")
                names[name] = eval(expr.replace("/", "//"), {}, names)  # noqa: S307 (the kernel's own text)
            place = int(at) + (names["r"] * int(ld) + names["col"]) * c.itemsize
            packing[place:place + c.itemsize] = element(names["r"], names["col"])
    ends = []
    for end, bits, at, ld, i, rows, width, row_stride, col_stride, start in tiled:
        c, element = COPIES[int(i)], elements[int(i)]
        assert sizes[bits] == c.itemsize and (int(rows), int(width)) == (c.rows, c.width)
        assert (int(row_stride), int(col_stride)) == (c.row_stride, c.col_stride)
        assert int(end) - int(start) == tiles(c)
        ends.append((int(start), int(end)))
        for t in range(int(start), int(end)):
            for r, col in _tile(c, t - int(start)):
                place = int(at) + (r * int(ld) + col) * c.itemsize
                packing[place:place + c.itemsize] = element(r, col)
    assert [s for s, _ in ends] == [0] + [e for _, e in ends[:-1]]  # (the tiles laid end to end)
    assert np.array_equal(packing, want)


def test_the_grid_covers_the_elements_or_strides():
    assert grid_blocks(total_elements(COPIES[:4])) == 1
    big = [PackCopy(0, 2048, 512, 2048, 4, 2048, 1)]
    assert grid_blocks(total_elements(big)) == 512 * 2048 // BLOCK
    assert grid_blocks(total_elements([PackCopy(0, 1 << 16, 1 << 14, 1 << 16, 4, 1 << 16, 1)])) == MAX_GRID


def test_no_copies_is_refused():
    with pytest.raises(ValueError):
        pack_kernel_source([])
