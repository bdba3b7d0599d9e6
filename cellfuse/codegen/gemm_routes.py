"""How a GEMM runs: cuBLAS's float32 GEMM, or on tensor cores with float32's accuracy (3xTF32), through
split copies of its operands and one cuBLASLt TF32 GEMM over 3K, or through the warpgroup GEMM that
splits them as it loads them (`cuda_wgmma`). The rule is decided here once: the lowering records each
GEMM instruction's route (`route`), the executors follow it, and the exported .cu, whose seq and batch
are chosen at run time, carries the same rule as C (`TENSOR_CORE_RULE`).
"""

from __future__ import annotations

from typing import Literal

from ..graph_model import CellError
from .address import Expr, as_expr
from .dtypes import FLOAT32
from .kernel_abi import BLOCK
from .plan import GemmLaunch

# A GEMM of at least this many multiply-adds runs on tensor cores with float32's accuracy: each operand
# split into TF32 parts (`cf_split_tf32x3` in every module) and the three products that matter summed by
# one cuBLAS TF32 GEMM over 3K. On an H100 that took the LSTM's 6400 x 2048 x 512 input GEMM much less
# time than cuBLAS's float32 GEMM, as accurately
# (docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md, change 4); a smaller GEMM gains less than
# its two splits cost, and one of few rows or columns (a column sum) is bound by memory, which the splits
# triple.
TF32X3_MIN_MACS = 2**30
TF32X3_MIN_SIDE = 64
# ... and of K at most this. Tensor cores add a GEMM's products in float32 but keep fewer of their low
# bits as they align them, so a 3xTF32 sum's error grows with K where float32's stays near its rounding:
# the LSTM's weight gradients (K = T x B) on an H200 were 1.9e-5 from float64 at K = 6,400 and 1.8e-4 at
# K = 64,000 (beyond float32's 1e-4), against 2.2e-6 to 2.7e-6 with cuBLAS's float32 GEMM and cuDNN
# (docs/results/2026-11-29-sixteen-bit-module-calls.md, "A weight's gradient over a long sequence").
TF32X3_MAX_K = 8192

# The warpgroup GEMM's tiles: a block's columns of C, and the values of K of a stage (see cuda_wgmma)
WGMMA_COLUMNS = 256
WGMMA_STAGE_K = 32

# float32: cuBLAS's float32 GEMM. tf32x3: split copies and cuBLASLt's TF32 GEMM over 3K. tf32x3-wgmma: as
# tf32x3, or, on a GPU with sm_90a's instructions, the warpgroup GEMM, whichever runs the shape faster
# there (measured once per shape and process, see gpu_runtime.wgmma_gemms). 16-bit: a GEMM of a bf16 or
# fp16 plan, cublasGemmEx multiplying in the 16-bit type on tensor cores, accumulating in float32.
Route = Literal["float32", "tf32x3", "tf32x3-wgmma", "16-bit"]


def on_tensor_cores(rows: int, n: int, k: int) -> bool:
    """Whether a GEMM of these rows, columns and K runs as 3xTF32 on tensor cores (else float32): where
    it is large enough, and its K short enough for float32's accuracy (TF32X3_MAX_K)."""
    return (rows * n * k >= TF32X3_MIN_MACS and min(rows, n, k) >= TF32X3_MIN_SIDE
            and k <= TF32X3_MAX_K)


# The same rule as C, for the exported launcher (its sizes in size_t, the product in double).
TENSOR_CORE_RULE = f"""\
static int cf_tf32x3(size_t rows, size_t n, size_t k) {{
    return (double)rows * n * k >= {TF32X3_MIN_MACS}.0 && rows >= {TF32X3_MIN_SIDE} && \
n >= {TF32X3_MIN_SIDE} && k >= {TF32X3_MIN_SIDE} && k <= {TF32X3_MAX_K};
}}"""


