"""CUDA C for the kernels of a Plan: one `__global__` function per fused island (or per node, in
`naive`), written as a CUDA engineer would by hand: one thread per output element, a grid-stride
loop, `__restrict__` pointers, row strides baked in as constants."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .plan import Access, Const, GemmLaunch, KernelLaunch, Plan

BLOCK = 256  # threads per block of every elementwise kernel

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


def c_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", text)


def float_literal(value: float) -> str:
    """A float constant as C: parenthesised, so that `-({0})` of a negative one never reads `--1.0f`."""
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return f"({text}f)" if text.startswith("-") else text + "f"


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


def kernel_source(launch: KernelLaunch, name: str) -> str:
    """The source of one kernel. Pointers arrive already offset to the step's rows."""
    params = kernel_params(launch)
    names = [f"p{i}_{c_name(p.value)}" for i, p in enumerate(params)]
    covered = ", ".join(op.result for op in launch.body) if launch.body else "stores " + ", ".join(
        v for v, _ in launch.outputs)
    where = "before the time loop, all steps at once" if launch.hoisted else "once per time step"
    lines = [f"// {launch.island}: {covered}",
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
    var = {}
    for p, n in zip(params, names, strict=True):
        if not p.output and p.value not in var:
            var[p.value] = f"v_{c_name(p.value)}"
            lines.append(f"        const float {var[p.value]} = {n}[{_index(p.access)}];")
    for op in launch.body:
        args = [float_literal(a.value) if isinstance(a, Const) else var[a] for a in op.args]
        var[op.result] = f"v_{c_name(op.result)}"
        lines.append(f"        const float {var[op.result]} = {op.op.cuda.format(*args)};  // {op.op.name}")
    for p, n in zip(params, names, strict=True):
        if not p.output:
            continue
        store = f"{n}[{_index(p.access)}] = {var[p.value]};"
        if p.access.kind == "vec":
            store = f"if (r == 0) {store}"
        elif p.access.kind == "scalar":
            store = f"if (e == 0) {store}"
        lines.append(f"        {store}")
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines) + "\n"


@dataclass
class KernelSet:
    """The distinct kernels of a plan, and which kernel each kernel launch uses."""

    sources: dict[str, str]  # kernel name -> source
    name_of: dict[KernelLaunch, str]  # launch -> kernel name

    def module_source(self) -> str:
        return PRELUDE + "\n" + "\n".join(self.sources.values())


def plan_kernels(plan: Plan) -> KernelSet:
    """One kernel per distinct body: the layers above the first share layer 0's kernels where their sizes
    agree."""
    stem = c_name(plan.cell_name).lower()
    by_body: dict[str, str] = {}
    sources: dict[str, str] = {}
    name_of: dict[KernelLaunch, str] = {}
    for lp in plan.layers:
        for launch in (*lp.prologue, *lp.step):
            match launch:
                case KernelLaunch():
                    body = kernel_source(launch, "@NAME@")
                    if body not in by_body:
                        name = f"cf_{stem}_{launch.island}" + (f"_l{lp.layer}" if lp.layer else "")
                        by_body[body] = name
                        sources[name] = body.replace("@NAME@", name)
                    name_of[launch] = by_body[body]
                case GemmLaunch():
                    pass  # cuBLAS runs it
                case _:
                    raise TypeError(f"unknown launch {launch!r}")
    return KernelSet(sources, name_of)
