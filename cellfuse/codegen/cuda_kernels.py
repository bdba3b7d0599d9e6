"""CUDA C for the kernels of a Plan: one `__global__` function per fused island (or per node, in
`naive`), written as a CUDA engineer would by hand: one thread per output element, a grid-stride
loop, `__restrict__` pointers, row strides baked in as constants.

A kernel that reduces a row (`row_sum`, `row_mean`) runs a block per row instead, each thread on the
columns j = threadIdx.x + k * BLOCK of it: its body is cut into passes over the row at each reduction,
the row sums go through warp shuffles and shared memory (a variance's come with the sum of what it
deviates from: see `_Deviations`), and the values a later pass needs stay in registers, so that a layer
norm reads its row from global memory once. The adjoint of such a kernel (a
backward pass's, see `adjoint`) runs the same way: its gradients of columns are row sums too."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..graph_model import CellError
from .adjoint import value_kinds
from .plan import GRAD, Access, Const, GemmLaunch, GradInstr, Instr, KernelLaunch, Plan

BLOCK = 256  # threads per block of every elementwise kernel
WARP = 32
# A pass over a row is unrolled where each thread holds at most this many of its columns, so that the
# values kept for a later pass stay in registers; a wider row keeps them in (cached) local memory.
MAX_UNROLLED_COLUMNS = 32
# Floats per thread that a reducing kernel loads in its first pass for a later one (see
# `reduction_kernel_source`), at most: enough for a layer norm's gains, biases and other operands.
EARLY_LOAD_FLOATS = 64
INT_MAX = 2**31 - 1  # the largest count the generated code holds in an int
MAX_STEM = 64  # characters of a cell's name kept in the generated names

# A float32 value as two TF32 ones, for the GEMMs on tensor cores with float32's accuracy: in every
# module (the prelude) and in the warpgroup GEMM's (see cuda_wgmma). Declared `__forceinline__ __device__`,
# device functions only (their bit casts are), where the prelude's math is `__device__ __forceinline__`,
# which the op table's tests compile for the host too.
TF32_PIECES = """\
// v rounded to TF32's 10 bits of mantissa, to nearest, ties away from zero (what cvt.rna.tf32.f32
// does from sm_80 on; in integer arithmetic, so that the prelude builds for any target)
__forceinline__ __device__ float cf_tf32(float v) {
    return __uint_as_float((__float_as_uint(v) + 0x1000u) & 0xffffe000u);
}

// x as hi + lo, hi its rounding to TF32 and lo that of x - hi (exact in float32)
__forceinline__ __device__ void cf_tf32_pieces(float x, float& hi, float& lo) {
    // rounded past FLT_MAX (or x not finite): truncated instead, which keeps inf and NaN as they are (a
    // choice of values, not a branch: the warpgroup GEMM splits between its wgmmas)
    const float rounded = cf_tf32(x);
    hi = isfinite(rounded) ? rounded : __uint_as_float(__float_as_uint(x) & 0xffffe000u);
    lo = cf_tf32(isfinite(x) ? x - hi : 0.0f);
}
"""

PRELUDE = """\
// An op on constants whose float32 result underflows or overflows (1e-38f * 1e-38f) is the float32
// arithmetic the cell asks for, the numpy executor's too: no mistake for nvcc to warn of.
#pragma nv_diag_suppress 222

// The logistic function without overflow: expf only ever sees a non-positive argument. 1 / (1 + z),
// a divisor in [1, 2], is on the device the reciprocal instruction and one Newton step (within an ulp of
// IEEE division, without its checks for zero, huge and subnormal divisors and the slow path they branch
// to, which also kept the compiler from moving the loads of later values above it: with it, the LSTM's
// persistent kernel took 11% longer at B=1 and 6% at B=64 on an H100).
__device__ __forceinline__ float cf_sigmoid(float a) {
    const float z = expf(-fabsf(a)), d = 1.0f + z;
#ifdef __CUDA_ARCH__
    const float r0 = __fdividef(1.0f, d), r = fmaf(fmaf(-d, r0, 1.0f), r0, r0);
#else
    const float r = 1.0f / d;
#endif
    return (a >= 0.0f ? 1.0f : z) * r;
}

// The sum of v over each group of `lanes` lanes of a warp (a power of two, at most 32), in every lane
// of the group (on the device only: warps shuffle there).
__forceinline__ __device__ float cf_lanes_sum(float v, int lanes) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// Over each group of `lanes` lanes (a power of two, at most 32), each lane holding the sum s of `count`
// values of a row and q, the sum of their squared deviations from their own mean: those of all the
// group's values, in every lane of it (Chan, Golub and LeVeque's pairwise update: two halves of n values
// each add (s_a - s_b)^2 / 2n to q).
__forceinline__ __device__ void cf_lanes_deviations(float& s, float& q, int lanes, float count) {
    for (int offset = lanes / 2; offset > 0; offset >>= 1, count *= 2.0f) {
        const float s2 = __shfl_xor_sync(0xffffffffu, s, offset);
        const float q2 = __shfl_xor_sync(0xffffffffu, q, offset);
        const float d = s - s2;
        q += q2 + d * d * (0.5f / count);
        s += s2;
    }
}

// The sum over a row of n values x of (x - m)^2, from their sum s and q, the sum of their squared
// deviations from their own mean: q + n (s / n - m)^2.
__forceinline__ __host__ __device__ float cf_deviations(float s, float q, float m, float n) {
    const float d = s / n - m;
    return fmaf(n * d, d, q);
}

