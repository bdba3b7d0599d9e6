"""One kernel that copies a module's parameters into their places in the weight buffers, packed side by
side in one piece of memory (the CUDA runner's packing): each place `rows` rows of `width` elements from
a byte of the packing, its rows `ld` elements apart (a column block of a matrix of weights stacked along
N, a bias row, a weight's own buffer); each parameter read with its own strides (the drop-ins' are
transposed views of torch's weights), its elements taken in the order its memory holds them, so that
the reads are coalesced.

After an optimizer's step every training forward packs: one launch copies every part, where a copy of
each (a 2D copy per part: twelve for the LSTM) cost the host about 5 us apiece to issue while the GPU
waited (docs/results/2026-11-29-cellrnn-training-step.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .kernel_abi import BITS_C
from .segment_kernel import segment_kernel

PACK_KERNEL = "cf_pack"


@dataclass(frozen=True)
class PackCopy:
    """A parameter's `rows` x `width` elements of `itemsize` bytes into the packing from byte `at`, the
    rows `ld` elements apart there; element (r, c) of the parameter at `r * row_stride + c * col_stride`
    elements from its start (a contiguous one's: width, 1)."""

    at: int
    ld: int
    rows: int
    width: int
    itemsize: int
    row_stride: int
    col_stride: int

    @property
    def by_columns(self) -> bool:
        """Whether the source holds its columns contiguous (a transposed view): read down them."""
        return self.rows > 1 and self.width > 1 and self.col_stride > self.row_stride

    @property
    def elements(self) -> int:
        return self.rows * self.width


def pack_kernel_source(copies: Sequence[PackCopy]) -> str:
    """`cf_pack(char* packing, const void* source0, ...)`, a source per copy (in their order): a thread per
    element, the grid striding over all of them."""
    if not copies:
        raise ValueError("a packing kernel needs at least one copy")
    sources = ", ".join(f"const void* __restrict__ s{i}" for i in range(len(copies)))
    segments = []
    for i, c in enumerate(copies):
        bits = BITS_C[c.itemsize]
        if c.by_columns:
            place = f"col = k / {c.rows}, r = k - col * {c.rows}"
        else:
            place = f"r = k / {c.width}, col = k - r * {c.width}"
        source = f"((const {bits}*)s{i})[r * {c.row_stride}LL + col * {c.col_stride}LL]"
        store = f"(({bits}*)(packing + {c.at}LL))[r * {c.ld}LL + col] = {source};"
        segments.append((c.elements, place, [store]))
    return segment_kernel(f'extern "C" __global__ void {PACK_KERNEL}(char* __restrict__ packing, {sources})',
                          segments)


def total_elements(copies: Sequence[PackCopy]) -> int:
    """The elements the kernel copies: a thread's work each (kernel_abi.grid_blocks of it)."""
    return sum(c.elements for c in copies)
