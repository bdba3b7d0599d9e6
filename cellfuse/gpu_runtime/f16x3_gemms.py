"""The fp16 GEMMs over 3K of float32 products as three fp16 ones (see gemm_splits.cuh) through cuBLASLt,
into float32, each shape with the algorithm measured fastest on this GPU among those cuBLASLt's heuristic
offers.

cublasGemmEx takes the heuristic's first algorithm, which is not always the fastest: for IndRNN's input
projection at B=64 (C[6400, 512] over K = 3 x 512) its second was faster than the first on an H100
(benchmarks/results/h100_2026-11-27_cublaslt_algorithms.json). So the first time a shape is asked for,
its candidates run a few times each on the stream, into scratch memory, and the fastest is kept for the
rest of the process.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .event_timing import median_ms

_R_32F, _R_16F, _COMPUTE_32F = 0, 2, 68  # cudaDataType, cublasComputeType_t
# cublasLtPointerMode_t: alpha and beta read from device memory, where the split of A writes them (see
# gemm_splits.cuh: an alpha that undoes both operands' scales, or 1), at each run and each graph replay
_POINTER_MODE_DEVICE = 1
CANDIDATES = 8  # of the heuristic's algorithms, at most, timed per shape
_RUNS = 5  # timed runs of each candidate (after one to warm up); the median counts


@dataclass(frozen=True)
class Shape:
    """A column-major GEMM C[m, n] = op(A)[m, k] @ B[k, n] (cuBLAS's terms; A and B fp16, C float32),
    with op(A) = A^T where `trans_a`, picking its kernels for `sms` SMs (0: all of them), on A, B and C at
    addresses aligned to `aligned` bytes (see `alignment`): cuBLASLt's algorithms assume 256 unless told
    less."""

    trans_a: bool
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    sms: int = 0
    aligned: tuple[int, int, int] = (256, 256, 256)


def alignment(address: int) -> int:
    """The largest power of two, up to 256, that divides a device address: its alignment in bytes."""
    return min(256, address & -address) if address else 256


class _Chosen:
    """One shape's descriptors and the algorithm chosen for it (cuBLASLt's 64-byte struct), kept for the
    rest of the process like the choice itself."""

    def __init__(self, lt, shape: Shape):
        self.desc = lt.matmul_desc_create(_COMPUTE_32F, _R_32F)
        attribute = lt.MatmulDescAttribute
        _set(lt.matmul_desc_set_attribute, self.desc, attribute.POINTER_MODE, _POINTER_MODE_DEVICE)
        if shape.trans_a:
            _set(lt.matmul_desc_set_attribute, self.desc, attribute.TRANSA, 1)
        if shape.sms:
            _set(lt.matmul_desc_set_attribute, self.desc, attribute.SM_COUNT_TARGET, shape.sms)
        a_rows, a_cols = (shape.k, shape.m) if shape.trans_a else (shape.m, shape.k)
        self.a = lt.matrix_layout_create(_R_16F, a_rows, a_cols, shape.lda)
        self.b = lt.matrix_layout_create(_R_16F, shape.k, shape.n, shape.ldb)
        self.c = lt.matrix_layout_create(_R_32F, shape.m, shape.n, shape.ldc)
        self.algo = np.zeros(0, np.uint8)  # set by `TensorCoreGemms._measure`
        self.times_ms: list[float] = []  # each candidate's, in the heuristic's order


def _set(setter, desc, attribute, value: int) -> None:
    v = np.array([value], np.int32)
    setter(desc, attribute, v.ctypes.data, v.nbytes)


class TensorCoreGemms:
    """The GEMMs over 3K of an executor's products on tensor cores: one cuBLASLt handle, and per shape the
    algorithm measured fastest (measured once per process: every executor shares the choices)."""

    _chosen: dict[tuple[str, Shape], _Chosen] = {}

    def __init__(self, drv, gpu: str, workspace_bytes: int):
        from nvmath.bindings import cublasLt

        self.lt, self.drv, self.gpu = cublasLt, drv, gpu
        self.workspace_bytes = workspace_bytes
        self.handle = cublasLt.create()

    def close(self) -> None:
        self.lt.destroy(self.handle)

    def chosen(self, shape: Shape, stream, workspace: int) -> _Chosen:
        """The shape's descriptors and algorithm, measured on `stream` the first time it is asked for."""
        key = (self.gpu, shape)
        if key not in self._chosen:
            self._chosen[key] = self._measure(shape, stream, workspace)
        return self._chosen[key]

    def _measure(self, shape: Shape, stream, workspace: int) -> _Chosen:
        lt, drv = self.lt, self.drv
        chosen = _Chosen(lt, shape)
        preference = lt.matmul_preference_create()
        try:
            limit = np.array([self.workspace_bytes], np.uint64)
            lt.matmul_preference_set_attribute(preference, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                                               limit.ctypes.data, limit.nbytes)
            at = lt.MatmulPreferenceAttribute
            a, b, c = shape.aligned
            for attribute, aligned in ((at.MIN_ALIGNMENT_A_BYTES, a), (at.MIN_ALIGNMENT_B_BYTES, b),
                                       (at.MIN_ALIGNMENT_C_BYTES, c), (at.MIN_ALIGNMENT_D_BYTES, c)):
                v = np.array([aligned], np.uint32)
                lt.matmul_preference_set_attribute(preference, attribute, v.ctypes.data, v.nbytes)
            results = lt.MatmulHeuristicResult(CANDIDATES)
            count = np.zeros(1, np.int32)
            lt.matmul_algo_get_heuristic(self.handle, chosen.desc, chosen.a, chosen.b, chosen.c, chosen.c,
                                         preference, CANDIDATES, results.ptr, count.ctypes.data)
        finally:
            lt.matmul_preference_destroy(preference)
        size = lt.matmul_heuristic_result_dtype.itemsize
        algos = [np.frombuffer(ctypes.string_at(results.ptr + i * size, lt.matmul_algo_dtype.itemsize),
                               np.uint8).copy() for i in range(int(count[0]))]
        if not algos:
            raise RuntimeError(f"cuBLASLt offers no algorithm for the fp16 GEMM {shape}")
        # scratch operands as large as the GEMM's: the time does not depend on their values, and the
        # executor's own buffers (a gradient that accumulates, say) must not change
        a_elems = shape.lda * (shape.m if shape.trans_a else shape.k)
        scratch = drv.mem_alloc(2 * (a_elems + shape.ldb * shape.n) + 4 * shape.ldc * shape.n + 768)
        try:
            a = int(scratch)
            b = a + -(-2 * a_elems // 256) * 256
            c = b + -(-2 * shape.ldb * shape.n // 256) * 256
            alpha = c + -(-4 * shape.ldc * shape.n // 256) * 256
            drv.memcpy_htod(alpha, np.array([1.0, 0.0], np.float32))
            for algo in algos:
                def run(algo=algo):
                    lt.matmul(self.handle, chosen.desc, alpha, a, chosen.a, b, chosen.b, alpha + 4, c,
                              chosen.c, c, chosen.c, algo.ctypes.data, workspace, self.workspace_bytes,
                              stream.handle)
                try:
                    run()
                except lt.cuBLASLtError:  # offered, yet refused for these operands: never chosen
                    chosen.times_ms.append(float("inf"))
                    continue
                chosen.times_ms.append(median_ms(drv, run, stream, _RUNS))
        finally:
            scratch.free()
        if all(t == float("inf") for t in chosen.times_ms):
            raise RuntimeError(f"cuBLASLt refused every algorithm it offered for the fp16 GEMM {shape}")
        chosen.algo = algos[int(np.argmin(chosen.times_ms))]
        return chosen

    def call(self, chosen: _Chosen, stream, workspace: int, alpha: int, a: int, b: int, beta: int, c: int):
        """C = alpha op(A) @ B + beta C on `stream`, by the algorithm `chosen` for its shape (alpha, beta:
        device addresses of float32 scalars)."""
        self.lt.matmul(self.handle, chosen.desc, alpha, a, chosen.a, b, chosen.b, beta, c, chosen.c, c,
                       chosen.c, chosen.algo.ctypes.data, workspace, self.workspace_bytes, stream.handle)
