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

from .address import slot_rows
from .dtypes import COMPUTE
from .plan import (
    Access,
    Exchange,
    GemmLaunch,
    KernelLaunch,
    PersistentItem,
    PersistentLaunch,
    StateCopies,
    Target,
)
from .row_passes import row_sums
from .tiling import (
    MMA_K_CHUNKS,
    THREADS,
    GemmTiling,
    SharedRegions,
    gemm_tiling,
    output_floats,
    whole32,
)

ROW_TILE = 64  # rows of a GEMM's left operand staged in shared memory at a time, at most
ROW_GROUPS = (8, 4, 2, 1)  # the ways to split the batch between blocks, most first
MIN_GROUP_ROWS = 8  # rows of a group, at least: fewer would not fill a block's threads
EXCHANGE_BYTES = 64 * 2**20  # of a persistent kernel's exchanges, at most (two slots of 8-byte pairs)
# The bytes an exchange's (tag, value) pairs add to a step's reads from L2 (its readers' rows of the
# operand, 4 more bytes a value), per grid-wide barrier it takes away, at most. Measured on an H100,
# exchanges against barriers: at 2 and 4 MiB a wait the exchanges were faster (the MGU's backward, the
# LSTM's forward, B=64), at 6 MiB they broke even (the GRU's backward, B=64), and from 8 MiB on they were
# slower, the more so the more bytes (the LSTM's backward at B=8 and B=64, its forward at B=256 and at
# H=1024, B=64) (docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md, changes 3 and 5).
EXCHANGE_BYTES_PER_WAIT = 6 * 2**20


@dataclass(frozen=True)
class _Placed:
    """A GEMM of the step (item `index` of the step) and what of it stays in shared memory."""

    launch: GemmLaunch
    index: int
    columns: tuple[int, ...]
    weights: bool  # its block's columns of W
    output: bool  # its block's columns of C, for every row of the batch
    mma: bool = False  # on tensor cores, which read W from shared memory only
    w_itemsize: int = 4  # of W on tensor cores (2 in a 16-bit plan: see GemmTiling.w_itemsize; 4: float32's
    # products, each as three fp16 ones, see GemmTiling.f16x3)
    k_chunk: int = MMA_K_CHUNKS[0]  # on tensor cores, the most columns of K staged at a time

    def tiling(self, blocks: int, row_tile: int) -> GemmTiling:
        return gemm_tiling(self.columns, blocks, row_tile, self.launch.k, self.mma, self.partials,
                           self.w_itemsize, self.mma and self.w_itemsize == 4, self.k_chunk)

    @property
    def partials(self) -> bool:
        """Whether the elementwise work may read its output as the warps' partial sums that it adds up:
        W and C on chip, C neither biased nor added into."""
        return self.weights and self.output and not self.launch.bias and not self.launch.accumulate


def shared_regions(gemms: list[_Placed], blocks: int, row_tile: int, rows: int) -> SharedRegions:
    """The shared memory of a persistent kernel, in floats: the staged rows of the largest GEMM operand,
    what of each GEMM stays on chip (its output for the block's `rows` rows), and the partial tiles of the
    GEMM on tensor cores that has the most; `blocks` share the columns."""
    tilings = [p.tiling(blocks, row_tile) for p in gemms]
    stage = max((whole32(t.padded_rows * t.stage_stride(p.launch.k))
                 for p, t in zip(gemms, tilings, strict=True)), default=0)
    at, weights, outputs = stage, [], []
    for p, tiling in zip(gemms, tilings, strict=True):
        if p.weights:
            weights.append((p.index, at))
            at += tiling.w_floats(p.launch.k)
        if p.output:
            outputs.append((p.index, at))
            at += output_floats(rows, tiling)
    mma = max((t.mma_floats for t in tilings), default=0)
    return SharedRegions(stage, tuple(weights), tuple(outputs), at if mma else None, at + mma)


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


