"""The fp16 GEMMs of three fp16 products each through cuBLASLt, into float32, each shape by the algorithm
measured fastest."""

from __future__ import annotations

import numpy as np
import pytest

from cellfuse.gpu_runtime.cuda_executor import device_description
from cellfuse.gpu_runtime.f16x3_gemms import Shape, TensorCoreGemms, alignment

pytestmark = pytest.mark.gpu

WORKSPACE = 32 * 2**20


@pytest.fixture
def gemms(gpu):
    drv = gpu[0]
    g = TensorCoreGemms(drv, device_description(), WORKSPACE)
    workspace = drv.mem_alloc(WORKSPACE)
    yield drv, g, workspace
    workspace.free()
    g.close()


@pytest.mark.parametrize("trans_a, offset", [(False, 0), (True, 0), (False, 4), (True, 12)])
def test_the_fastest_measured_algorithm_computes_the_product(gemms, trans_a, offset):
    """Each way round, on operands at 256-byte boundaries and `offset` bytes past them (a GEMM's output
    inside a larger buffer: cuBLASLt then offers only algorithms that allow it), alpha and beta read from
    device memory (alpha 2^-3 here, applied exactly; beta 0, so that C, NaN before, is not read)."""
    drv, g, workspace = gemms
    m, n, k = 96, 80, 3 * 64  # column-major C[m, n] = op(A)[m, k] @ B[k, n]
    rng = np.random.default_rng(0)
    op_a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    # column-major [rows, cols] with ld = rows is row-major [cols, rows]: A^T stored is op(A)
    a_stored = op_a if trans_a else op_a.T
    lda = k if trans_a else m
    stream = drv.Stream()
    room = drv.mem_alloc(2 * (a_stored.size + b.size) + 4 * m * n + 3 * 512)
    a_dev, b_dev, c_dev = (int(room) + 512 * i + offset for i in range(3))
    b_dev += 2 * a_stored.size
    c_dev += 2 * (a_stored.size + b.size)
    drv.memcpy_htod(a_dev, np.ascontiguousarray(a_stored))
    drv.memcpy_htod(b_dev, np.ascontiguousarray(b.T))
    drv.memcpy_htod(c_dev, np.full(m * n, np.nan, np.float32))
    aligned = tuple(alignment(p) for p in (a_dev, b_dev, c_dev))
    assert offset == 0 or max(aligned) <= offset
    shape = Shape(trans_a, m, n, k, lda, k, m, 0, aligned)
    chosen = g.chosen(shape, stream, int(workspace))
    assert chosen.times_ms and np.isfinite(min(chosen.times_ms))
    assert g.chosen(shape, stream, int(workspace)) is chosen  # measured once
    scalars = drv.to_device(np.array([0.125, 0.0], np.float32))
    g.call(chosen, stream, int(workspace), int(scalars), a_dev, b_dev, int(scalars) + 4, c_dev)
    stream.synchronize()
    c = np.empty((n, m), np.float32)
    drv.memcpy_dtoh(c, c_dev)
    c = c.T  # column-major [m, n]
    room.free()
    ref = op_a.astype(np.float64) @ b.astype(np.float64) * 0.125
    # fp16 products are exact in float32, and their sums float32's
    assert np.max(np.abs(c - ref)) / np.max(np.abs(ref)) < 1e-5
