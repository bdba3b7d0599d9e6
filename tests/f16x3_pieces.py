"""gemm_splits.cuh's fp16 pieces in numpy, whose float16 rounds as cuda_fp16's __float2half_rn does: the
tests' one emulation of a float32 value as the operands of three fp16 products."""

from __future__ import annotations

import numpy as np


def f16x3_scale(m: np.ndarray) -> np.ndarray:
    """f16x3.cuh's cf_f16x3_scale of largest magnitudes m: 2^(14 - e) for m in [2^e, 2^(e + 1)), at most
    2^126; 1 where m is zero or not finite."""
    m = np.asarray(m, np.float32)
    e = np.frexp(m)[1]  # m in [2^(e - 1), 2^e)
    return np.where((m > 0) & np.isfinite(m), np.ldexp(np.float32(1), np.minimum(15 - e, 126)),
                    1).astype(np.float32)


def f16x3_pieces(scaled: np.ndarray, lo_piece: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The three copies of values already scaled, in the split's order: hi, hi / 2^11 and lo (lo piece 2,
    A's), or hi, lo and hi / 2^11 (lo piece 1, W's); lo = (value - hi) * 2^11. An infinity's or NaN's
    pieces are what the kernel's arithmetic makes of them."""
    with np.errstate(invalid="ignore", over="ignore"):
        hi = scaled.astype(np.float16)
        lo = ((scaled - hi.astype(np.float32)) * np.float32(2048)).astype(np.float16)
        small = (hi.astype(np.float32) / np.float32(2048)).astype(np.float16)
    return (hi, small, lo) if lo_piece == 2 else (hi, lo, small)


ONE_SCALE_SPREAD = 19  # gemm_splits.cuh's CF_ONE_SCALE_SPREAD: exponents 19 apart, a ratio below 2^20


def f16x3_range(m: np.ndarray) -> np.ndarray:
    """gemm_splits.cuh's range of largest magnitudes m (non-negative): the largest's bits and the
    complement of the smallest non-zero one's (0 where all are zero), as the kernels fold them."""
    bits = np.asarray(m, np.float32).ravel().view(np.uint32)
    nonzero = bits[bits != 0]
    return np.array([bits.max(initial=0), ~nonzero.min() if nonzero.size else 0], np.uint32)


def f16x3_one_max(m: np.ndarray) -> float | None:
    """gemm_splits.cuh's cf_f16x3_one_max: the largest of m where one scale serves every row or column of
    these largest magnitudes (their exponents at most ONE_SCALE_SPREAD apart, all finite), else None."""
    hi, lo = f16x3_range(m)
    if hi >> 23 >= 255:
        return None
    largest = float(np.uint32(hi).view(np.float32))
    if lo == 0:
        return largest
    return largest if int(hi >> 23) - int(~lo >> 23) <= ONE_SCALE_SPREAD else None
