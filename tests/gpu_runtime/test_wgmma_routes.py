"""Where the executor offers the warpgroup GEMM's route at all (no GPU needed: the rule alone)."""

from __future__ import annotations

from dataclasses import replace

from cellfuse.gpu_runtime.wgmma_gemms import Operands, usable


def test_the_route_is_offered_only_where_the_kernel_can_run():
    op = Operands(c=256, x=256, w=256, pieces=256, m=6400, n=512, k=512, lda=512, ldw=512, ldc=512,
                  trans_w=False, accumulate=False)
    assert usable((9, 0), op)
    assert not usable((8, 0), op) and not usable((10, 0), op)  # no sm_90a instructions there
    assert not usable((9, 0), replace(op, x=260))  # x's rows not on 16 bytes
    assert not usable((9, 0), replace(op, lda=514))
    assert not usable((9, 0), replace(op, c=260))  # C's pairs not on 8 bytes
    assert not usable((9, 0), replace(op, ldc=513))
    assert not usable((9, 0), replace(op, m=0))
    assert usable((9, 0), replace(op, m=65535 * 128)) and not usable((9, 0), replace(op, m=65535 * 128 + 1))
    assert not usable((9, 0), replace(op, n=384)) and not usable((9, 0), replace(op, k=48))
