"""Whether cuBLASLt can undo the split copies' scales itself: the fp16 GEMM over 3K of the GEMMs outside
the loop (gemm_splits.cuh) with each row of A's copies and each column of W's scaled by a float vector in
the GEMM's epilogue (cuBLASLt's A/B scale mode OUTER_VEC_32F), the bias added there too (epilogue BIAS),
or W's columns' scales as a vector alpha (pointer mode ALPHA_DEVICE_VECTOR_BETA_HOST). Where it can,
the pass that undoes the scales (cf_f16x3_unscale_sums, memory-bound: 42 us of the LSTM's forward at B=64
on an H200) is not needed. Last, for one scale per operand (docs/results/2026-12-02-c): a scalar alpha
read from device memory (pointer mode DEVICE) with the bias epilogue, and whether a CUDA graph that
captured that GEMM reads the alpha as it is at each replay (a value the GPU sets before the GEMM).

For each variant, at the LSTM's input projection (C[T*B, 4H] over K = 3 x 512, H = 512): how many
algorithms cuBLASLt's heuristic offers, whether the fastest computes the scaled product (against numpy,
in float64, from the same fp16 copies), and its time beside the plain GEMM's (medians of CUDA events).

    python3 benchmarks/probes/cublaslt_outer_scales_probe.py [--rows 6400] [--n 2048] [--k 512]
"""

from __future__ import annotations

import argparse
import ctypes
from functools import partial

import numpy as np
import pycuda.autoinit  # noqa: F401
import pycuda.driver as drv
from nvmath.bindings import cublasLt as lt

from cellfuse.gpu_runtime.event_timing import median_ms

R_32F, R_16F, COMPUTE_32F = 0, 2, 68
OUTER_VEC_32F = 3
ALPHA_DEVICE_VECTOR_BETA_HOST = 4
CANDIDATES = 8


