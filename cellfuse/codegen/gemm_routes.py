"""How a GEMM runs: cuBLAS's float32 GEMM, or on tensor cores with float32's accuracy, each float32 product
as three fp16 ones (f16x3: split copies of its operands, scaled by powers of two per row of A and column
of W or one per operand, one cuBLAS fp16 GEMM over 3K into float32 and a pass that undoes the scales its
alpha did not: see gemm_splits.cuh), or through the
warpgroup GEMM that splits its operands into TF32 pieces as it loads them (`cuda_wgmma`). The rule is
decided here once: the lowering records each GEMM instruction's route (`route`), the executors follow
it, and the exported .cu, whose seq and batch are chosen at run time, carries the same rule as C
(`TENSOR_CORE_RULE`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..graph_model import CellError
from .address import Expr, as_expr
from .dtypes import FLOAT32
from .kernel_abi import BLOCK
from .plan import GemmLaunch

# A GEMM of at least this many multiply-adds runs on tensor cores with float32's accuracy (see
# gemm_splits.cuh). On an H100 3xTF32 took the LSTM's 6400 x 2048 x 512 input GEMM much less time than
# cuBLAS's float32 GEMM, as accurately (docs/results/2026-11-26-persistent-rungs-changes-1-to-13.md,
# change 4), and three fp16 products take half 3xTF32's time; a smaller GEMM gains less than its splits
# and the pass after it cost, and one of few rows or columns (a column sum) is bound by memory, which the
# splits triple.
F16X3_MIN_MACS = 2**30
F16X3_MIN_SIDE = 64
# ... and of K at most this. Tensor cores add a GEMM's products in float32 but keep fewer of their low
# bits as they align them, so the sum's error grows with K where float32's stays near its rounding: the
# LSTM's weight gradients (K = T x B) on an H200 were 1.9e-5 from float64 at K = 6,400 and 1.8e-4 at
# K = 64,000 (beyond float32's 1e-4) with 3xTF32, against 2.2e-6 to 2.7e-6 with cuBLAS's float32 GEMM and
# cuDNN (docs/results/2026-11-29-sixteen-bit-module-calls.md, "A weight's gradient over a long sequence");
# three fp16 products were as accurate as 3xTF32 at K = 6,400 (1.5e-5 against 1.6e-5).
F16X3_MAX_K = 8192

# The warpgroup GEMM's tiles: a block's columns of C, and the values of K of a stage (see cuda_wgmma)
WGMMA_COLUMNS = 256
WGMMA_STAGE_K = 32

# float32: cuBLAS's float32 GEMM. f16x3: split copies, cuBLAS's fp16 GEMM over 3K, the pass undoing the
# scales. f16x3-or-wgmma: as f16x3, or, on a GPU with sm_90a's instructions, the warpgroup GEMM (3xTF32),
# whichever runs the shape faster there (measured once per shape and process, see
# gpu_runtime.wgmma_gemms). 16-bit: a GEMM of a bf16 or fp16 plan, cublasGemmEx multiplying in the 16-bit
# type on tensor cores, accumulating in float32.
Route = Literal["float32", "f16x3", "f16x3-or-wgmma", "16-bit"]


def on_tensor_cores(rows: int, n: int, k: int) -> bool:
    """Whether a GEMM of these rows, columns and K runs on tensor cores with float32's accuracy (else
    float32): where it is large enough, and its K short enough for float32's accuracy (F16X3_MAX_K)."""
    return (rows * n * k >= F16X3_MIN_MACS and min(rows, n, k) >= F16X3_MIN_SIDE
            and k <= F16X3_MAX_K)


# The same rule as C, for the exported launcher (its sizes in size_t, the product in double).
TENSOR_CORE_RULE = f"""\
static int cf_f16x3(size_t rows, size_t n, size_t k) {{
    return (double)rows * n * k >= {F16X3_MIN_MACS}.0 && rows >= {F16X3_MIN_SIDE} && \
n >= {F16X3_MIN_SIDE} && k >= {F16X3_MIN_SIDE} && k <= {F16X3_MAX_K};
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
    return "f16x3-or-wgmma" if wgmma_shape_fits(g.n, g.k, g.trans_a) else "f16x3"


def may_run_on_tensor_cores(g: GemmLaunch) -> bool:
    """Whether a GEMM may run on tensor cores at some seq and batch (the exported launcher asks the rule at
    run time where it may): a weight's gradient sums over seq * batch rows (its K), a column sum never."""
    if g.row_kind in ("input", "hidden"):
        return min(g.m, g.n) >= F16X3_MIN_SIDE
    return g.row_kind != "one" and min(g.n, g.k) >= F16X3_MIN_SIDE and g.k <= F16X3_MAX_K


