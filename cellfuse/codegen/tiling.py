"""How the threads of a persistent kernel's block share a GEMM (`GemmTiling`), and how the parts of its
shared memory are laid out (`SharedRegions`): decided by the planner (see `persistent`), recorded in the
Plan, read by the emitter."""

from __future__ import annotations

from dataclasses import dataclass

# Threads per block of a persistent kernel: faster than 128 or 512 at every size measured
# (benchmarks/results/h100_2026-11-23_persistent_threads.txt)
THREADS = 256
WARPS = THREADS // 32
REGISTER_COLS = 16  # a block's columns of a GEMM, at most, held in registers for products one row at a time
# Registers a thread gives W's fragments, at most, over all of a kernel's GEMMs on tensor cores that keep
# them there (see persistent_cuda.gemm_mma.fragments). The bf16 LSTM's forward at B=64 uses 166 registers
# without them, 232 with 64 (8 of a warp's 16 iterations over K), 250 with 96 (12): 0.377 ms with 64,
# 0.365 with 96 on an H200 (benchmarks/results/h200_2026-12-01_fragment_registers_96_ab.txt); with 128
# it spills. At B=256 96 spill, and the kernel is written again with 64 (gpu_runtime.kernel_cache.REWRITES).
FRAGMENT_REGISTERS = 96


