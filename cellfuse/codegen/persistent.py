"""The persistent schedule of a layer: where its grid-wide barriers go, how its blocks share the columns,
which recurrent weights stay in shared memory, and how much of it each block needs.

One cooperative launch runs every step of a layer. Each block owns the same slice of every width (see
`owned`), so elementwise work touches only what its own block wrote and needs no barrier. The shared
reads are a GEMM's whole operand, written by every block, and everything that a kernel with row
reductions reads and writes: it runs a block per row, every column, so that a row's sums need no other
block. A barrier therefore goes before a launch whose shared reads were written since the last barrier
(looking across the step's end, since step t reads what step t-1 wrote), and before anything that
overwrites them ahead of its step's first barrier (a block still reading the previous step's value could
otherwise see the new one). LSTM and GRU get one barrier per step, Cho's GRU and MGU two (their second
GEMM reads r*h, computed in the step), a cell whose step reduces rows after its GEMM two (the GEMM's
output, then the new state, cross between blocks), and a cell without a recurrent GEMM none. Where every
barrier is there for a GEMM's operand, the forward step needs none of them: the operand goes through an
exchange (see `exchanges`), and the block waits for the values it reads instead of for every block; a
step that ends with a block per row writing the operand keeps the barrier before it, and only that one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .cuda_kernels import row_sums
from .plan import (
    Access,
    Exchange,
    GemmLaunch,
    KernelLaunch,
    PersistentItem,
    PersistentLaunch,
    Target,
    row_offset,
)

THREADS = 256  # per block of a persistent kernel: faster than 128 or 512 at every size measured
ROW_TILE = 64  # rows of a GEMM's left operand staged in shared memory at a time, at most
ROW_GROUPS = (8, 4, 2, 1)  # the ways to split the batch between blocks, most first
MIN_GROUP_ROWS = 8  # rows of a group, at least: fewer would not fill a block's threads
REGISTER_COLS = 16  # a block's columns of a GEMM, at most, held in registers for products one row at a time
EXCHANGE_BYTES = 64 * 2**20  # of a persistent kernel's exchanges, at most (two slots of 8-byte pairs)
# The bytes an exchange's (tag, value) pairs add to a step's reads from L2 (its readers' rows of the
# operand, 4 more bytes a value), per grid-wide barrier it takes away, at most. Measured on an H100,
# exchanges against barriers: 2 and 4 MiB a wait gained 8% and 12% (the MGU's backward, the LSTM's
# forward, B=64), 6 MiB broke even (the GRU's backward, B=64), 8 MiB lost 3% (the LSTM's backward, B=8),
# 16 MiB 7% and 10% (the LSTM's forward at B=256, its backward at B=64), 32 MiB 15% (its forward at
# H=1024, B=64).
EXCHANGE_BYTES_PER_WAIT = 6 * 2**20


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
    barrier after the products instead of the stage's two and C's (on an H100, the LSTM's persistent
    kernel at B=1 0.120 -> 0.095 ms, the GRU's 0.113 -> 0.100).

    On tensor cores (`mma`), each warp holds a tile of C instead, 16 rows by `cols_per_thread` (eight
    columns for each of its `mma.sync` products; the `*_threads` count tiles), and `k_split` warps share
    each tile's sum over K, sixteen k at a time, adding their partial tiles through shared memory
    (`mma_floats`). The operand is staged `k_chunk` columns of K at a time, the warps' partial tiles
    kept in shared memory from one chunk to the next, so that a long K (a backward step's 4H) leaves
    room for the weights."""

    cols: int  # the block's columns of the GEMM, over all its stacked weights
    rows_per_thread: int
    cols_per_thread: int
    k_split: int  # a power of two, at most a warp
    col_threads: int
    row_threads: int
    mma: bool = False
    k_chunk: int = 0  # columns of K staged at a time (0: all of K)
    in_registers: bool = False

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
        """Floats per row of the on-chip (transposed) weights, K contiguous (of a GEMM with K = k)."""
        return mma_stride(k) if self.mma else k_stride(k)

    @property
    def mma_floats(self) -> int:
        """Shared memory for the warps' partial tiles of C, on tensor cores."""
        if not self.mma:
            return 0
        return self.output_threads * self.k_split * self.rows_per_thread * self.cols_per_thread


