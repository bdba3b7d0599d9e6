"""One kernel that copies a module's parameters into their places in the weight buffers, packed side by
side in one piece of memory (the CUDA runner's packing): each place `rows` rows of `width` elements from
a byte of the packing, its rows `ld` elements apart (a column block of a matrix of weights stacked along
N, a bias row, a weight's own buffer); each parameter read with its own strides. A part whose source
holds its columns contiguous (the drop-ins' transposed views of torch's weights) is copied a TILE x TILE
tile at a time by a block, through shared memory, so that both its reads (down the source's columns)
and its writes (along the packing's rows) are coalesced: a thread per element, reading in the source's
order, wrote each warp's 32 elements to 32 rows, and took 35 to 40 us for an LSTM direction's weights at
I=H=512 on an H200 (8 MB). The other parts are copied a thread per element, in the source's order.

After an optimizer's step every training forward packs: one launch copies every part, where a copy of
each (a 2D copy per part: twelve for the LSTM) cost the host about 5 us apiece to issue while the GPU
waited (docs/results/2026-11-29-cellrnn-training-step.md); and a CUDA graph that captures a module's call
packs at every replay.
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


TILE = 32  # a transposed part's tiles: TILE x TILE elements, a block's work each

# a block's copy of tile `tile` of a transposed part (tiles down its rows first): read into shared memory
# a column of the source per warp-row, written out a row of the packing per warp-row
_TILE_COPY = f"""template <typename T>
__device__ __forceinline__ void cf_pack_tile(T* __restrict__ to, long long ld, const T* __restrict__ from,
                                             int rows, int width, long long row_stride, long long col_stride,
                                             long long tile, unsigned int (*shared)[{TILE} + 1]) {{
    const int tiles_down = (rows + {TILE} - 1) / {TILE};
    const int r0 = (int)(tile % tiles_down) * {TILE}, c0 = (int)(tile / tiles_down) * {TILE};
    const int lane = threadIdx.x % {TILE};
    for (int j = threadIdx.x / {TILE}; j < {TILE}; j += blockDim.x / {TILE}) {{
        const int r = r0 + lane, col = c0 + j;
        if (r < rows && col < width) shared[j][lane] = from[r * row_stride + col * col_stride];
    }}
    __syncthreads();
    for (int j = threadIdx.x / {TILE}; j < {TILE}; j += blockDim.x / {TILE}) {{
        const int r = r0 + j, col = c0 + lane;
        if (r < rows && col < width) to[r * ld + col] = (T)shared[lane][j];
    }}
    __syncthreads();  // (before the next tile's reads overwrite it)
}}

"""


def tiles(c: PackCopy) -> int:
    """The TILE x TILE tiles a transposed part is copied in."""
    return -(-c.rows // TILE) * -(-c.width // TILE)


def pack_kernel_source(copies: Sequence[PackCopy]) -> str:
    """`cf_pack(char* packing, const void* source0, ...)`, a source per copy (in their order): the
    transposed parts' tiles a block each, the grid striding over them, then a thread per element of the
    others, the grid striding over all of them. Launched with a block of a multiple of TILE threads."""
    if not copies:
        raise ValueError("a packing kernel needs at least one copy")
    sources = ", ".join(f"const void* __restrict__ s{i}" for i in range(len(copies)))
    segments, tiled, start = [], [], 0
    for i, c in enumerate(copies):
        bits = BITS_C[c.itemsize]
        if c.by_columns:
            end = start + tiles(c)
            tiled += [f"        {'if' if not tiled else '} else if'} (t < {end}LL) {{",
                      f"            cf_pack_tile(({bits}*)(packing + {c.at}LL), {c.ld}LL, "
                      f"(const {bits}*)s{i}, {c.rows}, {c.width}, {c.row_stride}LL, {c.col_stride}LL, "
                      f"t - {start}LL, tile);"]
            start = end
            continue
        place = f"r = k / {c.width}, col = k - r * {c.width}"
        source = f"((const {bits}*)s{i})[r * {c.row_stride}LL + col * {c.col_stride}LL]"
        store = f"(({bits}*)(packing + {c.at}LL))[r * {c.ld}LL + col] = {source};"
        segments.append((c.elements, place, [store]))
    before = [] if not tiled else [
        f"    __shared__ unsigned int tile[{TILE}][{TILE} + 1];",
        f"    for (long long t = blockIdx.x; t < {start}LL; t += gridDim.x) {{", *tiled, "        }", "    }"]
    head = f'extern "C" __global__ void {PACK_KERNEL}(char* __restrict__ packing, {sources})'
    return (_TILE_COPY if tiled else "") + segment_kernel(head, segments, before)


def total_elements(copies: Sequence[PackCopy]) -> int:
    """The elements the kernel copies: a thread's work each (kernel_abi.grid_blocks of it)."""
    return sum(c.elements for c in copies)