// Broadcasts a bias row into every row of a GEMM's output before the GEMM accumulates into it.
extern "C" __global__ void __launch_bounds__(256) cf_bias_rows(
    float* __restrict__ c, const float* __restrict__ bias, int rows, int n, int ldc)
{
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < (long long)rows * n;
         e += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(e / n), j = (int)(e - (long long)r * n);
        c[(long long)r * ldc + j] = bias[j];
    }
}

TF32_PIECES
// One operand of a GEMM on tensor cores with float32's accuracy (3xTF32): each x is hi + lo, hi its
// rounding to TF32 and lo that of x - hi (exact in float32), so that hi*hi' + hi*lo' + lo*hi' misses the
// product x*x' by about 2^-21 of it, and each of the three TF32 products is exact in float32. The source,
// [rows, cols] with row length ld, is written three times, piece p lo where p == lo_piece and hi
// elsewhere, one copy after the other along the GEMM's K axis, as `layout` says:
//   CF_SIDE_BY_SIDE (0): K runs along the source's rows; out is [rows, 3 * cols]
//   CF_STACKED (1):      K runs down its columns; out is [3 * rows, cols]
//   CF_TRANSPOSED (2):   K runs down its columns; out is [cols, 3 * rows], K along each row, as cuBLAS's
//                        TF32 GEMMs read an operand fastest (read transposed instead, a weight gradient's
//                        x^T took 0.186 ms against 0.129 on an H100: tf32x3_cublas_probe.py)
// A's pieces (hi, hi, lo) against W's (hi, lo, hi) make the three products one GEMM over 3K. Launched
// with 256 threads a block, as many in all as `split_threads` counts.
#define CF_SIDE_BY_SIDE 0
#define CF_STACKED 1
#define CF_TRANSPOSED 2
extern "C" __global__ void __launch_bounds__(256) cf_split_tf32x3(
    float* __restrict__ out, const float* __restrict__ src, int rows, int cols, int ld, int layout,
    int lo_piece)
{
    // Indices are 32-bit (a 64-bit division per element is dozens of instructions): rows * cols < 2^32
    // wherever the three copies, 12 bytes an element, fit in a GPU's memory.
    if (layout == CF_TRANSPOSED) {
        // tiles of 32 x 32 through shared memory, so that both the loads (along a source row) and the
        // stores (along an output row) are coalesced
        __shared__ float tile[32][33];
        const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
        const unsigned across = (cols + 31) / 32, tiles = across * ((rows + 31) / 32);
        for (unsigned t = blockIdx.x; t < tiles; t += gridDim.x) {
            const int c0 = 32 * (t % across), k0 = 32 * (t / across);
            for (int i = ty; i < 32; i += 8) {
                const int k = k0 + i, c = c0 + tx;
                tile[i][tx] = k < rows && c < cols ? src[(size_t)k * ld + c] : 0.0f;
            }
            __syncthreads();
            for (int i = ty; i < 32; i += 8) {
                const int c = c0 + i, k = k0 + tx;
                if (c >= cols || k >= rows) continue;
                float hi, lo;
                cf_tf32_pieces(tile[tx][i], hi, lo);
                float* const o = out + (size_t)c * 3 * rows + k;
                #pragma unroll
                for (int p = 0; p < 3; ++p) o[(size_t)p * rows] = p == lo_piece ? lo : hi;
            }
            __syncthreads();
        }
        return;
    }
    // A split is bound by memory: a thread takes 4 columns of a row at a time, in one 16-byte load and
    // three 16-byte stores where the row length and the pointers allow.
    const unsigned groups = (cols + 3) / 4, total = (unsigned)rows * groups;
    const bool whole = ((cols | ld) & 3) == 0
                       && ((reinterpret_cast<size_t>(src) | reinterpret_cast<size_t>(out)) & 15) == 0;
    const size_t piece = layout == CF_STACKED ? (size_t)rows * cols : (size_t)cols;  // copy to copy
    const size_t out_row = layout == CF_STACKED ? (size_t)cols : 3 * (size_t)cols;
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x) {
        const unsigned r = e / groups, j = 4 * (e - r * groups);
        const float* const s = src + (size_t)r * ld + j;
        float* const o = out + (size_t)r * out_row + j;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (whole) {
            x = *reinterpret_cast<const float4*>(s);
        } else {
            x.x = s[0];
            if (j + 1 < cols) x.y = s[1];
            if (j + 2 < cols) x.z = s[2];
            if (j + 3 < cols) x.w = s[3];
        }
        float4 hi, lo;
        cf_tf32_pieces(x.x, hi.x, lo.x);
        cf_tf32_pieces(x.y, hi.y, lo.y);
        cf_tf32_pieces(x.z, hi.z, lo.z);
        cf_tf32_pieces(x.w, hi.w, lo.w);
        #pragma unroll
        for (int p = 0; p < 3; ++p) {
            const float4 v = p == lo_piece ? lo : hi;
            float* const to = o + p * piece;
            if (whole) {
                *reinterpret_cast<float4*>(to) = v;
            } else {
                to[0] = v.x;
                if (j + 1 < cols) to[1] = v.y;
                if (j + 2 < cols) to[2] = v.z;
                if (j + 3 < cols) to[3] = v.w;
            }
        }
    }
}
""".replace("TF32_PIECES\n", TF32_PIECES + "\n")


SIDE_BY_SIDE, STACKED, TRANSPOSED = 0, 1, 2  # the layouts of cf_split_tf32x3's copies


def split_threads(rows, cols, layout: int):
    """The threads cf_split_tf32x3 runs with for a source of `rows` x `cols`: one per 32 x 32 tile and
    per 256 threads where it transposes, else one per 4 columns of a row. For the executor `rows` and
    `cols` are ints; for the exported launcher, C expressions (and so is the count)."""
    if isinstance(rows, int) and isinstance(cols, int):
        if layout == TRANSPOSED:
            return BLOCK * -(-rows // 32) * -(-cols // 32)
        return rows * -(-cols // 4)
    if layout == TRANSPOSED:
        return f"(size_t){BLOCK} * ((({rows}) + 31) / 32) * ((({cols}) + 31) / 32)"
    return f"(size_t)({rows}) * ((({cols}) + 3) / 4)"


def tf32x3_layout(g: GemmLaunch, rows, k, k3) -> tuple[tuple, tuple, object, object, object]:
    """How a GEMM on tensor cores (see `cf_split_tf32x3`) splits its operands, for the executor (ints)
    and the exported launcher (C expressions) alike: for A and for W, the source's (rows, cols, row
    length, layout, the piece that is lo), then the split copies' row lengths, A's and W's, and where
    W's copies start, in floats after A's. A's copies are always [rows, 3K], K contiguous, which the GEMM
    reads untransposed: where A is stored transposed (a weight gradient's x^T), its split transposes it.
    `rows` and `k` are the GEMM's, `k3` is 3 * k."""
    a = (k, rows, g.a.ld, TRANSPOSED, 2) if g.trans_a else (rows, k, g.a.ld, SIDE_BY_SIDE, 2)
    w = (g.n, k, k, SIDE_BY_SIDE, 1) if g.trans_w else (k, g.n, g.n, STACKED, 1)
    w_at = rows * k3 if isinstance(rows, int) and isinstance(k3, int) else f"3 * (size_t)({rows}) * ({k})"
    return a, w, k3, k3 if g.trans_w else g.n, w_at


def comment_text(text: str) -> str:
    """Any text (a cell's name or description, a node id) as the inside of a `//` or `/* */` comment that
    stays one: on one line, with no control, format or line-separator character (bidirectional overrides
    could make the code read differently from what compiles), no `/*` or `*/`, and no backslash or `??/`
    at its end, which would join the next line to a `//` comment."""
    kept = "".join(ch if _printable(ch) else " " for ch in text)
    one_line = " ".join(kept.split())
    apart = re.sub(r"(?<=/)(?=\*)|(?<=\*)(?=/)", " ", one_line)
    return apart[:_end_without_continuation(apart)]


def _printable(ch: str) -> bool:
    category = unicodedata.category(ch)
    return category[0] in "LMNPS" or category == "Zs"


def _end_without_continuation(text: str) -> int:
    """Where the text ends once blanks, backslashes and `??/` are taken off its end (scanned once from the
    end: a regular expression anchored at the end would take quadratic time on a long run of them)."""
    end = len(text)
    while end:
        if text[end - 1] == "\\" or text[end - 1].isspace():
            end -= 1
        elif text.endswith("??/", 0, end):
            end -= 3
        else:
            break
    return end


def c_name(text: str) -> str:
    """Text as identifier characters (ASCII letters, digits and "_"); a valid node id stays as it is."""
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def c_stem(name: str) -> str:
    """A cell's name as the stem of the generated C names (`cellfuse_<stem>_forward`, `cf_<stem>_k0`) and
    of the file name in the build command: lower-case ASCII letters, digits and single underscores, never
    empty, starting with a letter, and short enough for a file name."""
    stem = re.sub(r"_+", "_", c_name(name).lower())[:MAX_STEM].strip("_")
    if not stem:
        return "cell"
    return "c_" + stem if stem[0].isdigit() else stem


def float_literal(value: float) -> str:
    """A constant as C: the float32 it rounds to (as the numpy executor computes with it) in the fewest
    digits that give that float32 back, parenthesised when negative, so that `(-{0})` of a negative one
    never reads `--1.0f`. Raises ValueError for a value beyond float32's range, which would be infinity."""
    with np.errstate(over="ignore"):
        single = np.float32(value)
    if not np.isfinite(single):
        raise ValueError(f"{value!r} is beyond float32's range (largest {np.finfo(np.float32).max})")
    text = str(single)
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if text.startswith("-") else text + "f"


def _const(arg: Const, op: Instr | GradInstr) -> str:
    try:
        return float_literal(arg.value)
    except ValueError as e:
        message = f"node '{op.result}': its constant {e}; the generated CUDA computes in float32"
        raise CellError(message) from None


def check_index_range(plan: Plan) -> None:
    """Raises CellError where a count that the generated code holds in an int would overflow: a launch's
    rows (the output sequence has (seq + 1) * batch), a row's width or stride, a GEMM's dimensions. The
    products of these, element offsets, are computed in 64 bits."""
    s = plan.sizes
    counts = [("(seq + 1) * batch", (s.seq + 1) * s.batch), ("input", s.input), ("hidden", s.hidden)]
    for lp in plan.layers:
        for launch in (*lp.prologue, *lp.step):
            match launch:
                case GemmLaunch(group=name):
                    what = f"GEMM {name} of layer {lp.layer}"
                    counts += [(f"the N of {what}", launch.n), (f"the K of {what}", launch.k)]
                    accesses = [launch.a, launch.c]
                case KernelLaunch(island=name):
                    what = f"kernel {name} of layer {lp.layer}"
                    counts.append((f"the width of {what}", launch.width))
                    accesses = [acc for _, acc in (*launch.inputs, *launch.outputs)]
                case _:
                    raise TypeError(f"unknown launch {launch!r}")
            counts += [(f"a row stride of {what}", acc.ld) for acc in accesses]
    for what, count in counts:
        if count > INT_MAX:
            raise CellError(f"these sizes are too large for the generated CUDA: {what} is "
                            f"{count}, and its int indices hold at most {INT_MAX} (2**31 - 1)")


# The first row of an access at step {t}, as C (see plan.row_offset).
ROW_EXPR = {"fixed": "0", "all": "0", "all+1": "batch", "t": "(size_t)({t}) * batch",
             "t+1": "(size_t)({t} + 1) * batch", "t%2": "(size_t)(({t}) % 2) * batch",
             "(t+1)%2": "(size_t)(({t} + 1) % 2) * batch"}


@dataclass(frozen=True)
class Param:
    """One pointer argument of a kernel: the value it carries and where that value lives."""

    value: str
    access: Access
    output: bool


def kernel_params(launch: KernelLaunch) -> list[Param]:
    """The kernel's pointer arguments, inputs first, in the order the host passes them."""
    inputs = [Param(v, acc, False) for v, acc in launch.inputs]
    return inputs + [Param(v, acc, True) for v, acc in launch.outputs]


def element_index(acc: Access) -> str:
    """Where element (r, j) of an access is, from the pointer to its first element at the step."""
    if acc.kind == "scalar":
        return "0"
    if acc.kind == "vec":
        return "j"
    if acc.kind == "col":
        return f"(long long)r * {acc.ld}"
    return f"(long long)r * {acc.ld} + j"


def _reads(instr: Instr | GradInstr) -> set[str]:
    """The values an instruction's C expression reads."""
    match instr:
        case Instr(args=args):
            return {a for a in args if not isinstance(a, Const)}
        case GradInstr(args=args, op=op, arg=k, dy=dy, y=y):
            rule = op.cuda_grad[k]
            used = {a for i, a in enumerate(args) if not isinstance(a, Const) and f"{{{i}}}" in rule}
            return used | {dy} | ({y} if "{y}" in rule else set())
        case other:
            raise TypeError(f"unknown instruction of a body: {other!r}")


def _live(body: tuple[Instr | GradInstr, ...], stored: set[str],
          deviations: dict[str, _Deviations] | None = None) -> tuple[Instr | GradInstr, ...]:
    """The instructions of a body that the stored values need, directly or through the body, in order:
    an adjoint recomputes its whole forward body, and a derivative rule may use neither the op's
    arguments nor its result. A row sum taken from deviation sums reads their x and m instead of its
    argument."""
    deviations = deviations or {}
    needed, kept = set(stored), []
    for instr in reversed(body):
        if instr.result in needed:
            kept.append(instr)
            dev = deviations.get(instr.result)
            needed |= {dev.x, dev.m} if dev else _reads(instr)
    return tuple(reversed(kept))


def _c_vars(values: list[str]) -> dict[str, str]:
    """The C variable of each value: v_<id> for a node's value, g_<id> for a gradient; a suffix where two
    names meet in one."""
    var: dict[str, str] = {}
    for name in values:
        base = f"g_{c_name(name[len(GRAD):])}" if name.startswith(GRAD) else f"v_{c_name(name)}"
        c, n = base, 1
        while c in var.values():
            n += 1
            c = f"{base}_{n}"
        var[name] = c
    return var


def _expression(instr: Instr | GradInstr, var: dict[str, str], width: str = "") -> tuple[str, str]:
    """The C expression of an elementwise instruction or a gradient over the C variables of its values,
    and what it computes, for a comment; `width` is the row's width, which a row reduction's derivative
    reads. An argument a derivative rule does not read may not have been computed: it is never formatted
    in."""
    args = [_const(a, instr) if isinstance(a, Const) else var.get(a, "") for a in instr.args]
    match instr:
        case Instr():
            return instr.op.cuda.format(*args), instr.op.name
        case GradInstr():
            expr = instr.op.cuda_grad[instr.arg].format(*args, dy=var[instr.dy], y=var.get(instr.y, ""),
                                                        width=width)
            return expr, f"d {instr.op.name} / d {instr.op.args[instr.arg]}"
        case other:
            raise TypeError(f"unknown instruction of a body: {other!r}")


def loaded(params: list[Param], body: tuple[Instr | GradInstr, ...]) -> dict[str, int]:
    """The inputs that the stores of a kernel's body need, each value from its first param: the loads of
    `element_body` (an adjoint need not read every input of its kernel: d(a + b) reads neither)."""
    needed = {p.value for p in params if p.output}.union(
        *map(_reads, _live(body, {p.value for p in params if p.output})))
    loads: dict[str, int] = {}
    for i, p in enumerate(params):
        if not p.output and p.value in needed:
            loads.setdefault(p.value, i)
    return loads


def element_body(params: list[Param], names: list[str], body: tuple[Instr | GradInstr, ...], indent: str,
                 index: dict[int, str] | None = None, adds: Callable[[Access], bool] | None = None,
                 copies: dict[int, str] | None = None, valid: str | None = None) -> list[str]:
    """The loads, ops and stores of one element (row r, column j, element e of the launch) of a
    kernel's body, with `names[i]` the pointer of `params[i]` at the step's rows (or an array that
    `index[i]` indexes, input or output). A body may hold gradients (`GradInstr`), computed by the op
    table's rules; the outputs for which `adds` holds add to memory (a backward kernel's gradients): what
    memory holds is loaded with the inputs, all in flight at once, where `+=` would wait for each in turn
    (the compiler cannot tell that the outputs do not overlap; they do not, see `_distinct_outputs`). An
    output of `copies` (param index -> a register) is also put in that register. Where `valid` (a C
    condition) is given, an element for which it is false loads element 0 of memory and stores nothing."""
    lines, index = [], index or {}
    kept = _live(body, {p.value for p in params if p.output})
    loads = loaded(params, body)
    var = _c_vars([*loads, *(instr.result for instr in kept)])

    def place(i: int) -> str:
        at = element_index(params[i].access)
        return index.get(i) or (f"{valid} ? {at} : 0" if valid else at)

    for v, i in loads.items():
        lines.append(f"{indent}const float {var[v]} = {names[i]}[{place(i)}];")
    outputs = [(i, p) for i, p in enumerate(params) if p.output]
    added = {i for i, p in outputs if adds is not None and adds(p.access)}
    if added:
        _distinct_outputs([p for _, p in outputs])
    for i, p in outputs:
        if i in added:
            guard = _STORE_GUARD.get(p.access.kind)
            load = f"{names[i]}[{place(i)}]"
            lines.append(f"{indent}const float cf_old_{i} = {f'{guard} ? {load} : 0.0f' if guard else load};")
    for instr in kept:
        expr, what = _expression(instr, var)
        lines.append(f"{indent}const float {var[instr.result]} = {expr};  // {comment_text(what)}")
    for i, p in outputs:
        value = f"cf_old_{i} + {var[p.value]}" if i in added else var[p.value]
        store = f"{names[i]}[{index.get(i) or element_index(p.access)}] = {value};"
        guard = " && ".join(g for g in (valid, _STORE_GUARD.get(p.access.kind)) if g)
        lines.append(f"{indent}{f'if ({guard}) ' if guard else ''}{store}")
    lines += [f"{indent}{register} = {var[params[i].value]};" for i, register in (copies or {}).items()]
    return lines


# The one element of a launch that stores a value of fewer elements than the launch has.
_STORE_GUARD = {"vec": "(r == 0)", "col": "(j == 0)", "scalar": "(e == 0)"}


def _distinct_outputs(outputs: list[Param]) -> None:
    """An element's old values are all loaded before any is stored: two outputs at one place would lose
    one of their additions."""
    places = [p.access for p in outputs]
    assert len(set(places)) == len(places), f"outputs of one kernel share a place: {places}"


def _where(launch: KernelLaunch) -> str:
    """When a kernel runs, for the comment above it."""
    if launch.accumulate:  # a backward kernel: the hoisted ones run after the reverse time loop
        return ("after the time loop, all steps at once" if launch.hoisted else "once per time step, in "
                "reverse") + "; adds the gradients it computes into its outputs"
    return "before the time loop, all steps at once" if launch.hoisted else "once per time step"


def kernel_source(launch: KernelLaunch, name: str) -> str:
    """The source of one kernel. Pointers arrive already offset to the step's rows. A kernel that reduces
    a row, or takes the derivative of a row reduction (which reads the row's width), runs a block per
    row (`reduction_kernel_source`)."""
    if any(instr.op.is_reduction for instr in _live(launch.body, {v for v, _ in launch.outputs})):
        return reduction_kernel_source(launch, name)
    params = kernel_params(launch)
    names = [f"p{i}_{c_name(p.value)}" for i, p in enumerate(params)]
    covered = ", ".join(op.result for op in launch.body) if launch.body else "stores " + ", ".join(
        v for v, _ in launch.outputs)
    lines = ["// " + comment_text(f"{launch.island}: {covered}"),
             f"// runs {_where(launch)}; {launch.width} columns per row"]
    sig = [f"    {'float*' if p.output else 'const float*'} __restrict__ {n}" for p, n in zip(params, names,
                                                                                        strict=True)]
    lines.append(f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(')
    lines.append(",\n".join([*sig, "    int rows"]) + ")")
    lines.append("{")
    lines.append(f"    const int width = {launch.width};")
    lines.append("    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; "
                 "e < (long long)rows * width;")
    lines.append("         e += (long long)gridDim.x * blockDim.x) {")
    lines.append("        const int r = (int)(e / width), j = (int)(e - (long long)r * width);")
    lines.append("        (void)r; (void)j;")
    lines += element_body(params, names, launch.body, "        ", adds=launch.adds)
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _sums_the_row(instr: Instr | GradInstr) -> bool:
    """A row reduction itself; the derivative of one only spreads its row's gradient over the row."""
    return isinstance(instr, Instr) and instr.op.is_reduction


@dataclass(frozen=True)
class _Deviations:
    """A row sum (or mean) of (x - m)^2, m uniform over the row (a variance, say), taken from x's sum and
    its sum of squared deviations from its own mean, which x's pass gathers (`cf_lanes_deviations`):
    q + n (s / n - m)^2 (`cf_deviations`) needs no pass over the row after m's. A layer norm's
    variance then costs no round of row sums of its own (on an H100, the layer-normalised LSTM's step
    takes two rounds instead of four)."""

    x: str
    m: str


def _squared_deviation(instr: Instr | GradInstr, made: dict[str, Instr | GradInstr],
                       uniform: set[str]) -> _Deviations | None:
    """Of a row sum or mean of square(x - m) (or of (x - m) * (x - m), or of m - x), m uniform over the
    row and x not: its x and m."""
    if not (isinstance(instr, Instr) and instr.op.is_reduction):
        return None
    sq = made.get(instr.args[0]) if isinstance(instr.args[0], str) else None
    if not isinstance(sq, Instr) or not (sq.op.name == "square"
                                         or (sq.op.name == "mul" and sq.args[0] == sq.args[1])):
        return None
    sub = made.get(sq.args[0]) if isinstance(sq.args[0], str) else None
    if not (isinstance(sub, Instr) and sub.op.name == "sub"):
        return None
    x, m = sub.args
    if isinstance(x, str) and x in uniform:
        x, m = m, x
    if not (isinstance(x, str) and isinstance(m, str)) or x in uniform or m not in uniform:
        return None
    return _Deviations(x, m)


@dataclass(frozen=True)
class _RowSums:
    """How a reducing kernel's body is cut into passes over the row: the pass that computes each value
    (a row sum's result is there from the pass after the one that computes its argument, anything else
    from the pass of the latest value it reads), and the row sums taken from deviation sums instead
    (see `_Deviations`: where every thread holds as many of the row's columns, which the pairwise update
    assumes, in a pass unrolled, and x comes a pass before m)."""

    body: tuple[Instr | GradInstr, ...]  # the instructions the stored values need
    uniform: set[str]  # the values uniform over the row: one per row, every thread computes it alike
    level: dict[str, int]
    deviations: dict[str, _Deviations]  # by the result of the row sum each gives

    @property
    def passes(self) -> int:
        return max((self.level[i.result] for i in self.body), default=0) + 1

    def sums(self, step: int) -> tuple[list[Instr | GradInstr], list[Instr | GradInstr], list[str]]:
        """The row sums that pass `step` gathers: the plain ones, those of them that need a sum of their
        own, and the values x whose deviation sums it gathers (a plain sum of such an x comes with
        them)."""
        stats = list(dict.fromkeys(d.x for d in self.deviations.values() if self.level.get(d.x, 0) == step))
        plain = [i for i in self.body if _sums_the_row(i) and i.result not in self.deviations
                 and self.level[i.result] == step + 1]
        return plain, [i for i in plain if i.args[0] not in stats], stats

    @property
    def floats(self) -> int:
        """The static shared memory of the kernel, in floats: its warps' partial row sums (two for
        deviation sums), for the pass that has the most."""
        most = 0
        for step in range(self.passes):
            _, own, stats = self.sums(step)
            most = max(most, len(own) + 2 * len(stats))
        return most * (BLOCK // WARP)


def row_sums(launch: KernelLaunch) -> _RowSums:
    """The passes over the row of a kernel whose body reduces rows."""
    params = kernel_params(launch)
    kinds = value_kinds(launch.body, {p.value: p.access.kind for p in params if not p.output})
    uniform = {v for v, kind in kinds.items() if kind in ("col", "scalar")}
    even = launch.width % BLOCK == 0 and launch.width // BLOCK <= MAX_UNROLLED_COLUMNS
    level: dict[str, int] = {}
    deviations: dict[str, _Deviations] = {}
    made: dict[str, Instr | GradInstr] = {}
    for instr in launch.body:
        made[instr.result] = instr
        dev = _squared_deviation(instr, made, uniform) if even else None
        if dev and level.get(dev.x, 0) < level.get(dev.m, 0):
            deviations[instr.result], level[instr.result] = dev, level[dev.m]
            continue
        first = max((level.get(a, 0) for a in _reads(instr)), default=0)
        level[instr.result] = first + _sums_the_row(instr)
    stored = {p.value for p in params if p.output}
    return _RowSums(_live(launch.body, stored, deviations), uniform, level, deviations)


def reduction_kernel_source(launch: KernelLaunch, name: str, device: bool = False,
                            written: frozenset[str] = frozenset(),
                            published: dict[int, str] | None = None) -> str:
    """A kernel whose body reduces rows: a block per row (see the module's docstring). Pointers arrive
    already offset to the step's rows; the launch may have any number of blocks of BLOCK threads. A
    `device` function instead, with the same body, for a persistent kernel's blocks to run: it loads
    the buffers that the kernel writes (`written`) through L2 (`__ldcg`), what it adds to as well, since
    other blocks of the kernel wrote them, and an SM's L1 is not coherent with the others'; and it
    also publishes the outputs of `published` (the index of each among the kernel's parameters) to
    an exchange, at the address given (in r, j and the batch, `rows`), with the tag of its step `t`, an
    argument after the rows (see `cuda_persistent`).

    The body may be an adjoint's (see `adjoint`): its gradients are computed in the same passes, and a
    column's gradient, the sum over the row of what each element passes it, is one more row sum. A
    value is uniform over the row (one per row, computed by every thread of the block alike) where its
    kind is a column or a scalar; the others are computed per element, in the passes."""
    params = kernel_params(launch)
    pointer = [f"p{i}_{c_name(p.value)}" for i, p in enumerate(params)]
    inputs = {p.value: (p.access, n) for p, n in zip(params, pointer, strict=True) if not p.output}
    published = published or {}
    stores: dict[str, list[tuple[str, str, int]]] = {}  # value -> where it goes, how (+= or =), parameter
    for i, (p, n) in enumerate(zip(params, pointer, strict=True)):
        if p.output:
            assign = "+=" if launch.adds(p.access) else "="
            stores.setdefault(p.value, []).append((f"{n}[{element_index(p.access)}]", assign, i))
    rs = row_sums(launch)
    body, uniform, level, deviations = rs.body, rs.uniform, rs.level, rs.deviations
    passes = rs.passes
    # where each value is read: the pass of an elementwise use, or the pass before a row sum's result
    # (for deviation sums, x's own pass, and m where their row sum is taken)
    used: dict[str, set[int]] = {}
    for instr in body:
        if dev := deviations.get(instr.result):
            used.setdefault(dev.x, set()).add(level.get(dev.x, 0))
            used.setdefault(dev.m, set()).add(level[instr.result])
            continue
        for a in _reads(instr):
            used.setdefault(a, set()).add(level[instr.result] - _sums_the_row(instr))
    read = [v for v in inputs if v in used or v in stores]
    per_element = [v for v in (*read, *(i.result for i in body)) if v not in uniform]
    made = {v: level[v] if v in level else min(used.get(v, {0})) for v in per_element}  # an input: first read
    columns = -(-launch.width // BLOCK)
    # A later pass's inputs are loaded in the first, while what the thread holds for them fits in
    # registers: their trips to memory then overlap the first pass's instead of following a row sum.
    early = 0
    for v in read:
        if v in made and made[v] > 0 and columns <= MAX_UNROLLED_COLUMNS \
                and early + columns <= EARLY_LOAD_FLOATS:
            made[v], early = 0, early + columns
    kept = [v for v in per_element if max(used.get(v, set()), default=-1) > made[v]]
    partial = rs.floats

    def load(v: str) -> str:
        acc, ptr = inputs[v]
        at = element_index(acc)
        return f"__ldcg({ptr} + {at})" if device and acc.buffer in written else f"{ptr}[{at}]"

    def store(target: str, assign: str, value: str) -> str:
        if device and assign == "+=":  # what it adds to, other blocks may have written
            return f"{target} = __ldcg(&{target}) + {value};"
        return f"{target} {assign} {value};"
    var = _c_vars([*read, *(instr.result for instr in body)])
    width = float_literal(launch.width)

    def compute(instr: Instr | GradInstr, indent: str) -> str:
        expr, what = _expression(instr, var, width)
        return f"{indent}const float {var[instr.result]} = {expr};  // {comment_text(what)}"

    covered = ", ".join(instr.result for instr in launch.body)
    how = ", row sums by warp shuffles and shared memory" if partial else ""
    lines = ["// " + comment_text(f"{launch.island}: {covered}"),
             f"// runs {_where(launch)}; a block per row of {launch.width} columns, {passes} pass(es) over "
             f"the row{how}"]
    sig = [f"    {'float*' if p.output else 'const float*'} __restrict__ {n}"
           for p, n in zip(params, pointer, strict=True)]
    lines.append(f"__device__ __forceinline__ void {name}(" if device else
                 f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(')
    lines.append(",\n".join([*sig, "    int rows", *(["    int t"] if published else [])]) + ")")
    lines.append("{")
    lines.append(f"    const int width = {launch.width};")
    lines.append(f"    constexpr int COLUMNS = {columns};  // of the row, per thread")
    if partial:
        lines.append(f"    constexpr int WARPS = {BLOCK // WARP};")
        lines.append(f"    __shared__ float cf_partial[{partial}];  // the warps' partial row sums")
    lines.append("    for (int r = blockIdx.x; r < rows; r += gridDim.x) {  // alike for the whole block")
    ind = "        "
    for v in read:
        if v in uniform:
            lines.append(f"{ind}const float {var[v]} = {load(v)};")
    for v in kept:
        lines.append(f"{ind}float a_{var[v]}[COLUMNS];  // kept for a later pass")

    def store_uniform(v: str) -> None:
        for target, assign, _ in stores.get(v, []):
            cond = "threadIdx.x == 0" + (" && r == 0" if target.endswith("[0]") else "")
            lines.append(f"{ind}if ({cond}) {store(target, assign, var[v])}")

    for v in read:
        if v in uniform:
            store_uniform(v)
    totals: dict[str, tuple[str, str]] = {}  # x -> its row's sum and deviation sum, once gathered
    for step in range(passes):
        for instr in body:  # what is uniform over the row, once the row sums it needs are done
            if level[instr.result] != step or instr.result not in uniform:
                continue
            if dev := deviations.get(instr.result):
                total = f"cf_deviations({', '.join(totals[dev.x])}, {var[dev.m]}, {width})"
                expr = instr.op.cuda.format(total, width=width)
                lines.append(f"{ind}const float {var[instr.result]} = {expr};  // {instr.op.name}, from "
                             "deviation sums")
                store_uniform(instr.result)
            elif not _sums_the_row(instr):
                lines.append(compute(instr, ind))
                store_uniform(instr.result)
        plain, own, stats = rs.sums(step)
        work = [i for i in body if level[i.result] == step and i.result not in uniform]
        loads = [v for v in read if v not in uniform and made[v] == step]
        reads = [v for v in kept if made[v] < step and step in used.get(v, set())]
        if not (plain or stats or work or loads or reads):
            continue
        for i, red in enumerate(own):
            lines.append(f"{ind}float s_{step}_{i} = 0.0f;  // {comment_text(red.result)}: the thread's part "
                         "of the row sum")
        for i, x in enumerate(stats):
            lines.append(f"{ind}float ds_{step}_{i} = 0.0f, dm_{step}_{i} = 0.0f, dq_{step}_{i} = 0.0f;  // "
                         f"{comment_text(x)}: the thread's sum, mean and squared deviations from it")
        lines.append(f"{ind}// pass {step + 1} over the row")
        if columns <= MAX_UNROLLED_COLUMNS:
            lines.append(f"{ind}#pragma unroll")
        lines.append(f"{ind}for (int k = 0; k < COLUMNS; ++k) {{")
        lines.append(f"{ind}    const int j = threadIdx.x + k * {BLOCK};")
        lines.append(f"{ind}    if (j < width) {{")
        inner = ind + "        "
        for v in loads:
            lines.append(f"{inner}const float {var[v]} = {load(v)};")
        for v in reads:
            lines.append(f"{inner}const float {var[v]} = a_{var[v]}[k];")
        for instr in work:
            lines.append(compute(instr, inner))
        for v in [*loads, *(i.result for i in work)]:
            if v in kept:
                lines.append(f"{inner}a_{var[v]}[k] = {var[v]};")
            for target, assign, i in stores.get(v, []):
                vec = target.endswith("[j]")
                lines.append(f"{inner}{'if (r == 0) ' if vec else ''}{store(target, assign, var[v])}")
                if i in published:
                    lines.append(f"{inner}cf_publish({published[i]}, t + 2, {var[v]});")
        for i, red in enumerate(own):
            lines.append(f"{inner}s_{step}_{i} += {var[red.args[0]]};")
        for i, x in enumerate(stats):  # Welford's update, k + 1 values so far (k is a constant, unrolled)
            lines += [f"{inner}ds_{step}_{i} += {var[x]};",
                      f"{inner}{{",
                      f"{inner}    const float dv = {var[x]} - dm_{step}_{i};",
                      f"{inner}    dm_{step}_{i} += dv * (1.0f / (k + 1));",
                      f"{inner}    dq_{step}_{i} += dv * ({var[x]} - dm_{step}_{i});",
                      f"{inner}}}"]
        lines.append(f"{ind}    }}")
        lines.append(f"{ind}}}")
        if not (own or stats):
            continue
        lines.append(f"{ind}{{  // the row sums: a warp's by shuffles, then the warps' in shared memory")
        lines += [f"{ind}    const float w_{i} = cf_lanes_sum(s_{step}_{i}, {WARP});"
                  for i in range(len(own))]
        lines += [f"{ind}    cf_lanes_deviations(ds_{step}_{i}, dq_{step}_{i}, {WARP}, COLUMNS);"
                  for i in range(len(stats))]
        lines.append(f"{ind}    __syncthreads();  // every thread has read the row sums before these")
        lines.append(f"{ind}    if (threadIdx.x % {WARP} == 0) {{")
        lines += [f"{ind}        cf_partial[{i} * WARPS + threadIdx.x / {WARP}] = w_{i};"
                  for i in range(len(own))]
        for i in range(len(stats)):
            at = len(own) + 2 * i
            lines += [f"{ind}        cf_partial[{at} * WARPS + threadIdx.x / {WARP}] = ds_{step}_{i};",
                      f"{ind}        cf_partial[{at + 1} * WARPS + threadIdx.x / {WARP}] = dq_{step}_{i};"]
        lines.append(f"{ind}    }}")
        lines.append(f"{ind}    __syncthreads();")
        lines.append(f"{ind}}}")
        sums = {}
        for i, red in enumerate(own):
            # each group of WARPS lanes sums the warps' sums: fewer shuffles than a warp's 32 lanes
            # (zeros past WARPS), and the same sum, in the same order
            sums[red.result] = f"t_{i}_{step}"
            lines.append(f"{ind}const float t_{i}_{step} = "
                         f"cf_lanes_sum(cf_partial[{i} * WARPS + threadIdx.x % WARPS], WARPS);")
        for i, x in enumerate(stats):
            at = len(own) + 2 * i
            totals[x] = (f"ts_{i}_{step}", f"tq_{i}_{step}")
            lines += [f"{ind}float ts_{i}_{step} = cf_partial[{at} * WARPS + threadIdx.x % WARPS];",
                      f"{ind}float tq_{i}_{step} = cf_partial[{at + 1} * WARPS + threadIdx.x % WARPS];",
                      f"{ind}cf_lanes_deviations(ts_{i}_{step}, tq_{i}_{step}, WARPS, {WARP} * COLUMNS);"]
        for red in plain:
            total = sums.get(red.result) or totals[red.args[0]][0]
            lines.append(f"{ind}const float {var[red.result]} = {red.op.cuda.format(total, width=width)};"
                         f"  // {red.op.name}")
            store_uniform(red.result)
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"