MMA_M, MMA_N, MMA_K = 16, 8, 8  # the tile of C and the K of one mma.sync product on TF32 operands
# K read at a time by a warp on tensor cores: two products, each lane's operands of both one float4 of a
# row (the k of a product taken in the order that makes them so: any order gives the same sum)
MMA_K_BLOCK = 16
MMA_K_CHUNK = 512  # columns of K staged at a time on tensor cores, at most
# the products side by side in a warp's tile of C, the choices (3 and 6: a GRU block's 3 * 2^n columns)
MMA_COL_TILES = (1, 2, 3, 4, 6, 8)
WARPS = THREADS // 32


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
    """Floats per row of a K-contiguous array that tensor cores read: K in whole MMA_K_BLOCKs, and one
    more, so that the eight lanes of a float4 load (two rows, four float4s of each) fall in different
    banks."""
    return MMA_K_BLOCK * (-(-k // MMA_K_BLOCK) + 1)


def gemm_tiling(columns: tuple[int, ...], blocks: int, row_tile: int, k: int,
                mma: bool = False, partials: bool = False) -> GemmTiling:
    """The cheapest tiling by a simple count: the float4 loads and FMAs of the busiest thread, and its
    shuffles. On tensor cores: the warp tiles' width and the warps on each tile that cost the busiest
    warp the fewest loads and products, leaving no warp idle that could share a tile's K. With one row
    at a time, the products in registers where they fit and the elementwise work may read the output as
    partial sums (`partials`: W and C on chip, no bias, nothing added into C)."""
    cols = sum(-(-w // blocks) for w in columns)
    if partials and not mma and row_tile == 1 and k % 2 == 0 and k <= 2 * THREADS and cols <= REGISTER_COLS:
        width = 1 << (cols - 1).bit_length()
        return GemmTiling(cols, 1, width, 32, 1, 1, in_registers=True)
    if mma:
        chunk = min(k, MMA_K_CHUNK)
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
            # per K_BLOCK: two float4s of A and one of W per product column, two products each, three
            # TF32 products for each; then the sums of the split warps' partial tiles
            cost = (units * -(-kb // split) * (2 + nb + 6 * nb)
                    + ct * rt * split * MMA_M * nb * MMA_N // THREADS)
            if best is None or cost < best[0]:
                best = (cost, GemmTiling(cols, MMA_M, MMA_N * nb, split, ct, rt, mma=True, k_chunk=chunk))
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


@dataclass(frozen=True)
class _Placed:
    """A GEMM of the step and what of it stays in shared memory."""

    launch: GemmLaunch
    columns: tuple[int, ...]
    weights: bool  # its block's columns of W
    output: bool  # its block's columns of C, for every row of the batch
    mma: bool = False  # on tensor cores, which read W from shared memory only

    def tiling(self, blocks: int, row_tile: int) -> GemmTiling:
        return gemm_tiling(self.columns, blocks, row_tile, self.launch.k, self.mma, self.partials)

    @property
    def partials(self) -> bool:
        """Whether the elementwise work may read its output as the warps' partial sums that it adds up:
        W and C on chip, C neither biased nor added into."""
        return self.weights and self.output and not self.launch.bias and not self.launch.accumulate


def _smem_floats(gemms: list[_Placed], blocks: int, row_tile: int, rows: int) -> int:
    """Shared memory of a persistent kernel, in floats: the staged rows of the largest GEMM operand, what
    of each GEMM stays on chip (its output for the block's `rows` rows), and the partial tiles of the
    GEMM on tensor cores that has the most; `blocks` share the columns."""
    tilings = [p.tiling(blocks, row_tile) for p in gemms]
    total = max((whole32(t.padded_rows * t.stage_stride(p.launch.k))
                 for p, t in zip(gemms, tilings, strict=True)), default=0)
    for p, tiling in zip(gemms, tilings, strict=True):
        total += p.weights * whole32(tiling.padded_cols * tiling.w_stride(p.launch.k))
        total += p.output * output_floats(rows, tiling)
    return total + max((t.mma_floats for t in tilings), default=0)


def whole32(floats: int) -> int:
    """Floats in whole 32 bytes: each part of a persistent kernel's shared memory starts 32-byte aligned,
    as tensor-core fragments must."""
    return 8 * -(-floats // 8)


def written(launch: GemmLaunch | KernelLaunch) -> list[Access]:
    """Where a launch of the step writes."""
    match launch:
        case GemmLaunch():
            return [launch.c]
        case KernelLaunch():
            return [acc for _, acc in launch.outputs]
        case _:
            raise TypeError(f"unknown launch {launch!r}")


def writes(launch: GemmLaunch | KernelLaunch) -> set[str]:
    """The buffers a launch of the step writes."""
    return {acc.buffer for acc in written(launch)}


def reads(launch: GemmLaunch | KernelLaunch) -> set[str]:
    """The buffers a launch of the step reads."""
    match launch:
        case GemmLaunch():
            return {launch.a.buffer, launch.w, *([launch.bias] if launch.bias else [])}
        case KernelLaunch():
            return {acc.buffer for _, acc in launch.inputs}
        case _:
            raise TypeError(f"unknown launch {launch!r}")


def shared_reads(launch: GemmLaunch | KernelLaunch, step: list[GemmLaunch | KernelLaunch]) -> list[Access]:
    """What a launch of the step reads where other blocks wrote it: a GEMM's left operand (all of K of
    its rows); a value of one number per row (written by the block that owns the first column); what
    a kernel that reduces rows (a block per row) reads of what the others write, and they of what it
    writes. A kernel of [N] and scalar values reads only values that every block computes alike."""
    match launch:
        case GemmLaunch():
            return [launch.a]
        case KernelLaunch():
            by_rows = launch.reduces_rows
            other = set().union(*(writes(o) for o in step
                                  if isinstance(o, KernelLaunch) and o.row_kind != "one"
                                  and o.reduces_rows != by_rows or by_rows and isinstance(o, GemmLaunch)))
            # (what it adds to, it reads: a backward kernel's gradients)
            read = [*launch.inputs, *((v, acc) for v, acc in launch.outputs if launch.adds(acc))]
            return [acc for _, acc in read if acc.kind == "col" or acc.buffer in other]
        case _:
            raise TypeError(f"unknown launch {launch!r}")


def initial_states_barrier(launch: PersistentLaunch) -> bool:
    """Whether the blocks meet at a grid-wide barrier between their copies of the initial states (each
    its own elements, as its elementwise work owns them) and the first step: where, before the step's
    first barrier, a block reads elements of a state that other blocks copied (a GEMM all of K of its
    operand, a kernel that reduces rows whole rows). With exchanges there is one anyway: the initial
    values they publish, read from the copies, are behind one."""
    if launch.exchange:
        return False
    states = {state.read.buffer for state in launch.states}
    for item in launch.items:
        if launch.grid_barrier(item):
            return False
        if (item.by_rows or isinstance(item.launch, GemmLaunch)) and reads(item.launch) & states:
            return True
    return False


def final_states_barrier(launch: PersistentLaunch) -> bool:
    """Whether the blocks meet at a grid-wide barrier between the last step and their copies of the final
    states: where a kernel that reduces rows (whole rows, other blocks' elements) wrote a state."""
    states = {state.read.buffer for state in launch.states}
    return any(item.by_rows and writes(item.launch) & states for item in launch.items)


def independent_blocks(launch: PersistentLaunch) -> bool:
    """Whether no block of the launch ever waits for another (no grid-wide barrier, no exchange): each owns
    its elements for every step, as in a recurrence of elementwise work only (IndRNN's). Such a launch
    needs not all its blocks resident at once, so it is an ordinary launch, which may start while the
    kernel before it ends (programmatic dependent launch: see cuda_persistent's `PDL_WAIT`)."""
    return not (launch.waits_per_step or launch.exchange or initial_states_barrier(launch)
                or final_states_barrier(launch))


STEP_SLOTS = ("t", "t+1", "t%2", "(t+1)%2")  # the slots whose rows move with the step


def overtakes(write: Access, read: Access, reverse: bool) -> bool:
    """Whether a block's write at one step may land where a slower block still reads in the step before
    it (the step after, in a reverse loop): the same buffer, and rows that meet at some step, unless both
    accesses move with the step to rows that never do."""
    if write.buffer != read.buffer:
        return False
    if write.slot not in STEP_SLOTS or read.slot not in STEP_SLOTS:
        return True
    return any(row_offset(write.slot, t, 1) == row_offset(read.slot, t + (1 if reverse else -1), 1)
               for t in (10, 11))  # an even step and an odd one cover the two-slot rules


def barriers(step: list[GemmLaunch | KernelLaunch], reverse: bool = False) -> list[bool]:
    """For each launch of the step, in order, whether a grid-wide barrier goes before it. `reverse`: the
    steps run from the last to the first."""
    barrier = [False] * len(step)
    reads = [shared_reads(launch, step) for launch in step]
    operands = [acc for accesses in reads for acc in accesses]
    changed = True
    while changed:
        changed = False
        dirty: set[str] = set()
        for _ in range(2):  # twice round: a step's first reads are of what the step before wrote last
            for i, launch in enumerate(step):
                if {acc.buffer for acc in reads[i]} & dirty and not barrier[i]:
                    barrier[i] = changed = True
                if barrier[i]:
                    dirty.clear()
                dirty |= writes(launch)
        first = barrier.index(True) if True in barrier else len(step)
        for i in range(first):
            if any(overtakes(w, r, reverse) for w in written(step[i]) for r in operands):
                barrier[i] = changed = True
    return barrier


def exchanges(items: list[PersistentItem], reverse: bool, batch: int,
              column_blocks: int) -> tuple[Exchange, ...]:
    """The GEMM operands of a step that can go through exchanges instead of grid-wide barriers, or none:
    where every barrier is a GEMM's, for its operand, which one elementwise launch writes whole (each
    block its own elements, in one output or in several side by side) in step with the reads, or a
    block per row's, which keeps it (see `_rows_then_gemms`). A block then waits only for the values it
    reads (on an H100 a forward step of the LSTM took half the time at B=1, and 12% less at B=64). Two
    slots are enough: a block writes a slot again only after every block of its row group wrote what it
    reads next, which each did after reading that slot; in a `reverse` loop as well, whose tags fall
    from step to step and never meet those of two steps before. The exchanges are static arrays of the
    kernel's module: beyond EXCHANGE_BYTES in all, or where the pairs would move more than
    EXCHANGE_BYTES_PER_WAIT for each barrier they take away (every block of a row group reads all its
    rows), the step meets at barriers instead."""
    if not any(item.barrier for item in items) or any(
            item.mma and item.launch.k > MMA_K_CHUNK for item in items):
        return ()  # (tensor cores stage a long K in chunks, from memory)
    step = [item.launch for item in items]
    for item in items:
        if isinstance(item.launch, KernelLaunch) and not item.by_rows and (
                item.barrier or shared_reads(item.launch, step)):
            return ()  # a kernel that reads other blocks' values: the step meets at barriers
    by_rows = any(item.by_rows for item in items)
    if by_rows and not _rows_then_gemms(items):
        return ()
    out: dict[str, Exchange] = {}
    for i, item in enumerate(items):
        if not isinstance(item.launch, GemmLaunch):
            continue
        read = item.launch.a
        writers = [(w, acc) for w, other in enumerate(items) if isinstance(other.launch, KernelLaunch)
                   for _, acc in other.launch.outputs if acc.buffer == read.buffer]
        if not writers:
            if by_rows or any(read.buffer in writes(other.launch) for other in items):
                return ()  # a GEMM writes it, or its barrier, beside a block per row's, is for another reason
            continue  # nothing of the step writes it: read as it is
        w = writers[0][0]
        if any(other != w for other, _ in writers) or by_rows and w != len(items) - 1:
            return ()
        lag = -1 if i < w else 0
        if lag and reverse:
            return ()  # (the tags and slots of a value from the step before are those of a forward loop)
        width = items[w].launch.width
        # the outputs tile the operand's columns, side by side
        tiles = sorted(acc.col - read.col for _, acc in writers) == [width * m for m in range(len(writers))]
        same = all(row_offset(acc.slot, t + lag, 1) == row_offset(read.slot, t, 1)
                   for _, acc in writers for t in (10, 11))
        ex = Exchange(read.buffer, w, item.launch.k, lag, read.col)
        if (items[w].whole or any(acc.kind != "row" for _, acc in writers) or not tiles
                or width * len(writers) != ex.width or not same or out.setdefault(read.buffer, ex) != ex):
            return ()
    if sum(16 * batch * ex.width for ex in out.values()) > EXCHANGE_BYTES:
        return ()
    if 4 * batch * column_blocks * sum(ex.width for ex in out.values()) > EXCHANGE_BYTES_PER_WAIT * len(out):
        return ()
    return tuple(out.values())


def _rows_then_gemms(items: list[PersistentItem]) -> bool:
    """Whether a step whose kernels that reduce rows keep their grid-wide barriers may pass its GEMM
    operands through exchanges: where the step's last launch, a block per row behind a barrier, writes
    them (the new state of a layer-normalised cell), and each GEMM is followed by a barrier. A GEMM of
    the next step then waits only for its row group's rows, which the blocks that write them publish
    after they have read the rows of the GEMM outputs that it overwrites; everything else of a step
    crosses a barrier before another block reads it."""
    *_, last = items
    if not (last.by_rows and last.barrier):
        return False
    gemms = [i for i, item in enumerate(items) if isinstance(item.launch, GemmLaunch) and item.barrier]
    return all(items[i + 1].barrier and not isinstance(items[i + 1].launch, GemmLaunch) for i in gemms)


def _place(gemms: list[_Placed], column_blocks: int, rows: int, limit: int, saved: bool,
           mma: bool, read_by_rows: set[str]) -> list[_Placed]:
    """What of each GEMM stays on chip, in order of what it saves, while it fits beside one staged row of
    the operand: the weights (read every step otherwise; with `mma`, on tensor cores where that fits
    too), then the GEMM outputs that only this block reads (its elementwise work reads them next; not
    those of `read_by_rows`, which a kernel that reduces rows reads)."""
    operands = {p.launch.a.buffer for p in gemms} | read_by_rows
    for field in ("weights", "output") if not saved else ("weights",):
        for i, p in enumerate(gemms):
            if field == "output" and p.launch.c.buffer in operands:
                continue  # another GEMM, or a block per row, reads it: in global memory, for every block
            tries = [{"weights": True, "mma": True}] if field == "weights" and mma else []
            for change in [*tries, {field: True}]:
                trial = [*gemms[:i], dataclasses.replace(p, **change), *gemms[i + 1:]]
                if _smem_floats(trial, column_blocks, 1, rows) <= limit:
                    gemms = trial
                    break
    return gemms


def persistent_launch(layer: int, step: list[GemmLaunch | KernelLaunch], columns: list[tuple[int, ...]],
                      hidden: int, batch: int, target: Target, saved: bool = False,
                      reverse: bool = False, mma: bool = False) -> PersistentLaunch:
    """The persistent launch of one layer's step. `columns` gives each launch's column widths (a GEMM's
    per stacked weight, a kernel's one). A plan that saves its steps for a backward pass (`saved`) keeps
    no GEMM output on chip only: the backward pass reads them all; so does the backward pass's own
    launch, whose steps run in `reverse` and whose GEMMs add into gradients that other launches read.
    With `mma`, the GEMMs whose weights stay on chip run on tensor cores (see `PersistentItem.mma`).

    The blocks split the hidden units among the SMs, and with a large batch the rows too, into as many
    row groups as keep every recurrent weight on chip (on tensor cores, with `mma`, where fewer groups
    allow it): each block then stages only its rows of a GEMM's operand, so a step moves that many times
    fewer bytes out of L2. A step with no GEMM splits the rows as much: its blocks' columns are then as
    many more, so that a warp's elements lie along fewer rows, each in longer runs of memory (IndRNN at
    B=64: 32 columns of 8 rows a block, a row of 32 a warp, instead of 4 columns of every row)."""
    # a kernel that reduces rows keeps its row sums in shared memory of its own, beside the kernel's
    limit = target.smem_per_block // 4 - max((row_sums(launch).floats for launch in step
                                               if isinstance(launch, KernelLaunch)), default=0)
    read_by_rows = {acc.buffer for launch in step if isinstance(launch, KernelLaunch) and launch.reduces_rows
                    for _, acc in launch.inputs}
    gemms = [_Placed(launch, cols, False, False) for launch, cols in zip(step, columns, strict=True)
             if isinstance(launch, GemmLaunch)]
    chosen = None
    for row_groups in ROW_GROUPS:
        rows = -(-batch // row_groups)
        if row_groups > 1 and rows < MIN_GROUP_ROWS:
            continue
        unit = -(-hidden // (target.sm_count // row_groups))
        column_blocks = -(-hidden // unit)
        placed = _place(gemms, column_blocks, rows, limit, saved, mma, read_by_rows)
        on_chip = all(p.weights for p in placed)
        if on_chip and (not mma or all(p.mma for p in placed)):
            chosen = (row_groups, rows, column_blocks, placed)
            break
        if chosen is None and (on_chip or row_groups == 1):  # unless fewer groups put every GEMM on
            chosen = (row_groups, rows, column_blocks, placed)  # tensor cores
    row_groups, rows, column_blocks, placed = chosen
    row_tile = max(1, min(rows, ROW_TILE))
    while row_tile > 1 and _smem_floats(placed, column_blocks, row_tile, rows) > limit:
        row_tile = -(-row_tile // 2)
    items, off_chip = [], []
    chosen = iter(placed)
    for launch, cols, barrier in zip(step, columns, barriers(step, reverse), strict=True):
        match launch:
            case GemmLaunch():
                p = next(chosen)
                if not p.weights:
                    tiling = gemm_tiling(cols, column_blocks, row_tile, launch.k)
                    off_chip.append((launch.group, 4 * tiling.padded_cols * tiling.w_stride(launch.k)))
                items.append(PersistentItem(launch, barrier, cols, on_chip=p.weights, output_on_chip=p.output,
                                            mma=p.mma,
                                            in_registers=p.tiling(column_blocks, row_tile).in_registers))
            case KernelLaunch():
                items.append(PersistentItem(launch, barrier, cols, whole=launch.row_kind == "one"))
            case _:
                raise TypeError(f"unknown launch {launch!r}")
    note = ""
    if off_chip:
        what = ", ".join(f"{name} ({need / 1024:.0f} KiB)" for name, need in off_chip)
        kib = target.smem_per_block // 1024
        note = (f"the weights of {what} do not fit beside the others in the {kib} KiB of shared memory a "
                "block may have, so they are read from L2 every step")
    smem = 4 * _smem_floats(placed, column_blocks, row_tile, rows)
    return PersistentLaunch(layer, tuple(items), column_blocks * row_groups, THREADS, batch, row_groups,
                            row_tile, smem, note, reverse, exchanges(items, reverse, batch, column_blocks))