SIDE_BY_SIDE, STACKED, TRANSPOSED = 0, 1, 2  # the layouts of cf_split_f16x3_copies's copies
MAX_ROWS = 256  # gemm_splits.cuh's CF_MAX_ROWS: the rows a block of cf_f16x3_maxima takes of 32 columns
RANGE_WORDS = 4  # gemm_splits.cuh's CF_RANGE_WORDS: an operand's range of largest magnitudes, after them
UNSCALE_ROWS = 8  # see unscale_threads
_ALIGN = 256  # bytes: where each part of the workspace starts (cuBLAS's fastest kernels want it)


def split_threads(rows: Expr | int, cols: Expr | int, layout: int) -> Expr:
    """The threads cf_split_f16x3_copies runs with for a source of `rows` x `cols`: a warp per row side by
    side, BLOCK per 32 x 32 tile where it transposes, else one per 4 columns of a row."""
    rows, cols = as_expr(rows), as_expr(cols)
    if layout == SIDE_BY_SIDE:
        return 32 * rows
    if layout == TRANSPOSED:
        return BLOCK * ((rows + 31) // 32) * ((cols + 31) // 32)
    return rows * ((cols + 3) // 4)


def maxima_threads(rows: Expr | int, cols: Expr | int) -> Expr:
    """The threads cf_f16x3_maxima runs with for a source of `rows` x `cols` (whose columns' maxima it
    finds): BLOCK per 32 columns of MAX_ROWS rows."""
    rows, cols = as_expr(rows), as_expr(cols)
    return BLOCK * ((cols + 31) // 32) * ((rows + (MAX_ROWS - 1)) // MAX_ROWS)


def unscale_threads(rows: Expr | int, n: Expr | int, rows_a_thread: int = 1) -> Expr:
    """The threads cf_f16x3_unscale_sums runs with for C of `rows` x `n`: one per 4 columns of every
    `rows_a_thread`-th row, striding over the rest. A pass with nothing to do (the GEMM's alpha undid the
    scales and there is nothing to add) returns at once in each block, yet with one thread per 4 columns
    of every row it still took 12 us after the LSTM's input GEMM at B=64 on an H200 (12,800 blocks) and
    40 us at B=256: f16x3_steps gives UNSCALE_ROWS where that is likely, 1 where the pass has work for
    certain (a bias, C to add onto), so that a small C (a weight's gradient, 512 x 2048) keeps its blocks."""
    return (as_expr(rows) + (rows_a_thread - 1)) // rows_a_thread * ((as_expr(n) + 3) // 4)


def _aligned(nbytes: Expr) -> Expr:
    return (nbytes + (_ALIGN - 1)) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class Operand:
    """How one operand of a GEMM on tensor cores is split: its source's rows, columns and row length, its
    layout, the copy that is its lo piece, and where its copies and its largest magnitudes go (bytes into
    the workspace for A, into W's region for W; one magnitude per source row side by side, found by
    cf_f16x3_row_maxima; else per source column, by cf_f16x3_maxima: A's rows, W's columns), their range
    (RANGE_WORDS words, `range`) right after them."""

    rows: Expr
    cols: Expr
    ld: Expr
    layout: int
    lo_piece: int
    pieces: Expr
    maxima: Expr

    @property
    def per_column(self) -> bool:
        return self.layout != SIDE_BY_SIDE

    @property
    def scales(self) -> Expr:
        """How many largest magnitudes it has."""
        return self.cols if self.per_column else self.rows

    @property
    def range(self) -> Expr:
        """Where the range of its largest magnitudes goes (see gemm_splits.cuh)."""
        return self.maxima + 4 * self.scales


@dataclass(frozen=True)
class F16x3Layout:
    """How a GEMM on tensor cores (see gemm_splits.cuh) uses its workspace, for the executors (ints: the
    expressions are constants) and the exported launcher (expressions of seq and batch) alike: A's and
    W's splits, the copies' row lengths (A's always [rows, 3K], K contiguous, which the GEMM reads
    untransposed: where A is stored transposed, a weight gradient's x^T, its split transposes it), the
    GEMM's alpha and beta (`scalars`, float32s that A's split writes: cuBLAS reads them from device
    memory), where the GEMM's float32 sums go (C itself, or, where the GEMM accumulates onto C, `sums` in
    the workspace, row length n) and the workspace's bytes. W's copies, largest magnitudes and their range
    are a region of their own at the workspace's end (`kept_at`, `kept_bytes`; W's offsets are within it):
    they depend on W alone, so that an executor may keep them elsewhere, made once per change of the
    weights."""

    a: Operand
    w: Operand
    lda3: Expr
    ldw3: Expr
    scalars: Expr
    sums: Expr | None
    kept_at: Expr
    kept_bytes: Expr

    @property
    def nbytes(self) -> Expr:
        return self.kept_at + self.kept_bytes


def f16x3_layout(g: GemmLaunch, rows: Expr | int, k: Expr | int) -> F16x3Layout:
    """The workspace of a GEMM on tensor cores computing `rows` rows over `k` (the GEMM's)."""
    rows, k, n, lda = as_expr(rows), as_expr(k), as_expr(g.n), as_expr(g.a.ld)
    a_pieces = as_expr(0)
    a_max = a_pieces + _aligned(2 * 3 * rows * k)
    scalars = a_max + _aligned(4 * (rows + RANGE_WORDS))
    end = scalars + _aligned(as_expr(8))
    sums = end if g.accumulate else None
    if sums is not None:
        end = end + _aligned(4 * rows * n)
    w_pieces, w_max = as_expr(0), _aligned(2 * 3 * k * n)  # within W's region, at `end`
    a = (Operand(k, rows, lda, TRANSPOSED, 2, a_pieces, a_max) if g.trans_a
         else Operand(rows, k, lda, SIDE_BY_SIDE, 2, a_pieces, a_max))
    w = (Operand(n, k, k, SIDE_BY_SIDE, 1, w_pieces, w_max) if g.trans_w
         else Operand(k, n, n, STACKED, 1, w_pieces, w_max))
    return F16x3Layout(a, w, 3 * k, 3 * k if g.trans_w else n, scalars, sums, end,
                       w_max + _aligned(4 * (n + RANGE_WORDS)))


@dataclass(frozen=True)
class Ref:
    """An address a step of a GEMM on tensor cores reads or writes: one of the GEMM's own ("a", "w", "c",
    "bias": null where it has none), a byte offset into its workspace ("workspace") or into W's region
    ("kept": its copies and largest magnitudes, see F16x3Layout), its elements of `ctype`, as the exported
    launcher casts it."""

    of: Literal["a", "w", "c", "bias", "workspace", "kept"]
    offset: Expr | int = 0
    ctype: str = "float"


@dataclass(frozen=True)
class Step:
    """One call of a GEMM on tensor cores (`f16x3_steps`): "zero" (args: where, 32-bit words), "kernel" (a
    kernel of gemm_splits.cuh by `name`, with `threads` threads of BLOCK a block, and its arguments; 0 for
    a null pointer) or "gemm" (cuBLAS's fp16 GEMM over 3K into float32; args: W's copies, their row
    length, A's, theirs, the sums, theirs, and the device address of its alpha and beta: cuBLAS's W first,
    as the float32 GEMM). `of_w`: a step that makes W's region (W's maxima, their range and W's copies),
    which depends on W alone."""

    kind: Literal["zero", "kernel", "gemm"]
    name: str
    args: tuple
    threads: Expr | int = 0
    of_w: bool = False


def f16x3_steps(g: GemmLaunch, rows: Expr | int, k: Expr | int) -> list[Step]:
    """The calls of a GEMM on tensor cores computing `rows` rows over `k`, in order, the one sequence the
    executors and the exported launcher each put in their own terms: each operand's maxima and their range
    (zeroed first: the kernels fold them in by atomics) and its copies (W's first, `of_w`; A's split writes
    the GEMM's alpha), the fp16 GEMM into C or the workspace's sums, then the pass that undoes the scales
    the alpha did not, adds the bias and accumulates (see gemm_splits.cuh)."""
    lay = f16x3_layout(g, rows, k)
    w_range = Ref("kept", lay.w.range, "unsigned")
    scalars = Ref("workspace", lay.scalars)
    steps: list[Step] = []
    for part, source, region in ((lay.w, Ref("w"), "kept"), (lay.a, Ref("a"), "workspace")):
        maxima, of_w = Ref(region, part.maxima), region == "kept"
        span = w_range if of_w else Ref(region, part.range, "unsigned")
        if part.per_column:
            steps += [Step("zero", "zeroing the column maxima", (maxima, part.scales + RANGE_WORDS),
                           of_w=of_w),
                      Step("kernel", "cf_f16x3_maxima", (maxima, span, source, part.rows, part.cols, part.ld),
                           maxima_threads(part.rows, part.cols), of_w)]
        else:
            steps += [Step("zero", "zeroing the row maxima's range", (span, RANGE_WORDS), of_w=of_w),
                      Step("kernel", "cf_f16x3_row_maxima", (maxima, span, source, part.rows, part.cols,
                                                             part.ld),
                           split_threads(part.rows, part.cols, SIDE_BY_SIDE), of_w)]
        steps.append(Step("kernel", "cf_split_f16x3_copies",
                          (Ref(region, part.pieces, "__half"), source, maxima, span,
                           *((0, 0) if of_w else (w_range, scalars)), part.rows, part.cols, part.ld,
                           part.layout, part.lo_piece),
                          split_threads(part.rows, part.cols, part.layout), of_w))
    sums, ldd = (Ref("workspace", lay.sums), as_expr(g.n)) if lay.sums is not None else (Ref("c"), g.c.ld)
    a_pieces, w_pieces = Ref("workspace", lay.a.pieces, "__half"), Ref("kept", lay.w.pieces, "__half")
    a_max, w_max = Ref("workspace", lay.a.maxima), Ref("kept", lay.w.maxima)
    a_range = Ref("workspace", lay.a.range, "unsigned")
    steps += [Step("gemm", "cuBLAS's fp16 GEMM",
                   (w_pieces, lay.ldw3, a_pieces, lay.lda3, sums, ldd, scalars)),
              Step("kernel", "cf_f16x3_unscale_sums",
                   (Ref("c"), sums, a_max, a_range, w_max, w_range, Ref("bias"), as_expr(rows), g.n, g.c.ld,
                    ldd, int(bool(g.accumulate))),
                   unscale_threads(rows, g.n, 1 if g.accumulate or g.bias else UNSCALE_ROWS))]
    return steps


def workspace_bytes(g: GemmLaunch, rows: int, route: Route, w_kept: bool = False) -> int:
    """The bytes of workspace a GEMM on tensor cores computing `rows` rows needs in an executor: its
    f16x3_layout's, or, where its route may take the warpgroup GEMM, that GEMM's image of W (2 k n floats)
    if larger; where what it makes of W is kept elsewhere (`w_kept`: W's region and image, made when the
    weights change), the layout's up to W's region alone."""
    lay = f16x3_layout(g, rows, g.k)
    if w_kept:
        return int(lay.kept_at)
    image = 4 * 2 * g.n * g.k if route == "f16x3-or-wgmma" else 0
    return max(int(lay.nbytes), image)


GEMM_DEFAULT_ALGO = -1  # cublasGemmAlgo_t of cublasGemmEx: cuBLAS's own choice


def gemm_ex_types(g: GemmLaunch) -> tuple[tuple[int, int, int], int]:
    """cublasGemmEx's types of a 16-bit route's GEMM: (W's, A's, C's cudaDataType_t) and its
    cublasComputeType_t. Operands of the 16-bit type multiply as they are,
    accumulating in float32; float32 operands (a float32 state times its weights) are multiplied with
    cuBLAS's "fast" compute type for the 16-bit type (as precisely as TF32, on an H200: see
    precision.py)."""
    w = g.w_dtype
    if g.a.dtype != w:
        raise CellError(f"the GEMM of {g.group} multiplies {g.a.dtype.name} by {w.name} weights: cuBLAS "
                        "multiplies operands of one type")
    compute = FLOAT32.fast_compute if w != FLOAT32 else g.multiply.fast_compute
    return (w.cuda, g.a.dtype.cuda, g.c.dtype.cuda), compute