@dataclass(frozen=True)
class GemmTiling:
    """How the threads of a block share its part of a GEMM, C[rows, cols] = A[rows, K] @ W[K, cols], with
    A (a tile of rows) and W both in shared memory, K contiguous: each output thread holds a register
    tile of `rows_per_thread` consecutive rows by `cols_per_thread` consecutive columns, and `k_split`
    neighbouring lanes share each tile's sum over K, four k at a time (float4 loads), adding their
    partial sums with warp shuffles at the end.

    With one row at a time (`in_registers`: a batch of one, as a row tile), each thread instead holds
    two k of the operand's row, the first it polls or loads, and its two rows of the block's columns of W
    in registers (all `cols_per_thread` of them, a power of two, the columns past the block's zero): it
    multiplies them as soon as its values come, each warp adds its lanes' products by shuffles, and the
    elementwise work reads the sum of the warps' partial rows from shared memory (`output_floats`): one
    barrier after the products instead of the stage's two and C's (on an H100 the LSTM's and the GRU's
    persistent kernels at B=1 took less time this way:
    docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md, change 16).

    On tensor cores (`mma`), each warp holds a tile of C instead, 16 rows by `cols_per_thread` (eight
    columns for each of its `mma.sync` products; the `*_threads` count tiles), and `k_split` warps share
    each tile's sum over K, sixteen k at a time, adding their partial tiles through shared memory
    (`mma_floats`). The operand is staged `k_chunk` columns of K at a time, the warps' partial tiles
    kept in shared memory from one chunk to the next, so that a long K (a backward step's 4H) leaves
    room for the weights. Float32 products there are three fp16 ones each (`f16x3`, f16x3.cuh's
    cf_split_f16x3), over values scaled per row (each warp its own, over its share of the chunk) and per
    column of W (kept in shared memory beside W)."""

    cols: int  # the block's columns of the GEMM, over all its stacked weights
    rows_per_thread: int
    cols_per_thread: int
    k_split: int  # a power of two, at most a warp
    col_threads: int
    row_threads: int
    mma: bool = False
    k_chunk: int = 0  # columns of K staged at a time (0: all of K)
    in_registers: bool = False
    # bytes of an on-chip weight: 2 on tensor cores in a 16-bit plan, whose weights are kept in its type
    # (rounded once as they are loaded, where float32 ones were rounded at every step's product)
    w_itemsize: int = 4
    f16x3: bool = False

    @property
    def output_stride(self) -> int:
        """Floats per row of the block's part of the output in shared memory (of products in registers,
        each warp's partial sums of the padded columns, warp after warp)."""
        return WARPS * self.cols_per_thread if self.in_registers else self.cols

    @property
    def padded_cols(self) -> int:  # the rows of the on-chip (transposed) weights
        return self.col_threads * self.cols_per_thread

    @property
    def padded_rows(self) -> int:  # the rows of the staged operand
        return self.row_threads * self.rows_per_thread

    @property
    def output_threads(self) -> int:
        return self.col_threads * self.row_threads

    def stage_stride(self, k: int) -> int:
        """Floats per staged row of the operand (of a GEMM with K = k)."""
        return self.w_stride(self.k_chunk or k)

    def w_stride(self, k: int) -> int:
        """Elements per row of the on-chip (transposed) weights, K contiguous (of a GEMM with K = k)."""
        return mma_stride(k) if self.mma else k_stride(k)

    def w_floats(self, k: int) -> int:
        """Shared memory for the block's on-chip weights (and their columns' scales), in floats, whole 32
        bytes (see `whole32`)."""
        scales = whole32(self.padded_cols) if self.f16x3 else 0
        return whole32(-(-self.padded_cols * self.w_stride(k) * self.w_itemsize // 4)) + scales

    @property
    def mma_floats(self) -> int:
        """Shared memory for the warps' partial tiles of C, on tensor cores."""
        if not self.mma:
            return 0
        return self.output_threads * self.k_split * self.rows_per_thread * self.cols_per_thread


MMA_M, MMA_N = 16, 8  # the tile of C of one mma.sync product
# K of one mma.sync product (m16n8k16), read at a time by a warp on tensor cores: each lane's operands one
# float4 of a row (the k of a product taken in the order that makes them so: any order gives the same sum)
MMA_K_BLOCK = 16
# columns of K staged at a time on tensor cores, the choices, narrowest first: the placement of the weights
# assumes the first, and each GEMM then stages the widest that fits beside them (the backward step's K =
# 4H = 2048 at B=64 in chunks of 1024 instead of 512: 6.0 us a step instead of 8.1, fewer barriers and
# chunk epilogues; benchmarks/results/h200_2026-11-30_chunked_staging_probe_cf1c18d.txt)
MMA_K_CHUNKS = (512, 1024, 2048, 4096)
# the products side by side in a warp's tile of C, the choices (3 and 6: a GRU block's 3 * 2^n columns)
MMA_COL_TILES = (1, 2, 3, 4, 6, 8)


def output_floats(rows: int, tiling: GemmTiling) -> int:
    """Shared memory for a block's part of a GEMM's output (of products in registers, each warp's partial
    sums of it), in whole 32 bytes: what follows it in shared memory is read as float4s or as tensor-core
    fragments (which start 32-byte aligned)."""
    return 8 * -(-rows * tiling.output_stride // 8)


def k_stride(k: int) -> int:
    """Floats per row of a K-contiguous array in shared memory: K in whole float4s, and one float4 more,
    so that lanes reading the same k of neighbouring rows fall in different banks. It holds K in whole
    eights too (the zeros past K), as tensor cores read it."""
    return 4 * (-(-k // 4)) + 4


def mma_stride(k: int) -> int:
    """Elements per row of a K-contiguous array that tensor cores read: K in an odd number of whole
    MMA_K_BLOCKs (one more where it is even), so that the eight lanes of a float4 load (two rows, four
    float4s of each) fall in different banks, the second row's in the other half of them; of 16-bit
    elements, the sixteen lanes of each half-warp's 8-byte loads (four rows 32 bytes apart in the banks,
    four loads of each) as well."""
    blocks = -(-k // MMA_K_BLOCK)
    return MMA_K_BLOCK * (blocks if blocks % 2 else blocks + 1)


def gemm_tiling(columns: tuple[int, ...], blocks: int, row_tile: int, k: int,
                mma: bool = False, partials: bool = False, w_itemsize: int = 4,
                f16x3: bool = False, k_chunk: int = MMA_K_CHUNKS[0]) -> GemmTiling:
    """The cheapest tiling by a simple count: the float4 loads and FMAs of the busiest thread, and its
    shuffles. On tensor cores: the warp tiles' width and the warps on each tile that cost the busiest
    warp the fewest loads and products, leaving no warp idle that could share a tile's K. With one row
    at a time, the products in registers where they fit and the elementwise work may read the output as
    partial sums (`partials`: W and C on chip, no bias, nothing added into C). `w_itemsize`: of the
    weights on tensor cores; `f16x3`: float32 products there, as three fp16 ones; `k_chunk`: the most
    columns of K staged at a time there."""
    cols = sum(-(-w // blocks) for w in columns)
    if partials and not mma and row_tile == 1 and k % 2 == 0 and k <= 2 * THREADS and cols <= REGISTER_COLS:
        width = 1 << (cols - 1).bit_length()
        return GemmTiling(cols, 1, width, 32, 1, 1, in_registers=True)
    if mma:
        chunk = min(k, k_chunk)
        n_tiles, rt, kb = -(-cols // MMA_N), -(-row_tile // MMA_M), -(-chunk // MMA_K_BLOCK)
        best = None
        for nb in MMA_COL_TILES:
            if nb > 1 and nb > n_tiles:
                continue
            ct = -(-n_tiles // nb)
            split = 1
            while split < WARPS and ct * rt * split * 2 <= WARPS and split * 2 <= kb:
                split *= 2
            units = -(-ct * rt * split // WARPS)  # warp tiles of the busiest warp
            # per K_BLOCK: two float4s of A and one of W per product column, three fp16 products each (a
            # 16-bit plan's one weighed the same); then the sums of the split warps' partial tiles
            cost = (units * -(-kb // split) * (2 + nb + 3 * nb)
                    + ct * rt * split * MMA_M * nb * MMA_N // THREADS)
            if best is None or cost < best[0]:
                best = (cost, GemmTiling(cols, MMA_M, MMA_N * nb, split, ct, rt, mma=True, k_chunk=chunk,
                                         w_itemsize=w_itemsize, f16x3=f16x3))
        return best[1]
    k4 = -(-k // 4)
    best = None
    for tr in (1, 2, 4, 8):
        for tc in (1, 2, 3, 4):  # 3: a GRU's 3 gates give its blocks 3 * 2^n columns, 4 would idle threads
            if tr > 1 and tr > row_tile or tc > 1 and tc > cols:
                continue
            ct, rt = -(-cols // tc), -(-row_tile // tr)
            outputs = ct * rt
            split = 1
            while split < 32 and outputs * split * 2 <= THREADS:
                split *= 2
            tiles = -(-outputs // (THREADS // split))  # output tiles per thread
            iters = tiles * -(-k4 // split)
            cost = iters * (4 * tr * tc + 8 * (tr + tc)) + tiles * tr * tc * 2 * split.bit_length()
            key = (cost, tr * tc)
            if best is None or key < best[0]:
                best = (key, GemmTiling(cols, tr, tc, split, ct, rt))
    return best[1]


def whole32(floats: int) -> int:
    """Floats in whole 32 bytes: each part of a persistent kernel's shared memory starts 32-byte aligned,
    as tensor-core fragments must."""
    return 8 * -(-floats // 8)


@dataclass(frozen=True)
class SharedRegions:
    """Where each part of a persistent kernel's dynamic shared memory starts, in floats, each 32-byte
    aligned (see `whole32`): the staged rows of a GEMM's operand from 0 (`stage` floats), then per GEMM
    (by its item's index) its on-chip weights and its on-chip output, then the warps' partial tiles of the
    GEMMs on tensor cores (`mma`, where any has them)."""

    stage: int
    weights: tuple[tuple[int, int], ...]  # (item index, where its weights start)
    outputs: tuple[tuple[int, int], ...]  # (item index, where its output starts)
    mma: int | None
    floats: int  # in all

    def weights_at(self, item: int) -> int:
        return dict(self.weights)[item]

    def output_at(self, item: int) -> int:
        return dict(self.outputs)[item]
