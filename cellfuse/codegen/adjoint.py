"""The adjoint of an elementwise island: the body of the kernel that, for one step of the backward pass,
takes the island's inputs and the gradients of its outputs and gives the gradients of its inputs.

The backward pass keeps no intermediate value of an island: it saves the island's inputs (GEMM outputs,
states, hoisted values), and the adjoint first recomputes the forward body from them, in registers,
then sweeps it in reverse. Each instruction passes its result's gradient to each argument that is a value
through the op table's derivative rule (`GradInstr`), and gradients that reach the same value add up.
An output that is also used inside the island starts from the gradient that comes from outside and
collects the inside ones on top.

Every value of a body has a kind, as the accesses of its kernel have (`value_kinds`): a row of the
launch's width, a [N] vector the same for every row, a column (one number per row: a row reduction's
result, or what is computed from such values) or a scalar. A derivative rule gives its argument's
gradient in the kind of the instruction's result, one per element where the result is a row. Where a
column meets a row in an instruction, every element of the row read the column's one number, so the
column's gradient is the sum over the row of those per-element parts: the adjoint sums them with a
`row_sum` of its own, and a column's gradient is a column again. A row reduction's own rule goes the
other way: its result's gradient, one per row, spreads over the elements of its argument (divided by
the width for a mean). The adjoint of an island that reduces rows, or that reads a column and passes it
a gradient, therefore reduces rows too: its CUDA kernel runs a block per row, in passes split at each
row sum (`cuda_kernels.reduction_kernel_source`), and the numpy executor runs its body over whole rows.

Where an input was broadcast over the rows (a [N] weight or value, a scalar), its gradient here is still
one per element: the backward pass sums it over the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from ..graph_model import OPS
from .plan import Const, GradInstr, Instr, grad_of

Kind = Literal["row", "vec", "col", "scalar"]  # as an Access's kind


@dataclass(frozen=True)
class Adjoint:
    body: tuple[Instr | GradInstr, ...]  # the forward body, then the reverse sweep
    # island input -> the name of its gradient in the body; an input no gradient reaches is absent
    grads: dict[str, str]


def join(a: Kind, b: Kind) -> Kind:
    """The kind of a value computed from values of kinds a and b (broadcasting): a scalar spreads over
    anything; a [N] vector and a column spread over each other into a row."""
    if a == b or b == "scalar":
        return a
    return b if a == "scalar" else "row"


def value_kinds(body: tuple[Instr | GradInstr, ...], inputs: Mapping[str, Kind]) -> dict[str, Kind]:
    """The kind of every value of a body, from the kinds of the kernel's inputs: a row reduction's result
    is a column; anything else is what its arguments (and a gradient's result, and the gradient it
    starts from) broadcast to."""
    kinds: dict[str, Kind] = dict(inputs)
    for instr in body:
        if isinstance(instr, Instr) and instr.op.is_reduction:
            kinds[instr.result] = "col"
            continue
        named = [a for a in instr.args if not isinstance(a, Const)]
        if isinstance(instr, GradInstr):
            named += [instr.dy, instr.y]
        kind: Kind = "scalar"
        for a in named:
            kind = join(kind, kinds[a])
        kinds[instr.result] = kind
    return kinds


def adjoint(body: tuple[Instr, ...], inputs: Mapping[str, Kind], outputs: list[str]) -> Adjoint:
    """The adjoint of an island's body, given the kind of each input; the gradient of each output comes in
    as `grad_of(output)`, of the output's kind where that is a column and one per element otherwise."""
    kinds = value_kinds(body, inputs)
    grad = {v: grad_of(v) for v in outputs}  # the current name of each value's gradient
    # a column's parts from the rows that read it, added per element: one row sum takes them all
    spread: dict[str, str] = {}
    out: list[Instr | GradInstr] = list(body)
    names: dict[str, int] = {}

    def fresh(value: str) -> str:
        names[value] = names.get(value, 0) + 1
        return f"{grad_of(value)}#{names[value]}"

    def add(into: dict[str, str], value: str, part: str) -> None:
        if value in into:
            total = fresh(value)
            out.append(Instr(total, OPS["add"], (into[value], part)))
            into[value] = total
        else:
            into[value] = part

    def gather(value: str) -> None:
        """A column's gradient is complete: its parts from the rows, summed over the row, join it."""
        if value in spread:
            total = fresh(value)
            out.append(Instr(total, OPS["row_sum"], (spread.pop(value),)))
            add(grad, value, total)

    for instr in reversed(body):
        gather(instr.result)
        dy = grad.get(instr.result)
        if dy is None:  # nothing downstream of it reaches an output
            continue
        for k, a in enumerate(instr.args):
            if isinstance(a, Const):
                continue
            part = fresh(a)
            out.append(GradInstr(part, instr.op, k, dy, instr.args, instr.result))
            # every element of a row read a column's one number
            add(spread if kinds[a] == "col" and kinds[instr.result] != "col" else grad, a, part)
    for v in inputs:
        gather(v)
    return Adjoint(tuple(out), {v: grad[v] for v in inputs if v in grad})
