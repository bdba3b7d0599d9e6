"""The persistent schedule of a layer: where its grid-wide barriers go, how its blocks share the columns,
which recurrent weights stay in shared memory, and how much of it each block needs.

One cooperative launch runs every step of a layer. Each block owns the same slice of every width (see
`owned`), so elementwise work touches only what its own block wrote and needs no barrier; only a GEMM
reads a whole operand, written by every block. A barrier therefore goes before a GEMM whose left operand
was written since the last barrier (looking across the step's end, since step t reads what step t-1
wrote), and before anything that overwrites such an operand ahead of its step's first barrier (a block
still reading the previous step's value could otherwise see the new one). LSTM and GRU get one barrier per
step, Cho's GRU and MGU two (their second GEMM reads r*h, computed in the step), and a cell without a
recurrent GEMM none.
"""

from __future__ import annotations

from dataclasses import dataclass

from .plan import GemmLaunch, KernelLaunch, PersistentItem, PersistentLaunch

THREADS = 256  # per block of a persistent kernel
ROW_TILE = 64  # rows of a GEMM's left operand staged in shared memory at a time, at most
K_TILE = 32  # and columns


@dataclass(frozen=True)
class Target:
    """What the scheduler needs to know of the GPU for a persistent plan."""

    sm_count: int
    smem_per_block: int  # bytes of shared memory one block may have (the opt-in maximum)

    @property
    def name(self) -> str:
        return f"{self.sm_count} SMs, {self.smem_per_block // 1024} KiB of shared memory per block"


H100 = Target(132, 227 * 1024)  # also the H200's numbers; the CUDA runtime asks its own GPU


@dataclass(frozen=True)
class GemmTiling:
    """How the threads of a block share its part of a GEMM, C[rows, cols] = A[rows, K] @ W[K, cols]:
    `col_threads` x `row_threads` threads each hold a register tile of `rows_per_thread` rows (one
    after another) by `cols_per_thread` columns (`col_threads` apart); with few outputs (a small
    batch) `k_split` threads share each output's sum over K and add their partial sums at the end."""

    cols: int  # the block's columns of the GEMM, over all its stacked weights
    col_threads: int
    row_threads: int
    rows_per_thread: int
    cols_per_thread: int
    k_split: int

    @property
    def padded_cols(self) -> int:  # the width of the on-chip weights, a multiple of col_threads
        return self.col_threads * self.cols_per_thread

    @property
    def padded_rows(self) -> int:  # the rows of the staged operand
        return self.row_threads * self.rows_per_thread


def gemm_tiling(columns: tuple[int, ...], blocks: int, row_tile: int) -> GemmTiling:
    cols = sum(-(-w // blocks) for w in columns)
    col_threads = min(cols, THREADS)
    row_threads = max(1, min(row_tile, THREADS // col_threads))
    k_split = max(1, THREADS // (row_threads * col_threads))
    return GemmTiling(cols, col_threads, row_threads, -(-row_tile // row_threads), -(-cols // col_threads),
                      k_split)


def padded_k(k: int, k_tile: int) -> int:
    """The rows of the on-chip weights: K rounded up to whole k tiles (the padding holds zeros)."""
    return -(-k // k_tile) * k_tile


def _writes(launch: GemmLaunch | KernelLaunch) -> set[str]:
    match launch:
        case GemmLaunch():
            return {launch.c.buffer}
        case KernelLaunch():
            return {acc.buffer for _, acc in launch.outputs}
        case _:
            raise TypeError(f"unknown launch {launch!r}")


def barriers(step: list[GemmLaunch | KernelLaunch]) -> list[bool]:
    """For each launch of the step, in order, whether a grid-wide barrier goes before it."""
    barrier = [False] * len(step)
    operands = {launch.a.buffer for launch in step if isinstance(launch, GemmLaunch)}
    changed = True
    while changed:
        changed = False
        dirty: set[str] = set()
        for _ in range(2):  # twice round: step t's first GEMMs read what step t-1 wrote last
            for i, launch in enumerate(step):
                if isinstance(launch, GemmLaunch) and launch.a.buffer in dirty and not barrier[i]:
                    barrier[i] = changed = True
                if barrier[i]:
                    dirty.clear()
                dirty |= _writes(launch)
        first = barrier.index(True) if True in barrier else len(step)
        for i in range(first):
            if _writes(step[i]) & operands:
                barrier[i] = changed = True
    return barrier


def persistent_launch(layer: int, step: list[GemmLaunch | KernelLaunch], columns: list[tuple[int, ...]],
                      hidden: int, batch: int, target: Target) -> PersistentLaunch:
    """The persistent launch of one layer's step. `columns` gives each launch's column widths (a GEMM's
    per stacked weight, a kernel's one); blocks split the hidden units among the SMs."""
    unit = -(-hidden // target.sm_count)
    blocks = -(-hidden // unit)
    row_tile = min(batch, ROW_TILE)
    gemms = [(launch, cols) for launch, cols in zip(step, columns, strict=True)
             if isinstance(launch, GemmLaunch)]
    k_tile = min(K_TILE, max((launch.k for launch, _ in gemms), default=1))
    staged = max((gemm_tiling(cols, blocks, row_tile).padded_rows for _, cols in gemms), default=0)
    fixed = 4 * (staged * k_tile + THREADS) if gemms else 0  # the staged operand and the partial sums
    free = target.smem_per_block - fixed
    items, off_chip = [], []
    for launch, cols, barrier in zip(step, columns, barriers(step), strict=True):
        match launch:
            case GemmLaunch():
                need = 4 * padded_k(launch.k, k_tile) * gemm_tiling(cols, blocks, row_tile).padded_cols
                on_chip = need <= free
                if on_chip:
                    free -= need
                else:
                    off_chip.append((launch.group, need))
                items.append(PersistentItem(launch, barrier, cols, on_chip=on_chip))
            case KernelLaunch():
                items.append(PersistentItem(launch, barrier, cols, whole=launch.row_kind == "one"))
            case _:
                raise TypeError(f"unknown launch {launch!r}")
    note = ""
    if off_chip:
        what = ", ".join(f"{name} ({need / 1024:.0f} KiB)" for name, need in off_chip)
        limit = target.smem_per_block // 1024
        note = (f"the weights of {what} do not fit beside the others in the {limit} KiB of shared memory "
                "a block may have, so they are read from L2 every step")
    smem = target.smem_per_block - free
    return PersistentLaunch(layer, tuple(items), blocks, THREADS, row_tile, k_tile, smem, note)
