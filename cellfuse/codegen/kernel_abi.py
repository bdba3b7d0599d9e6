"""What a generated kernel and its caller agree on: the threads of a block, the pointer arguments of a
fused kernel and where each element of them is, and the counts the kernels hold in an int."""

from __future__ import annotations

from dataclasses import dataclass

from ..graph_model import CellError
from .plan import Access, GemmLaunch, KernelLaunch, Plan

BLOCK = 256  # threads per block of every elementwise kernel
MAX_GRID = 65535  # blocks of a launch at most: its threads stride over the rest
WARP = 32
INT_MAX = 2**31 - 1  # the largest count the generated code holds in an int
BITS_C = {2: "unsigned short", 4: "unsigned int"}  # the C type of an element's bits, by its bytes (moved as)


def grid_blocks(threads: int) -> int:
    """The blocks of BLOCK threads of a launch with work for `threads` threads."""
    return max(1, min((threads + BLOCK - 1) // BLOCK, MAX_GRID))


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
