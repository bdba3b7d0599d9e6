"""Whether the GEMMs outside the loop could scale A by one power of two for the whole matrix instead of
one per row (gemm_splits.cuh's split copies), on the CPU: with one scale for A and one for W, cuBLASLt
could undo them itself (a scalar alpha; it refuses vectors of them with fp16 operands), and the pass
that undoes per-row and per-column scales (42 us of the LSTM's forward at B=64 on an H200) would not be
needed where the rows' largest magnitudes lie close enough together.

A [rows, K] has rows whose magnitudes spread log-uniformly over 2^-k .. 1; W [K, N] is normal(0, 0.04).
C = A @ W is computed from the three fp16 pieces of each operand (the tests' emulation of the kernels'
pieces, tests/f16x3_pieces.py, products summed in float32), once with A's rows scaled each by its own
power of two (today's split), once with one scale for all of A; the error against float64 is given
relative to C's largest magnitude and, row by row, relative to each row's (the worst row).

    python benchmarks/probes/one_scale_accuracy.py [--rows 1024] [--k 512] [--n 1024]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from f16x3_pieces import f16x3_pieces, f16x3_scale  # noqa: E402  (the tests' emulation of the pieces)

SPREADS = (0, 8, 16, 20, 22, 24, 30)  # k: the rows' largest magnitudes span 2^k


def f16x3_gemm(A: np.ndarray, row_scales: np.ndarray, W: np.ndarray, col_scales: np.ndarray) -> np.ndarray:
    """A @ W from the scaled operands' fp16 pieces (A's hi, hi / 2^11, lo against W's hi, lo, hi / 2^11:
    one GEMM over 3K), the scales undone after."""
    a = np.concatenate([p.astype(np.float32) for p in f16x3_pieces(A * row_scales[:, None], 2)], 1)
    w = np.concatenate([p.astype(np.float32) for p in f16x3_pieces(W * col_scales[None, :], 1)], 0)
    return (a @ w) / row_scales[:, None] / col_scales[None, :]


def errors(C: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """The largest error relative to the largest output, and the worst row's relative to its own."""
    e = np.abs(C - ref)
    return float(e.max() / np.abs(ref).max()), float((e.max(1) / np.abs(ref).max(1)).max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1024)
    p.add_argument("--k", type=int, default=512)
    p.add_argument("--n", type=int, default=1024)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    W = (rng.standard_normal((args.k, args.n)) * 0.04).astype(np.float32)
    col_scales = f16x3_scale(np.abs(W).max(0))
    print(f"C[{args.rows}, {args.n}] over K = {args.k}; errors: of the largest output / the worst row's own")
    print("| rows spread over | per-row scales | one scale for A | float32 matmul |")
    print("|---|---|---|---|")
    for k in SPREADS:
        magnitudes = np.exp2(rng.uniform(-k, 0, args.rows)).astype(np.float32)
        A = (rng.standard_normal((args.rows, args.k)) * magnitudes[:, None]).astype(np.float32)
        ref = A.astype(np.float64) @ W.astype(np.float64)
        per_row = f16x3_gemm(A, f16x3_scale(np.abs(A).max(1)), W, col_scales)
        one = f16x3_gemm(A, np.full(args.rows, f16x3_scale(np.abs(A).max()), np.float32), W, col_scales)
        cells = [errors(C, ref) for C in (per_row, one, A @ W)]
        print(f"| 2^{k} | " + " | ".join(f"{a:.1e} / {b:.1e}" for a, b in cells) + " |")


if __name__ == "__main__":
    main()