def wgmma_shape_fits(n: int, k: int, trans_a: bool) -> bool:
    """Whether a GEMM's shape suits the warpgroup GEMM: x not transposed, whole tiles of columns and
    stages of K (the rows may end anywhere)."""
    return not trans_a and n % WGMMA_COLUMNS == 0 and k % WGMMA_STAGE_K == 0 and n > 0 and k > 0


def route(g: GemmLaunch, rows: int) -> Route:
    """The route of a GEMM computing `rows` rows."""
    if g.multiply != FLOAT32:
        return "16-bit"
    if not on_tensor_cores(rows, g.n, g.k):
        return "float32"
    return "tf32x3-wgmma" if wgmma_shape_fits(g.n, g.k, g.trans_a) else "tf32x3"


def may_run_on_tensor_cores(g: GemmLaunch) -> bool:
    """Whether a GEMM may run on tensor cores at some seq and batch (the exported launcher asks the rule at
    run time where it may): a weight's gradient sums over seq * batch rows (its K), a column sum never."""
    if g.row_kind in ("input", "hidden"):
        return min(g.m, g.n) >= TF32X3_MIN_SIDE
    return g.row_kind != "one" and min(g.n, g.k) >= TF32X3_MIN_SIDE and g.k <= TF32X3_MAX_K


SIDE_BY_SIDE, STACKED, TRANSPOSED = 0, 1, 2  # the layouts of cf_split_tf32x3's copies


def split_threads(rows: Expr | int, cols: Expr | int, layout: int) -> Expr:
    """The threads cf_split_tf32x3 runs with for a source of `rows` x `cols`: one per 32 x 32 tile and
    per BLOCK threads where it transposes, else one per 4 columns of a row."""
    rows, cols = as_expr(rows), as_expr(cols)
    if layout == TRANSPOSED:
        return BLOCK * ((rows + 31) // 32) * ((cols + 31) // 32)
    return rows * ((cols + 3) // 4)


def tf32x3_layout(g: GemmLaunch, rows: Expr | int, k: Expr | int) -> tuple[tuple, tuple, Expr, Expr, Expr]:
    """How a GEMM on tensor cores (see `cf_split_tf32x3`) splits its operands, for the executor (ints: the
    expressions are constants) and the exported launcher (expressions of seq and batch) alike: for A and
    for W, the source's (rows, cols, row length, layout, the piece that is lo), then the split copies' row
    lengths, A's and W's, and where W's copies start, in floats after A's. A's copies are always [rows,
    3K], K contiguous, which the GEMM reads untransposed: where A is stored transposed (a weight
    gradient's x^T), its split transposes it. `rows` and `k` are the GEMM's."""
    rows, k, n, lda = as_expr(rows), as_expr(k), as_expr(g.n), as_expr(g.a.ld)
    a = (k, rows, lda, TRANSPOSED, 2) if g.trans_a else (rows, k, lda, SIDE_BY_SIDE, 2)
    w = (n, k, k, SIDE_BY_SIDE, 1) if g.trans_w else (k, n, n, STACKED, 1)
    return a, w, 3 * k, 3 * k if g.trans_w else n, 3 * rows * k


GEMM_DEFAULT_ALGO = -1  # cublasGemmAlgo_t of cublasGemmEx: cuBLAS's own choice


def gemm_ex_types(g: GemmLaunch) -> tuple[tuple[int, int, int], int]:
    """cublasGemmEx's types of a 16-bit route's GEMM: (W's, A's, C's cudaDataType_t) and its
    cublasComputeType_t. Operands of the 16-bit type multiply as they are,
    accumulating in float32; float32 operands (a float32 state times its weights) are rounded to the
    16-bit type as cuBLAS multiplies them (its "fast" compute types)."""
    w = g.w_dtype
    if g.a.dtype != w:
        raise CellError(f"the GEMM of {g.group} multiplies {g.a.dtype.name} by {w.name} weights: cuBLAS "
                        "multiplies operands of one type")
    compute = FLOAT32.fast_compute if w != FLOAT32 else g.multiply.fast_compute
    return (w.cuda, g.a.dtype.cuda, g.c.dtype.cuda), compute
