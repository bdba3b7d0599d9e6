"""CUDA C for the kernels of a Plan: one `__global__` function per fused island (or per node, in
`naive`), written as a CUDA engineer would by hand: one thread per output element, a grid-stride
loop, `__restrict__` pointers, row strides baked in as constants."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import numpy as np

from ..graph_model import CellError
from .plan import GRAD, Access, Const, GemmLaunch, GradInstr, Instr, KernelLaunch, Plan

BLOCK = 256  # threads per block of every elementwise kernel
INT_MAX = 2**31 - 1  # the largest count the generated code holds in an int
MAX_STEM = 64  # characters of a cell's name kept in the generated names

PRELUDE = """\
// The logistic function without overflow: expf only ever sees a non-positive argument.
__device__ __forceinline__ float cf_sigmoid(float a) {
    const float z = expf(-fabsf(a));
    return a >= 0.0f ? 1.0f / (1.0f + z) : z / (1.0f + z);
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
"""


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


def _index(acc: Access) -> str:
    if acc.kind == "scalar":
        return "0"
    if acc.kind == "vec":
        return "j"
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


def element_body(params: list[Param], names: list[str], body: tuple[Instr | GradInstr, ...], indent: str,
                 index: dict[int, str] | None = None) -> list[str]:
    """The loads, ops and stores of one element (row r, column j, element e of the launch) of a
    kernel's body, with `names[i]` the pointer of `params[i]` at the step's rows (or an array that
    `index[i]` indexes). A body may hold gradients (`GradInstr`), computed by the op table's rules."""
    lines, var, index = [], {}, index or {}

    def new_var(name: str) -> str:
        """v_<id> for a node's value, g_<id> for a gradient; a suffix where two names meet in one."""
        base = f"g_{c_name(name[len(GRAD):])}" if name.startswith(GRAD) else f"v_{c_name(name)}"
        c, n = base, 1
        while c in var.values():
            n += 1
            c = f"{base}_{n}"
        var[name] = c
        return c

    # Only what a store needs, directly or through the body: an adjoint recomputes its forward body, and
    # a derivative rule may use neither the op's arguments nor its result.
    needed = {p.value for p in params if p.output}
    kept = []
    for instr in reversed(body):
        if instr.result in needed:
            kept.append(instr)
            needed |= _reads(instr)
    for i, (p, n) in enumerate(zip(params, names, strict=True)):
        if not p.output and p.value not in var and p.value in needed:
            lines.append(f"{indent}const float {new_var(p.value)} = {n}[{index.get(i, _index(p.access))}];")
    for instr in reversed(kept):
        # an argument a derivative rule does not read may not have been computed: it is never formatted in
        args = [_const(a, instr) if isinstance(a, Const) else var.get(a, "") for a in instr.args]
        match instr:
            case Instr():
                expr, what = instr.op.cuda.format(*args), instr.op.name
            case GradInstr():
                expr = instr.op.cuda_grad[instr.arg].format(*args, dy=var[instr.dy], y=var.get(instr.y, ""))
                what = f"d {instr.op.name} / d {instr.op.args[instr.arg]}"
            case other:
                raise TypeError(f"unknown instruction of a body: {other!r}")
        lines.append(f"{indent}const float {new_var(instr.result)} = {expr};  // {comment_text(what)}")
    for p, n in zip(params, names, strict=True):
        if not p.output:
            continue
        store = f"{n}[{_index(p.access)}] = {var[p.value]};"
        if p.access.kind == "vec":
            store = f"if (r == 0) {store}"
        elif p.access.kind == "scalar":
            store = f"if (e == 0) {store}"
        lines.append(f"{indent}{store}")
    return lines


def kernel_source(launch: KernelLaunch, name: str) -> str:
    """The source of one kernel. Pointers arrive already offset to the step's rows."""
    params = kernel_params(launch)
    names = [f"p{i}_{c_name(p.value)}" for i, p in enumerate(params)]
    covered = ", ".join(op.result for op in launch.body) if launch.body else "stores " + ", ".join(
        v for v, _ in launch.outputs)
    where = "before the time loop, all steps at once" if launch.hoisted else "once per time step"
    lines = ["// " + comment_text(f"{launch.island}: {covered}"),
             f"// runs {where}; {launch.width} columns per row"]
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
    lines += element_body(params, names, launch.body, "        ")
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"
