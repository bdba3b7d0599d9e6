"""The adjoint of an elementwise island: the body of the kernel that, for one step of the backward pass,
takes the island's inputs and the gradients of its outputs and gives the gradients of its inputs.

The backward pass keeps no intermediate value of an island: it saves the island's inputs (GEMM outputs,
states, hoisted values), and the adjoint first recomputes the forward body from them, in registers,
then sweeps it in reverse. Each instruction passes its result's gradient to each argument that is a value
through the op table's derivative rule (`GradInstr`), and gradients that reach the same value add up.
An output that is also used inside the island starts from the gradient that comes from outside and
collects the inside ones on top.

Where an input was broadcast over the rows (a [N] weight or value, a scalar), its gradient here is still
one per element: the backward pass sums it over the rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph_model import OPS
from .plan import Const, GradInstr, Instr, grad_of


@dataclass(frozen=True)
class Adjoint:
    body: tuple[Instr | GradInstr, ...]  # the forward body, then the reverse sweep
    # island input -> the name of its gradient in the body; an input no gradient reaches is absent
    grads: dict[str, str]


def adjoint(body: tuple[Instr, ...], inputs: list[str], outputs: list[str]) -> Adjoint:
    """The adjoint of an island's body; the gradient of each output comes in as `grad_of(output)`."""
    grad = {v: grad_of(v) for v in outputs}  # the current name of each value's gradient
    out: list[Instr | GradInstr] = list(body)
    names: dict[str, int] = {}

    def fresh(value: str) -> str:
        names[value] = names.get(value, 0) + 1
        return f"{grad_of(value)}#{names[value]}"

    for instr in reversed(body):
        dy = grad.get(instr.result)
        if dy is None:  # nothing downstream of it reaches an output
            continue
        for k, a in enumerate(instr.args):
            if isinstance(a, Const):
                continue
            part = fresh(a)
            out.append(GradInstr(part, instr.op, k, dy, instr.args, instr.result))
            if a in grad:
                total = fresh(a)
                out.append(Instr(total, OPS["add"], (grad[a], part)))
                grad[a] = total
            else:
                grad[a] = part
    return Adjoint(tuple(out), {v: grad[v] for v in inputs if v in grad})
