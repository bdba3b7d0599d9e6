"""A 16-bit plan's GEMMs of float32 operands (a float32 state times its weights, the weights' gradient of
a persistent loop's float32 h): cublasGemmEx as the plan runs them today, its compute type the 16-bit
type's "fast" one (cuBLAS rounds the operands as it multiplies them), against the same call with TF32's
compute type, with float32's, and against converting both operands to the 16-bit type first and
multiplying those. Each one's time (CUDA events, median of REPS calls) and its largest error relative to
the largest magnitude of the float64 product.

    python3 benchmarks/probes/float32_operand_gemm_probe.py [--precision bf16]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from nvmath.bindings import cublas

REPS = 50
R_32F, R_16F, R_16BF = 0, 2, 14  # cudaDataType_t
COMPUTE = {"32F": 68, "FAST_16F": 74, "FAST_16BF": 75, "FAST_TF32": 77}
# (what, m, n, k, trans_a): C[m, n] = op(A) @ W with A [k, m] transposed (a weights' gradient, A^T @ dC)
# or A [m, k]
SHAPES = [("LSTM's dU at B=64 (h^T @ dgates, T=100)", 512, 2048, 6400, True),
          ("LSTM's dU at B=256", 512, 2048, 25600, True),
          ("GRU's step h @ U at B=8", 8, 1536, 512, False),
          ("GRU's step h @ U at B=64", 64, 1536, 512, False),
          ("GRU's step h @ U at B=256", 256, 1536, 512, False)]


def timed(fn) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(REPS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def one_shape(handle, what: str, m: int, n: int, k: int, trans_a: bool, precision: str) -> None:
    half, half_type, fast = ((torch.bfloat16, R_16BF, "FAST_16BF") if precision == "bf16"
                             else (torch.float16, R_16F, "FAST_16F"))
    one, zero = torch.ones(1, dtype=torch.float32), torch.zeros(1, dtype=torch.float32)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((k, m) if trans_a else (m, k), device="cuda", generator=g)
    w = torch.randn(k, n, device="cuda", generator=g)
    c = torch.empty(m, n, device="cuda")
    want = (a.double().T if trans_a else a.double()) @ w.double()
    a_half, w_half = a.to(half), w.to(half)

    def gemm(a_ptr: int, w_ptr: int, dtype: int, compute: int) -> None:
        # row-major C = op(A) @ W is column-major C^T = W^T @ op(A)^T
        cublas.gemm_ex(handle, 0, int(trans_a), n, m, k, one.data_ptr(), w_ptr, dtype, n, a_ptr, dtype,
                       m if trans_a else k, zero.data_ptr(), c.data_ptr(), R_32F, n, compute, -1)

    def converted() -> None:
        ah, wh = a.to(half), w.to(half)
        gemm(ah.data_ptr(), wh.data_ptr(), half_type, COMPUTE["32F"])

    runs = {f"float32 operands, {name}": (lambda cmp=cmp: gemm(a.data_ptr(), w.data_ptr(), R_32F, cmp))
            for name, cmp in COMPUTE.items() if name in ("32F", fast, "FAST_TF32")}
    runs[f"{precision} operands (made already)"] = lambda: gemm(a_half.data_ptr(), w_half.data_ptr(),
                                                               half_type, COMPUTE["32F"])
    runs[f"{precision} operands converted first (both)"] = converted
    print(f"\n{what}: m={m} n={n} k={k}")
    for name, fn in runs.items():
        ms = timed(fn)
        error = float((c.double() - want).abs().max() / want.abs().max())
        print(f"  {name:45s} {ms:8.4f} ms   error {error:.2e}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precision", choices=["bf16", "fp16"], default="bf16")
    args = p.parse_args()
    handle = cublas.create()
    cublas.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    print(f"{torch.cuda.get_device_name()}, {args.precision}; ms (median of {REPS}) and the largest error "
          "relative to the largest magnitude of the float64 product")
    for shape in SHAPES:
        one_shape(handle, *shape, args.precision)
    cublas.destroy(handle)


if __name__ == "__main__":
    main()