def _states_barriers(items: list[PersistentItem], exchange: tuple[Exchange, ...],
                     states: tuple[StateCopies, ...]) -> tuple[bool, bool]:
    """Whether the blocks meet at a grid-wide barrier between their copies of the initial states (each
    its own elements, as its elementwise work owns them) and the first step, and between the last step and
    their copies of the final states.

    Before the first step: where, before the step's first barrier, a block reads elements of a state that
    other blocks copied (a GEMM all of K of its operand, a kernel that reduces rows whole rows). With
    exchanges there is one anyway: the initial values they publish, read from the copies, are behind one.
    After the last: where a kernel that reduces rows (whole rows, other blocks' elements) wrote a state."""
    read = {state.read.buffer for state in states}
    first = False
    for item in () if exchange else items:
        if item.barrier:
            break
        if (item.by_rows or isinstance(item.launch, GemmLaunch)) and reads(item.launch) & read:
            first = True
            break
    last = any(item.by_rows and writes(item.launch) & read for item in items)
    return first, last


STEP_SLOTS = ("t", "t+1", "t%2", "(t+1)%2")  # the slots whose rows move with the step


def overtakes(write: Access, read: Access, reverse: bool) -> bool:
    """Whether a block's write at one step may land where a slower block still reads in the step before
    it (the step after, in a reverse loop): the same buffer, and rows that meet at some step, unless both
    accesses move with the step to rows that never do."""
    if write.buffer != read.buffer:
        return False
    if write.slot not in STEP_SLOTS or read.slot not in STEP_SLOTS:
        return True
    return any(slot_rows(write.slot).evaluate(t=t, batch=1)
               == slot_rows(read.slot).evaluate(t=t + (1 if reverse else -1), batch=1)
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
    reads (on an H100 a forward step of the LSTM took less time at B=1, 8 and 64, the most at B=1:
    docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md, change 3). Two slots are enough: a block
    writes a slot again only after every block of its row group wrote what it reads next, which each did
    after reading that slot; in a `reverse` loop as well, whose tags fall from step to step and never meet
    those of two steps before. The exchanges are static arrays of the kernel's module: beyond
    EXCHANGE_BYTES in all, or where the pairs would move more than EXCHANGE_BYTES_PER_WAIT for each
    barrier they take away (every block of a row group reads all its rows), the step meets at barriers
    instead."""
    if not any(item.barrier for item in items) or any(
            item.mma and item.tiling.k_chunk < item.launch.k for item in items):
        return ()  # (tensor cores stage a long K in chunks, from memory)
    step = [item.launch for item in items]
    for item in items:
        if isinstance(item.launch, KernelLaunch) and not item.by_rows and (
                item.barrier or shared_reads(item.launch, step)):
            return ()  # a kernel that reads other blocks' values: the step meets at barriers
    by_rows = any(item.by_rows for item in items)
    # where GEMMs that read one operand multiply it differently (one on tensor cores, one on the CUDA cores
    # in 16 bits), no one form of its values in the exchange suits both (persistent_cuda.exchange.stored)
    reads: dict[str, set] = {}
    for item in items:
        if isinstance(item.launch, GemmLaunch):
            reads.setdefault(item.launch.a.buffer, set()).add((item.mma, item.launch.multiply))
    if any(len(kinds) > 1 for kinds in reads.values()):
        return ()
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
        same = all(slot_rows(acc.slot).evaluate(t=t + lag, batch=1)
                   == slot_rows(read.slot).evaluate(t=t, batch=1) for _, acc in writers for t in (10, 11))
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
                if shared_regions(trial, column_blocks, 1, rows).floats <= limit:
                    gemms = trial
                    break
    return gemms


def _widest_chunks(gemms: list[_Placed], column_blocks: int, row_tile: int, rows: int,
                   limit: int) -> list[_Placed]:
    """Each GEMM on tensor cores whose K is staged in chunks, in the widest of MMA_K_CHUNKS that fits
    beside what stays on chip (fewer chunks: fewer barriers and partial-tile stores a step)."""
    for i, p in enumerate(gemms):
        if not p.mma:
            continue
        for chunk in MMA_K_CHUNKS:
            if p.k_chunk >= p.launch.k:  # (K staged whole)
                break
            if chunk <= p.k_chunk:
                continue
            trial = [*gemms[:i], dataclasses.replace(p, k_chunk=chunk), *gemms[i + 1:]]
            if shared_regions(trial, column_blocks, row_tile, rows).floats > limit:
                break
            gemms, p = trial, trial[i]
    return gemms


def persistent_launch(layer: int, step: list[GemmLaunch | KernelLaunch], columns: list[tuple[int, ...]],
                      hidden: int, batch: int, target: Target, saved: bool = False,
                      reverse: bool = False, mma: bool = False,
                      states: tuple[StateCopies, ...] = (), sixteen_bit: bool = False) -> PersistentLaunch:
    """The persistent launch of one layer's step. `columns` gives each launch's column widths (a GEMM's
    per stacked weight, a kernel's one). A plan that saves its steps for a backward pass (`saved`) keeps
    no GEMM output on chip only: the backward pass reads them all; so does the backward pass's own
    launch, whose steps run in `reverse` and whose GEMMs add into gradients that other launches read.
    With `mma`, the GEMMs whose weights stay on chip run on tensor cores (see `PersistentItem.mma`), in
    a 16-bit plan (`sixteen_bit`) with their weights kept in its type, in half the room. A forward launch
    copies its layer's `states` in and out itself (see `PersistentLaunch.states`).

    The blocks split the hidden units among the SMs, and with a large batch the rows too, into as many
    row groups as keep every recurrent weight on chip (on tensor cores, with `mma`, where fewer groups
    allow it): each block then stages only its rows of a GEMM's operand, so a step moves that many times
    fewer bytes out of L2. A step with no GEMM splits the rows as much: its blocks' columns are then as
    many more, so that a warp's elements lie along fewer rows, each in longer runs of memory (IndRNN at
    B=64: 32 columns of 8 rows a block, a row of 32 a warp, instead of 4 columns of every row)."""
    # a kernel that reduces rows keeps its row sums in shared memory of its own, beside the kernel's
    row_sums_floats = max((row_sums(launch).floats for launch in step if isinstance(launch, KernelLaunch)),
                          default=0)
    limit = target.smem_per_block // COMPUTE.itemsize - row_sums_floats
    read_by_rows = {acc.buffer for launch in step if isinstance(launch, KernelLaunch) and launch.reduces_rows
                    for _, acc in launch.inputs}
    w_itemsize = 2 if sixteen_bit else 4
    gemms = [_Placed(launch, i, cols, False, False, w_itemsize=w_itemsize)
             for i, (launch, cols) in enumerate(zip(step, columns, strict=True))
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
    while row_tile > 1 and shared_regions(placed, column_blocks, row_tile, rows).floats > limit:
        row_tile = -(-row_tile // 2)
    placed = _widest_chunks(placed, column_blocks, row_tile, rows, limit)
    items, off_chip = [], []
    chosen = iter(placed)
    for launch, cols, barrier in zip(step, columns, barriers(step, reverse), strict=True):
        match launch:
            case GemmLaunch():
                p = next(chosen)
                tiling = p.tiling(column_blocks, row_tile)
                if not p.weights:
                    need = COMPUTE.itemsize * tiling.padded_cols * tiling.w_stride(launch.k)
                    off_chip.append((launch.group, need))
                items.append(PersistentItem(launch, barrier, cols, on_chip=p.weights, output_on_chip=p.output,
                                            tiling=tiling))
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
    exchange = exchanges(items, reverse, batch, column_blocks)
    first, last = _states_barriers(items, exchange, states)
    waits = any(item.barrier for item in items)
    return PersistentLaunch(layer, tuple(items), column_blocks * row_groups, THREADS, batch, row_groups,
                            row_tile, shared_regions(placed, column_blocks, row_tile, rows), note, reverse,
                            exchange, states, initial_barrier=first, final_barrier=last,
                            cooperative=bool(waits or exchange or first or last))
