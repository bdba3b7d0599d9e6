"""The warpgroup GEMM that splits its operands into TF32 pieces as it loads them (codegen.cuda_wgmma) on
this GPU, and the choice, per GEMM shape, between it and the split copies of three fp16 products with
cuBLAS's fp16 GEMM over 3K (gemm_splits.cuh): the two routes of a GEMM on tensor cores with float32's
accuracy.

Neither wins everywhere: on an H100 the warpgroup GEMM took IndRNN's input GEMM (6400 x 512 x 512) in
less time than the copies and cuBLAS (see codegen.cuda_wgmma;
docs/results/2026-11-27-persistent-rungs-changes-14-to-19.md, change 18), but its tiles of 128 x
256 leave SMs idle or run in a second wave where cuBLAS's do not. So the first time a shape is
asked for, both routes run a few times each on scratch memory, and the faster is kept for the process.
The kernel needs sm_90a's instructions: on any other GPU the copies and cuBLAS are the only route.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ..codegen.cuda_wgmma import SMEM_BYTES, SOURCE, THREADS, gemm_grid
from .event_timing import median_ms

_RUNS = 5  # timed runs of each route (after one to warm up); the median counts
_GRID_Y = 65535  # blocks, at most, along a grid's second dimension


@dataclass(frozen=True)
class Operands:
    """Where a GEMM C[m, n] (+)= x[m, k] @ W on tensor cores reads and writes: W is [k, n] (row length
    ldw), or [n, k] where `trans_w`; `pieces` has room for the workspace of the split copies
    (gemm_routes.f16x3_layout) or the warpgroup GEMM's image of W."""

    c: int
    x: int
    w: int
    pieces: int
    m: int
    n: int
    k: int
    lda: int
    ldw: int
    ldc: int
    trans_w: bool
    accumulate: bool
    bias: int = 0  # the address of a bias added to every row after the products (epilogue or pass), or 0
    # where the rows are steps of a batch whose rows have lengths (codegen.cuda_wgmma.RowEnds): the
    # address of the lengths, their row length, the batch and the GEMM's first step (the warpgroup GEMM
    # skips what has ended; the split copies compute it)
    lengths: int = 0
    lengths_ld: int = 0
    batch: int = 0
    first_step: int = 0


def usable(compute_capability: tuple[int, int], op: Operands, batch: int | None = None) -> bool:
    """Whether the warpgroup GEMM can run a GEMM whose route allows it (its shape, see
    gemm_routes.wgmma_shape_fits) here: an sm_90 GPU (sm_90a's instructions), no more blocks of rows than
    a grid's second dimension holds, x's rows 16-byte aligned and C's 8-byte aligned. `batch`: where the
    rows are steps of a batch whose rows have lengths (see gemm_grid), where `op` does not say so itself
    (the stream programs pass the lengths apart from it)."""
    rows_batch = _batch(op) if batch is None else batch
    return (compute_capability == (9, 0) and 0 < op.m and gemm_grid(op.m, op.n, rows_batch)[1] <= _GRID_Y
            and op.x % 16 == 0 and op.lda % 4 == 0 and op.c % 8 == 0 and op.ldc % 2 == 0)


def _batch(op: Operands) -> int:
    return op.batch if op.lengths else 0


class WgmmaGemms:
    """The compiled kernels and the route chosen per shape (one instance per process, shared by every
    executor, like cuBLASLt's algorithms)."""

    def __init__(self, drv, compile_source: Callable[[str, str], bytes]):
        self.drv = drv
        self.module = drv.module_from_buffer(compile_source(SOURCE, "sm_90a"))
        gemm = self.module.get_function("cf_wgmma_gemm")
        gemm.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM_BYTES)
        self.image = self.module.get_function("cf_wgmma_image").prepare("PPiiii")
        self.gemm = gemm.prepare("PPPPiiiiiiPiii")
        self.chosen: dict[tuple, str] = {}  # shape -> its route, measured by the executor (`faster`)

    def calls(self, op: Operands, stream) -> list[Callable[[], object]]:
        """W's image, then the GEMM, on `stream`."""
        return [self.image_call(op, stream), self.gemm_call(op, stream)]

    def image_call(self, op: Operands, stream) -> Callable[[], object]:
        """W's image into `op.pieces` (2 k n floats), on `stream`."""
        elements = op.n * op.k
        return partial(self.image.prepared_async_call, ((elements + 255) // 256, 1), (256, 1, 1), stream,
                       op.pieces, op.w, op.n, op.k, op.ldw, int(op.trans_w))

    def gemm_call(self, op: Operands, stream) -> Callable[[], object]:
        """The GEMM, W's image in `op.pieces`, on `stream`."""
        return partial(self.gemm.prepared_async_call, gemm_grid(op.m, op.n, _batch(op)), (THREADS, 1, 1),
                       stream, op.c, op.x, op.pieces, op.bias, op.m, op.n, op.k, op.lda, op.ldc,
                       int(op.accumulate), op.lengths, op.lengths_ld, op.batch, op.first_step,
                       shared_size=SMEM_BYTES)

    def faster(self, routes: dict[str, list[Callable[[], object]]], stream) -> str:
        """The route of `routes` (each its calls, on scratch memory) that runs fastest on `stream`."""
        times = {}
        for name, calls in routes.items():
            def run(calls=calls):
                for call in calls:
                    call()
            run()  # warm
            times[name] = median_ms(self.drv, run, stream, _RUNS)
        return min(times, key=times.get)
