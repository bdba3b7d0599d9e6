"""What a wire dropped on empty canvas offers: the ops whose node can take it, and the port it goes to.

A wire pulled out of an output port carries a value: it fits an op that takes an argument (or the
cell's output). A wire pulled out of an input port wants a value: it fits an op that gives one. A
weight's value goes to a matmul's weight port first, the likeliest place for it.

Plain Python on the op table.
"""

from __future__ import annotations

from ..graph_model import OPS

OUTPUT_SINK = "output"  # the palette's name for the cell's output node
WEIGHT_PORT = "W"  # the matmul's weight


def ops_for_wire(from_output: bool, source_op: str, port: str) -> list[str]:
    """The ops (and the output sink) a node added at the end of a dropped wire may be, likeliest first:
    `from_output` for a wire out of a node of op `source_op`, else one into its input port `port`."""
    if from_output:
        fits = [name for name, spec in OPS.items() if spec.args] + [OUTPUT_SINK]
        if source_op == "weight":  # a weight is a matmul's right operand, or a bias
            fits.sort(key=lambda name: WEIGHT_PORT not in OPS[name].args if name in OPS else True)
        return fits
    fits = list(OPS)
    if port == WEIGHT_PORT:
        fits.sort(key=lambda name: name != "weight")
    return fits


def port_for(args: list[str], source_op: str) -> int:
    """The input port, of a new node whose ports are `args`, that a wire out of a `source_op` node goes
    into: a weight's into a weight port where there is one, any other value into the first port."""
    if source_op == "weight" and WEIGHT_PORT in args:
        return args.index(WEIGHT_PORT)
    return 0