def set_attr(desc, attribute, value, dtype=np.int32):
    v = np.array([value], dtype)
    lt.matmul_desc_set_attribute(desc, attribute, v.ctypes.data, v.nbytes)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=6400)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--k", type=int, default=512)
    args = p.parse_args()
    rows, n, k3 = args.rows, args.n, 3 * args.k
    rng = np.random.default_rng(0)
    # the copies as cuBLAS sees them (column-major): W's [n, 3K] (m = n), x's [3K, rows]
    w16 = rng.standard_normal((k3, n)).astype(np.float16)  # row-major [3K, n] = col-major [n, 3K], ld n
    w16_t = np.ascontiguousarray(w16.T)  # row-major [n, 3K] = col-major [3K, n], ld 3K (TRANSA)
    x16 = rng.standard_normal((rows, k3)).astype(np.float16)  # row-major [rows, 3K] = col-major [3K, rows]
    sw = (2.0 ** rng.integers(-20, -5, n)).astype(np.float32)  # W's columns' unscales
    sx = (2.0 ** rng.integers(-20, -5, rows)).astype(np.float32)  # x's rows'
    bias = rng.standard_normal(n).astype(np.float32)
    plain = x16.astype(np.float64) @ w16.astype(np.float64)  # [rows, n]
    d_w, d_wt, d_x = drv.to_device(w16), drv.to_device(w16_t), drv.to_device(x16)
    d_sw, d_sx, d_bias = drv.to_device(sw), drv.to_device(sx), drv.to_device(bias)
    d_c = drv.mem_alloc(4 * rows * n)
    workspace_bytes = 32 << 20
    workspace = drv.mem_alloc(workspace_bytes)
    handle = lt.create()
    one_zero = np.array([1.0, 0.0], np.float32)
    A = lt.MatmulDescAttribute
    variants = {
        "plain NN": dict(trans=False),
        "plain TN": dict(trans=True),
        "NN outer scales + bias": dict(trans=False, outer=True, bias=True),
        "TN outer scales + bias": dict(trans=True, outer=True, bias=True),
        "NN outer scales": dict(trans=False, outer=True),
        "TN outer scales": dict(trans=True, outer=True),
        "NN alpha vector + bias": dict(trans=False, alpha_vector=True, bias=True),
        "TN alpha vector + bias": dict(trans=True, alpha_vector=True, bias=True),
        "NN bias": dict(trans=False, bias=True),
        "NN device alpha": dict(trans=False, device_alpha=True),
        "NN device alpha + bias": dict(trans=False, device_alpha=True, bias=True),
    }
    d_ab = drv.to_device(np.array([2.0 ** -10, 0.0], np.float32))  # a device alpha and beta
    print(f"C[{rows}, {n}] over 3K = {k3}; {drv.Device(0).name()}")
    for name, v in variants.items():
        desc = lt.matmul_desc_create(COMPUTE_32F, R_32F)
        trans = v.get("trans", False)
        if trans:
            set_attr(desc, A.TRANSA, 1)
            a_layout = lt.matrix_layout_create(R_16F, k3, n, k3)
            a_ptr = int(d_wt)
        else:
            a_layout = lt.matrix_layout_create(R_16F, n, k3, n)
            a_ptr = int(d_w)
        b_layout = lt.matrix_layout_create(R_16F, k3, rows, k3)
        c_layout = lt.matrix_layout_create(R_32F, n, rows, n)
        expect = plain.copy()
        if v.get("outer"):
            set_attr(desc, A.A_SCALE_MODE, OUTER_VEC_32F)
            set_attr(desc, A.B_SCALE_MODE, OUTER_VEC_32F)
            set_attr(desc, A.A_SCALE_POINTER, int(d_sw), np.uint64)
            set_attr(desc, A.B_SCALE_POINTER, int(d_sx), np.uint64)
            expect = expect * sx[:, None] * sw[None, :]
        alpha_ptr, beta_ptr = one_zero.ctypes.data, one_zero.ctypes.data + 4
        if v.get("device_alpha"):
            set_attr(desc, A.POINTER_MODE, int(lt.PointerMode.DEVICE))
            alpha_ptr, beta_ptr = int(d_ab), int(d_ab) + 4
            expect = expect * 2.0 ** -10
        if v.get("alpha_vector"):
            set_attr(desc, A.POINTER_MODE, ALPHA_DEVICE_VECTOR_BETA_HOST)
            alpha_ptr = int(d_sw)
            expect = expect * sw[None, :]
        if v.get("bias"):
            set_attr(desc, A.EPILOGUE, int(lt.Epilogue.BIAS), np.uint32)
            set_attr(desc, A.BIAS_POINTER, int(d_bias), np.uint64)
            set_attr(desc, A.BIAS_DATA_TYPE, R_32F)
            expect = expect + bias[None, :]
        pref = lt.matmul_preference_create()
        limit = np.array([workspace_bytes], np.uint64)
        lt.matmul_preference_set_attribute(pref, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                                           limit.ctypes.data, limit.nbytes)
        results = lt.MatmulHeuristicResult(CANDIDATES)
        count = np.zeros(1, np.int32)
        try:
            lt.matmul_algo_get_heuristic(handle, desc, a_layout, b_layout, c_layout, c_layout, pref,
                                         CANDIDATES, results.ptr, count.ctypes.data)
        except lt.cuBLASLtError as e:
            print(f"{name:28s} heuristic refused: {e}")
            continue
        size = lt.matmul_heuristic_result_dtype.itemsize
        algos = [np.frombuffer(ctypes.string_at(results.ptr + i * size, lt.matmul_algo_dtype.itemsize),
                               np.uint8).copy() for i in range(int(count[0]))]
        best = None
        for algo in algos:
            on = partial(lt.matmul, handle, desc, alpha_ptr, a_ptr, a_layout, int(d_x), b_layout,
                         beta_ptr, int(d_c), c_layout, int(d_c), c_layout,
                         algo.ctypes.data, int(workspace), workspace_bytes)  # (the stream last)
            run = partial(on, 0)
            try:
                run()
                drv.Context.synchronize()
            except lt.cuBLASLtError as e:
                print(f"{name:28s} an offered algorithm refused: {e}")
                continue
            t = median_ms(drv, run, None, 20)  # (the default stream, as lt.matmul's 0)
            if best is None or t < best[0]:
                best = (t, run, on)
        if best is None:
            print(f"{name:28s} offered {len(algos)}, none ran")
            continue
        best[1]()
        got = np.empty((rows, n), np.float32)
        drv.memcpy_dtoh(got, d_c)
        err = float(np.abs(got - expect).max() / np.abs(expect).max())
        print(f"{name:28s} offered {len(algos)}; fastest {best[0] * 1e3:8.1f} us; "
              f"largest error {err:.1e} of the largest {'ok' if err < 1e-5 else 'WRONG'}")
        if v.get("device_alpha"):
            want = plain * 2.0 ** -3 + (bias[None, :] if v.get("bias") else 0.0)
            replayed_with_a_new_alpha(best[2], d_ab, d_c, want, rows, n)
    lt.destroy(handle)


def replayed_with_a_new_alpha(on, d_ab, d_c, expect: np.ndarray, rows: int, n: int) -> None:
    """The GEMM (`on(stream)`) captured into a CUDA graph with alpha 2^-10 in device memory, then
    replayed after alpha was set to 2^-3: whether the replay read the new value (`expect`: the result
    with 2^-3)."""
    from cellfuse.gpu_runtime import driver

    cu = driver.bindings()
    stream = driver.new_stream()
    graph = driver.capture(stream, lambda: on(int(stream)), "capturing the GEMM")
    drv.memcpy_htod(d_ab, np.array([2.0 ** -3, 0.0], np.float32))
    driver.check(cu.cuGraphLaunch(graph, stream), "replaying the GEMM")
    driver.check(cu.cuStreamSynchronize(stream), "replaying the GEMM")
    got = np.empty((rows, n), np.float32)
    drv.memcpy_dtoh(got, d_c)
    err = float(np.abs(got - expect).max() / np.abs(expect).max())
    print(f"{'':28s} captured, replayed after alpha changed: largest error {err:.1e} "
          f"{'ok (the replay reads alpha)' if err < 1e-5 else 'WRONG'}")
    drv.memcpy_htod(d_ab, np.array([2.0 ** -10, 0.0], np.float32))
    driver.check(cu.cuGraphExecDestroy(graph), "freeing the graph")
    driver.check(cu.cuStreamDestroy(stream), "freeing the stream")


if __name__ == "__main__":
    main()
