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
