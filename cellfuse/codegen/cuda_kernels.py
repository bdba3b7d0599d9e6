"""CUDA C for the fused elementwise kernels of a Plan: one `__global__` function per fused island (or per
node, in `naive`), written as a CUDA engineer would by hand: one thread per output element, a grid-stride
loop, `__restrict__` pointers, row strides baked in as constants; and the body of one element, which the
persistent kernels run too. A kernel that reduces a row runs a block per row instead (`cuda_rows`)."""

from __future__ import annotations

from collections.abc import Callable

from ..graph_model import CellError
from .c_text import CWriter, c_name, comment_text, float_literal
from .cuda_library import cuda_library
from .dtypes import COMPUTE
from .kernel_abi import BLOCK, Param, element_index, kernel_params
from .plan import GRAD, Access, Const, GradInstr, Instr, KernelLaunch
from .row_passes import live, loaded

# The device math of the op table and the row sums, and the kernels every module's GEMMs call (the bias
# rows, the splits of three fp16 products): at the top of every module.
PRELUDE = cuda_library("math.cuh", "gemm_splits.cuh")
F = COMPUTE.c  # what a kernel computes in


def _const(arg: Const, op: Instr | GradInstr) -> str:
    try:
        return float_literal(arg.value)
    except ValueError as e:
        message = f"node '{op.result}': its constant {e}; the generated CUDA computes in float32"
        raise CellError(message) from None


def c_vars(values: list[str]) -> dict[str, str]:
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


def expression(instr: Instr | GradInstr, var: dict[str, str], width: str = "") -> tuple[str, str]:
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


def element_body(w: CWriter, params: list[Param], names: list[str], body: tuple[Instr | GradInstr, ...],
                 index: dict[int, str] | None = None, adds: Callable[[Access], bool] | None = None,
                 copies: dict[int, str] | None = None, valid: str | None = None) -> None:
    """The loads, ops and stores of one element (row r, column j, element e of the launch) of a
    kernel's body, with `names[i]` the pointer of `params[i]` at the step's rows (or an array that
    `index[i]` indexes, input or output). A body may hold gradients (`GradInstr`), computed by the op
    table's rules; the outputs for which `adds` holds add to memory (a backward kernel's gradients): what
    memory holds is loaded with the inputs, all in flight at once, where `+=` would wait for each in turn
    (the compiler cannot tell that the outputs do not overlap; they do not, see `_distinct_outputs`). An
    output of `copies` (param index -> a register) is also put in that register. Where `valid` (a C
    condition) is given, an element for which it is false loads element 0 of memory and stores nothing."""
    index = index or {}
    kept = live(body, {p.value for p in params if p.output})
    loads = loaded(params, body)
    var = c_vars([*loads, *(instr.result for instr in kept)])

    def place(i: int) -> str:
        at = element_index(params[i].access)
        return index.get(i) or (f"{valid} ? {at} : 0" if valid else at)

    def element(i: int) -> str:
        """Param i's element as float32: from memory, converted from its type; from an array, as it is."""
        at = f"{names[i]}[{place(i)}]"
        return at if i in index else params[i].access.dtype.load(at)

    for v, i in loads.items():
        w(f"const {F} {var[v]} = {element(i)};")
    outputs = [(i, p) for i, p in enumerate(params) if p.output]
    added = {i for i, p in outputs if adds is not None and adds(p.access)}
    if added:
        _distinct_outputs([p for _, p in outputs])
    for i, p in outputs:
        if i in added:
            guard = _STORE_GUARD.get(p.access.kind)
            w(f"const {F} cf_old_{i} = {f'{guard} ? {element(i)} : 0.0f' if guard else element(i)};")
    for instr in kept:
        expr, what = expression(instr, var)
        w(f"const {F} {var[instr.result]} = {expr};  // {comment_text(what)}")
    for i, p in outputs:
        value = f"cf_old_{i} + {var[p.value]}" if i in added else var[p.value]
        value = value if i in index else p.access.dtype.store(value)
        store = f"{names[i]}[{index.get(i) or element_index(p.access)}] = {value};"
        guard = " && ".join(g for g in (valid, _STORE_GUARD.get(p.access.kind)) if g)
        w(f"{f'if ({guard}) ' if guard else ''}{store}")
    w(*(f"{register} = {var[params[i].value]};" for i, register in (copies or {}).items()))


# The one element of a launch that stores a value of fewer elements than the launch has.
_STORE_GUARD = {"vec": "(r == 0)", "col": "(j == 0)", "scalar": "(e == 0)"}


def _distinct_outputs(outputs: list[Param]) -> None:
    """An element's old values are all loaded before any is stored: two outputs at one place would lose
    one of their additions."""
    places = [p.access for p in outputs]
    assert len(set(places)) == len(places), f"outputs of one kernel share a place: {places}"


def pointer_type(p: Param) -> str:
    """The C type of a kernel's pointer argument: to its access's type, const where it only reads."""
    return f"{p.access.dtype.c}*" if p.output else f"const {p.access.dtype.c}*"


def when_it_runs(launch: KernelLaunch) -> str:
    """When a kernel runs, for the comment above it."""
    if launch.accumulate:  # a backward kernel: the hoisted ones run after the reverse time loop
        adds = any(launch.adds(acc) for _, acc in launch.outputs)
        return ("after the time loop, all steps at once" if launch.hoisted else "once per time step, in "
                "reverse") + ("; adds the gradients it computes into its outputs" if adds else "")
    return "before the time loop, all steps at once" if launch.hoisted else "once per time step"


def reduces_rows(launch: KernelLaunch) -> bool:
    """Whether a kernel reduces a row, or takes the derivative of a row reduction (which reads the row's
    width): it then runs a block per row (see `cuda_rows`)."""
    return any(instr.op.is_reduction for instr in live(launch.body, {v for v, _ in launch.outputs}))


def elementwise_kernel_source(launch: KernelLaunch, name: str) -> str:
    """The source of a kernel of elementwise work only: a thread per element. Pointers arrive already
    offset to the step's rows."""
    assert not reduces_rows(launch), f"{launch.island} reduces rows: see cuda_rows"
    params = kernel_params(launch)
    names = [f"p{i}_{c_name(p.value)}" for i, p in enumerate(params)]
    covered = ", ".join(op.result for op in launch.body) if launch.body else "stores " + ", ".join(
        v for v, _ in launch.outputs)
    w = CWriter()
    w("// " + comment_text(f"{launch.island}: {covered}"),
      f"// runs {when_it_runs(launch)}; {launch.width} columns per row",
      f'extern "C" __global__ void __launch_bounds__({BLOCK}) {name}(')
    with w.indented():
        w(*(f"{pointer_type(p)} __restrict__ {n}," for p, n in zip(params, names, strict=True)),
          "int rows)")
    with w.block("{"):
        w(f"const int width = {launch.width};",
          "for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < (long long)rows * width;")
        with w.block("     e += (long long)gridDim.x * blockDim.x) {"):
            w("const int r = (int)(e / width), j = (int)(e - (long long)r * width);",
              "(void)r; (void)j;")
            element_body(w, params, names, launch.body, adds=launch.adds)
    return w.text()
