"""Three fp16 products for the GEMMs outside the time loop (the input projection, a backward pass's dx
and dW), which ran as 3xTF32 through split copies and cuBLASLt when it was written (the library now runs
"f16x3 rows", gemm_splits.cuh): what they would cost and how accurate they are, two ways of undoing the
scales that keep fp16's pieces in range.

- "f16x3 rows": A's rows and W's columns each scaled by their own power of two (as the tensor rung's
  persistent kernels do), one fp16 GEMM over 3K into float32, then a pass over C undoing both scales
  and adding the bias (timed as torch's elementwise ops, two passes where a fused kernel would make one).
- "f16x3 alpha": A scaled by one power of two for the whole tensor and W's columns by their own; one
  cuBLASLt GEMM whose alpha is a vector (CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO: one value
  per row of cuBLAS's D, our columns) undoing both, and whose epilogue adds the bias: no pass of its own.
  A scale for the whole of A keeps fewer bits of the rows far below its largest ("wide" data: each row
  of A scaled by 2^-u, u uniform in [0, 20]), which the per-row error shows.
- "3xtf32": the GEMM over 3K of today's route (its split copies not counted, as the f16x3 ways' are not).

Errors: the largest difference from a float64 product (plus bias) over the largest magnitude ("err"),
and the worst row's own ("row err": its largest difference over its own largest magnitude). Needs
PyTorch with CUDA and nvmath-python:

    python3 benchmarks/probes/f16x3_outside_gemm_probe.py OUT.json
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np
import torch
from tf32x3_cublas_probe import f16x3_pieces, median_ms, tf32  # (beside this file)

SHAPES = {"input 6400x512 @ 512x2048": (6400, 512, 2048),
          "B256 input 25600x512 @ 512x2048": (25600, 512, 2048),
          "dx 6400x2048 @ 2048x512": (6400, 2048, 512), "dW 512x6400 @ 6400x2048": (512, 6400, 2048)}
_R_16F, _R_32F, _COMPUTE_32F = 2, 0, 68  # cudaDataType, cublasComputeType_t
_ALPHA_VECTOR_BETA_ZERO, _EPILOGUE_BIAS = 3, 4
WORKSPACE = 32 << 20


class LtAlphaVector:
    """D[N, M] (column-major; our C[M, N]) = alpha[N] * (G3^T-as-stored @ F3) + bias[N] by cuBLASLt."""

    def __init__(self, M: int, N: int, K3: int):
        from nvmath.bindings import cublasLt as lt

        self.lt, self.handle = lt, lt.create()
        self.desc = lt.matmul_desc_create(_COMPUTE_32F, _R_32F)
        self._set(lt.MatmulDescAttribute.POINTER_MODE, np.array([_ALPHA_VECTOR_BETA_ZERO], np.int32))
        self._set(lt.MatmulDescAttribute.EPILOGUE, np.array([_EPILOGUE_BIAS], np.uint32))
        self.a = lt.matrix_layout_create(_R_16F, N, K3, N)  # W's pieces [3K, N] row-major
        self.b = lt.matrix_layout_create(_R_16F, K3, M, K3)  # A's pieces [M, 3K] row-major
        self.c = lt.matrix_layout_create(_R_32F, N, M, N)
        self.workspace = torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda")
        preference = lt.matmul_preference_create()
        limit = np.array([WORKSPACE], np.uint64)
        lt.matmul_preference_set_attribute(preference, lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES,
                                           limit.ctypes.data, limit.nbytes)
        results = lt.MatmulHeuristicResult(1)
        count = np.zeros(1, np.int32)
        lt.matmul_algo_get_heuristic(self.handle, self.desc, self.a, self.b, self.c, self.c, preference, 1,
                                     results.ptr, count.ctypes.data)
        lt.matmul_preference_destroy(preference)
        if not count[0]:
            raise RuntimeError("cuBLASLt offers no algorithm")
        size = lt.matmul_algo_dtype.itemsize
        self.algo = np.frombuffer(ctypes.string_at(results.ptr, size), np.uint8).copy()

    def _set(self, attribute, value: np.ndarray) -> None:
        self.lt.matmul_desc_set_attribute(self.desc, attribute, value.ctypes.data, value.nbytes)

    def __call__(self, F3: torch.Tensor, G3: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor,
                 out: torch.Tensor) -> None:
        self._set(self.lt.MatmulDescAttribute.BIAS_POINTER, np.array([bias.data_ptr()], np.uint64))
        self.lt.matmul(self.handle, self.desc, alpha.data_ptr(), G3.data_ptr(), self.a, F3.data_ptr(), self.b,
                       0, out.data_ptr(), self.c, out.data_ptr(), self.c, self.algo.ctypes.data,
                       self.workspace.data_ptr(), WORKSPACE, torch.cuda.current_stream().cuda_stream)


def measure(M: int, K: int, N: int, wide: bool, g: torch.Generator) -> dict:
    A = torch.randn(M, K, device="cuda", generator=g) * 0.5
    if wide:
        A *= torch.exp2(-20 * torch.rand(M, 1, device="cuda", generator=g))
    W = torch.randn(K, N, device="cuda", generator=g) * 0.05
    bias = torch.randn(N, device="cuda", generator=g) * 0.1
    ref = A.double() @ W.double() + bias.double()

    def errors(C: torch.Tensor) -> dict:
        d = (C.double() - ref).abs()
        rows = d.amax(1) / ref.abs().amax(1).clamp_min(1e-300)
        return {"err": (d.max() / ref.abs().max()).item(), "row err": rows.max().item()}

    r: dict = {}
    torch.backends.cuda.matmul.allow_tf32 = True
    hi, whi = tf32(A), tf32(W)
    A3 = torch.cat([hi, hi, A - hi], 1)
    W3 = torch.cat([whi, W - whi, whi], 0)
    r["3xtf32"] = {**errors(A3 @ W3 + bias), "gemm ms": median_ms(lambda: A3 @ W3)}
    torch.backends.cuda.matmul.allow_tf32 = False

    Wh, Wl, rw = f16x3_pieces(W, 0)  # rw: [1, N]
    G3 = torch.cat([Wh, Wl, (Wh.float() / 2048).half()], 0)
    # per row of A
    Ah, Al, ra = f16x3_pieces(A, 1)  # ra: [M, 1]
    F3 = torch.cat([Ah, (Ah.float() / 2048).half(), Al], 1)
    C = torch.mm(F3, G3, out_dtype=torch.float32)

    def undo(C=C):
        C.mul_(ra).mul_(rw).add_(bias)

    gemm_ms = median_ms(lambda: torch.mm(F3, G3, out_dtype=torch.float32))
    pass_ms = median_ms(undo)
    C = torch.mm(F3, G3, out_dtype=torch.float32)
    undo(C)
    r["f16x3 rows"] = {**errors(C), "gemm ms": gemm_ms, "passes ms (torch, unfused)": pass_ms}
    # one scale for the whole of A, W's columns' undone by cuBLASLt's alpha vector, the bias its epilogue's
    Bh, Bl, r1 = f16x3_pieces(A.reshape(1, -1), 1)  # (one row: all of A)
    Bh, Bl = Bh.reshape(M, K), Bl.reshape(M, K)
    F3 = torch.cat([Bh, (Bh.float() / 2048).half(), Bl], 1).contiguous()
    alpha = (rw * r1).reshape(N).contiguous()
    out = torch.empty(M, N, device="cuda")
    try:
        lt = LtAlphaVector(M, N, 3 * K)
        lt(F3, G3, alpha, bias, out)
        torch.cuda.synchronize()
        r["f16x3 alpha"] = {**errors(out), "gemm ms": median_ms(lambda: lt(F3, G3, alpha, bias, out))}
    except Exception as e:  # (what cuBLASLt says of this pointer mode with these types and epilogue)
        r["f16x3 alpha"] = {"failed": f"{type(e).__name__}: {e}"}
    return r


def main(path: str) -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    results = {}
    for name, shape in SHAPES.items():
        for wide in (False, True):
            key = f"{name}{', wide rows' if wide else ''}"
            results[key] = measure(*shape, wide, g)
            print(key, json.dumps(results[key]), flush=True)
    with open(path, "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f,
                  indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
