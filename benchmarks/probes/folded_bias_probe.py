"""A GEMM outside the time loop that adds a folded bias (the GRU's x @ [W_ir, W_iz, W_in] + b_i*), three
ways: as the plans run it on cuBLAS's routes today (cf_bias_rows writes the bias into every row of C, then
the GEMM accumulates onto it, beta = 1), through cuBLASLt with its bias epilogue (C written once), and the
GEMM alone without the bias (what the fused kernel after it would then add). Each one's time (CUDA events,
median of REPS calls); the bias epilogue's result checked against the other's.

    python3 benchmarks/probes/folded_bias_probe.py
"""

from __future__ import annotations

import ctypes
import statistics
from pathlib import Path

import numpy as np
import pycuda.autoprimaryctx  # noqa: F401  (torch's primary context, shared)
import torch
from nvmath.bindings import cublas, cublasLt
from pycuda.compiler import SourceModule

REPS = 50
R_32F, R_16BF, COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 0, 14, 68, 77
CUDA = Path(__file__).resolve().parents[2] / "cellfuse" / "resources" / "cuda"
# (what, m, n, k, precision): C[m, n] float32 = A[m, k] @ W[k, n] + bias[n]
SHAPES = [("GRU input GEMM T=100 B=8", 800, 1536, 512, "bf16"),
          ("GRU input GEMM T=100 B=64", 6400, 1536, 512, "bf16"),
          ("GRU input GEMM T=100 B=256", 25600, 1536, 512, "bf16"),
          ("GRU input GEMM T=100 B=1 (float32)", 100, 1536, 512, "fp32"),
          ("GRU input GEMM T=100 B=64 (float32)", 6400, 1536, 512, "fp32")]


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


def attribute(desc, which, value, dtype) -> None:
    v = np.array([value], dtype)
    cublasLt.matmul_desc_set_attribute(desc, which, v.ctypes.data, v.nbytes)


def one_shape(handle, lt_handle, bias_rows, what: str, m: int, n: int, k: int, precision: str) -> None:
    stream = torch.cuda.current_stream().cuda_stream  # the default stream, as PyCUDA's launches use
    half = torch.bfloat16 if precision == "bf16" else torch.float32
    dtype = R_16BF if precision == "bf16" else R_32F
    compute = COMPUTE_32F if precision == "bf16" else COMPUTE_32F_FAST_TF32
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=g).to(half)
    w = torch.randn(k, n, device="cuda", generator=g).to(half)
    bias = torch.randn(n, device="cuda", generator=g)
    c = torch.empty(m, n, device="cuda")
    one, zero = torch.ones(1), torch.zeros(1)
    workspace = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")

    def gemm(beta) -> None:  # row-major C = A @ W is column-major C^T = W^T @ A^T
        cublas.gemm_ex(handle, 0, 0, n, m, k, one.data_ptr(), w.data_ptr(), dtype, n, a.data_ptr(), dtype, k,
                       beta.data_ptr(), c.data_ptr(), R_32F, n, compute, -1)

    def today() -> None:
        bias_rows(np.uintp(c.data_ptr()), np.uintp(bias.data_ptr()), np.int32(m), np.int32(n), np.int32(n),
                  block=(256, 1, 1), grid=((m * n + 255) // 256, 1))  # torch's stream: the default one
        gemm(one)

    desc = cublasLt.matmul_desc_create(compute, R_32F)
    attribute(desc, cublasLt.MatmulDescAttribute.EPILOGUE, int(cublasLt.Epilogue.BIAS), np.int32)
    attribute(desc, cublasLt.MatmulDescAttribute.BIAS_POINTER, bias.data_ptr(), np.uint64)
    attribute(desc, cublasLt.MatmulDescAttribute.BIAS_DATA_TYPE, R_32F, np.int32)
    w_lay = cublasLt.matrix_layout_create(dtype, n, k, n)
    a_lay = cublasLt.matrix_layout_create(dtype, k, m, k)
    c_lay = cublasLt.matrix_layout_create(R_32F, n, m, n)
    pref = cublasLt.matmul_preference_create()
    limit = np.array([workspace.numel()], np.uint64)
    cublasLt.matmul_preference_set_attribute(pref, cublasLt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                                             limit.ctypes.data, limit.nbytes)
    results = cublasLt.MatmulHeuristicResult(8)
    count = np.zeros(1, np.int32)
    cublasLt.matmul_algo_get_heuristic(lt_handle, desc, w_lay, a_lay, c_lay, c_lay, pref, 8, results.ptr,
                                       count.ctypes.data)
    size = cublasLt.matmul_heuristic_result_dtype.itemsize
    algos = [np.frombuffer(ctypes.string_at(results.ptr + i * size, cublasLt.matmul_algo_dtype.itemsize),
                           np.uint8).copy() for i in range(int(count[0]))]

    def epilogue(algo) -> None:
        cublasLt.matmul(lt_handle, desc, one.numpy().ctypes.data, w.data_ptr(), w_lay, a.data_ptr(), a_lay,
                        zero.numpy().ctypes.data, c.data_ptr(), c_lay, c.data_ptr(), c_lay, algo.ctypes.data,
                        workspace.data_ptr(), workspace.numel(), stream)

    print(f"\n{what}: m={m} n={n} k={k}, {precision}")
    today()
    torch.cuda.synchronize()
    want = c.clone()
    print(f"  {'today: bias rows, then the GEMM onto them':52s} {timed(today):8.4f} ms")
    print(f"  {'the GEMM alone (beta = 0, no bias)':52s} {timed(lambda: gemm(zero)):8.4f} ms")
    for i, algo in enumerate(algos):
        c.zero_()
        try:
            epilogue(algo)
        except cublasLt.cuBLASLtError as e:
            print(f"  cuBLASLt bias epilogue, candidate {i}: refused ({e})")
            continue
        torch.cuda.synchronize()
        err = float((c - want).abs().max() / want.abs().max())
        ms = timed(lambda algo=algo: epilogue(algo))
        print(f"  {f'cuBLASLt bias epilogue, candidate {i}':52s} {ms:8.4f} ms"
              f"   differs from today's by {err:.1e} of its largest")
    cublasLt.matmul_preference_destroy(pref)
    for lay in (w_lay, a_lay, c_lay):
        cublasLt.matrix_layout_destroy(lay)
    cublasLt.matmul_desc_destroy(desc)


def main() -> None:
    module = SourceModule('#include "gemm_splits.cuh"', include_dirs=[str(CUDA)], no_extern_c=True,
                          options=["-std=c++17"])
    bias_rows = module.get_function("cf_bias_rows")
    handle, lt_handle = cublas.create(), cublasLt.create()
    cublas.set_stream(handle, torch.cuda.current_stream().cuda_stream)
    print(f"{torch.cuda.get_device_name()}; ms, the median of {REPS} calls")
    for shape in SHAPES:
        one_shape(handle, lt_handle, bias_rows, *shape)
    cublas.destroy(handle)
    cublasLt.destroy(lt_handle)


if __name__ == "__main__":
    main()
