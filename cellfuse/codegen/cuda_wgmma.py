"""A GEMM with float32's accuracy on the warpgroup tensor-core instructions of sm_90a (wgmma), which
splits its operands into TF32 pieces as it loads them (3xTF32): the alternative to the split copies of
three fp16 products and cuBLAS's fp16 GEMM over 3K for a hoisted GEMM (gemm_splits.cuh), the faster of
the two measured per shape (see gpu_runtime.wgmma_gemms).

C[m, n] (+)= x[m, k] @ W[k, n], x row-major. W goes first into an image of the GEMM's B tiles, TF32 hi
and lo (`cf_wgmma_image`, W's 2 * k * n floats); x stays float32 where it is: each thread loads its
rows' elements of a stage into registers and splits them there, as the A fragments of the wgmmas. Each
product is lo*hi + hi*lo + hi*hi, summed in float32. K is permuted within each stage, on both sides
alike, so that a thread's elements of x in a stage are contiguous. Measured on an H100 for IndRNN's input
GEMM (6400 x 512 x 512), the image and this GEMM together took less time than the split copies and
cuBLASLt's GEMM over 3K: the copies' cost is gone, and the GEMM itself is about as fast as cuBLASLt's
(docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md, change 18 and IndRNN); the variants of
benchmarks/probes/tf32x3_wgmma_probe.cu chose these tiles.

Blocks of two warpgroups own 128 rows by 256 columns of C; B's stages of 32 values of K go through
shared memory, each one bulk copy (the tensor memory accelerator's, from the image, which is
contiguous) issued by one thread, one stage ahead; mbarriers say when a stage has arrived and when every
warp is done with its slot, so no block-wide barrier stops the loop. A stage's wgmmas run while the
next one's are issued. (In the probe, cp.async by every thread with a barrier per stage of 16 was slower:
docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md, change 18.)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph_model.lengths import STEPS_LEFT
from .cuda_library import cuda_library
from .dtypes import FLOAT32
from .gemm_routes import WGMMA_COLUMNS, WGMMA_STAGE_K
from .plan import Plan

ROWS = 128  # of C, a block's: two warpgroups of 64
STAGES = 3
THREADS = 2 * 128
# the stages, then their mbarriers
SMEM_BYTES = STAGES * 2 * WGMMA_STAGE_K * WGMMA_COLUMNS * 4 + 2 * STAGES * 8

SOURCE = cuda_library("wgmma.cuh", defines={"CF_COLUMNS": WGMMA_COLUMNS, "CF_STAGE_K": WGMMA_STAGE_K,
                                            "CF_STAGES": STAGES, "CF_SMEM": SMEM_BYTES})


# where a GEMM's rows are steps of a batch whose rows have lengths of their own: a block's steps, and its
# rows of the batch (a warp a step)
BLOCK_STEPS = 8
BLOCK_BATCH_ROWS = ROWS // BLOCK_STEPS


@dataclass(frozen=True)
class RowEnds:
    """A GEMM whose rows are steps of `batch` rows from `first_step` on, in a plan whose batch rows have
    lengths of their own: `lengths` names the buffer of the steps-left state's initial value ([layers, B,
    width], row b's length in each element of its row; graph_model.lengths), read where the GEMM runs.
    Past its length a row's x reads as zeros (a PackedSequence's padding), which the step's mask
    discards; the GEMM skips the blocks whose rows have all ended."""

    lengths: str
    width: int
    batch: int
    first_step: int


def row_ends(plan: Plan, launch, rows: int, steps: tuple[int, int] | None) -> RowEnds | None:
    """The RowEnds of a forward plan's GEMM over whole steps (`rows` of them from `steps[0]`, or all), x
    not transposed, where its batch is a multiple of BLOCK_BATCH_ROWS; else None."""
    lengths = plan.buffers.get(f"init.{STEPS_LEFT}")  # (a backward plan has none)
    if lengths is None or lengths.dtype != FLOAT32:  # (the kernel reads float32 lengths)
        return None
    batch = plan.sizes.batch
    if (launch.row_kind != "seq" or launch.trans_a or launch.a.kind != "row" or launch.c.kind != "row"
            or batch % BLOCK_BATCH_ROWS or rows % batch):
        return None
    return RowEnds(lengths.name, lengths.width, batch, steps[0] if steps else 0)


def gemm_grid(m: int, n: int, batch: int = 0) -> tuple[int, int]:
    """The blocks of a GEMM of m rows and n columns: 128 rows a block, or, where `batch` is given (its
    rows are steps of a batch whose rows have lengths, see RowEnds), BLOCK_STEPS steps of
    BLOCK_BATCH_ROWS rows of it."""
    if batch:
        if batch % BLOCK_BATCH_ROWS or m % batch:
            raise ValueError(f"rows of a batch with lengths come in whole steps of a batch of whole blocks "
                             f"of {BLOCK_BATCH_ROWS} rows: not {m} rows of a batch of {batch}")
        return n // WGMMA_COLUMNS, -(-(m // batch) // BLOCK_STEPS) * (batch // BLOCK_BATCH_ROWS)
    return n // WGMMA_COLUMNS, (m + ROWS - 1) // ROWS
