"""A kernel with row reductions, cut into stages for a persistent launch.

In a persistent launch each block owns a slice of the columns of its rows, so no block sees a whole row:
a row reduction is a stage boundary. The kernel becomes one launch per pass over the row (the passes of
the reduction kernel: a reduction's result is there from the pass after the one that computes its
argument). A stage ends by summing, in each block, its own columns of every argument reduced next, into
the block's column of a [batch, blocks] buffer of partial sums (an output of kind `sums`); the next
stage, after a grid-wide barrier, reads the partial sums of its rows from every block and adds them up
(an input of kind `sums`; a mean then divides by the width). The block's own values that a later stage
reads go through memory, in a [batch, width] buffer of the stage's own: the block wrote them itself, so
they need no barrier.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..graph_model import OPS
from .cuda_kernels import row_passes
from .plan import Access, Buffer, Const, Instr, KernelLaunch


@dataclass(frozen=True)
class Stages:
    launches: list[KernelLaunch]
    buffers: list[Buffer]  # the partial sums and the values carried from one stage to the next


def reduces(launch: KernelLaunch) -> bool:
    return any(instr.op.is_reduction for instr in launch.body)


def row_stages(launch: KernelLaunch, prefix: str, column_blocks: int) -> Stages:
    """The stages of a kernel with row reductions (see the module's doc); `prefix` starts the names of
    the buffers they add (the layer's), and `column_blocks` is the number of blocks that share a row."""
    level = row_passes(launch.body)
    last = max(level.values())
    inputs = dict(launch.inputs)
    reductions = [i for i in launch.body if i.op.is_reduction]
    readers: dict[str, list[int]] = {}  # value -> the passes of the non-reducing ops that read it
    for instr in launch.body:
        if not instr.op.is_reduction:
            for a in instr.args:
                if not isinstance(a, Const):
                    readers.setdefault(a, []).append(level[instr.result])
    out_passes = {v: level.get(v, 0) for v, _ in launch.outputs}
    buffers: list[Buffer] = []
    carried: dict[str, Access] = {}  # a value computed in one pass and read in a later one
    partial: dict[str, Access] = {}  # a reduction's result -> its partial sums
    for red in reductions:
        name = f"{prefix}partial.{red.result}"
        buffers.append(Buffer(name, "batch", column_blocks, "value"))
        partial[red.result] = Access(name, "sums", column_blocks)

    def carry(v: str) -> Access:
        if v not in carried:
            name = f"{prefix}stage.{v}"
            buffers.append(Buffer(name, "batch", launch.width, "value"))
            carried[v] = Access(name, "row", launch.width)
        return carried[v]

    stages = []
    for s in range(last + 1):
        body: list[Instr] = []
        ins: dict[str, Access] = {}
        for red in (r for r in reductions if level[r.result] == s):
            if red.op.name == "row_mean":  # the sum of the partial sums, then divided by the width
                total = f"{red.result}#sum"
                ins[total] = partial[red.result]
                body.append(Instr(red.result, OPS["div"], (total, Const(float(launch.width)))))
            else:
                ins[red.result] = partial[red.result]
        body += [i for i in launch.body if level[i.result] == s and not i.op.is_reduction]
        # what the stage has without reading it: its ops' results and the reductions it completes
        available = {i.result for i in body} | {r.result for r in reductions if level[r.result] == s}
        for instr in body:
            for a in instr.args:
                if isinstance(a, Const) or a in available or a in ins:
                    continue
                ins[a] = inputs[a] if a in inputs else carried[a]
        outs: list[tuple[str, Access]] = [(v, acc) for v, acc in launch.outputs if out_passes[v] == s]
        for v in sorted(available):
            if any(p > s for p in readers.get(v, [])):
                outs.append((v, carry(v)))
        for red in (r for r in reductions if level[r.result] == s + 1):
            (arg,) = red.args  # computed in this stage, or an input (the pass of a reduction's argument)
            if arg not in available:
                ins[arg] = inputs[arg]
            outs.append((arg, partial[red.result]))
        stages.append(KernelLaunch(f"{launch.island}.{s}", launch.row_kind, launch.rows, launch.width,
                                   tuple(ins.items()), tuple(outs), tuple(body), launch.hoisted))
    return Stages(stages, buffers)
