"""Cells of real size for the editor's tests and benchmark: LSTM blocks in series inside one step, about
40 nodes a block, each block a group."""

from __future__ import annotations

from cellfuse.graph_model import Cell
from cellfuse.graph_model.builder import CellBuilder, function

sigmoid, tanh = function("sigmoid"), function("tanh")


def lstm_stack(blocks: int) -> Cell:
    """`blocks` LSTM blocks in series inside one step (each its own h and c, the next block's input its
    h)."""
    b = CellBuilder(f"LSTM stack of {blocks}")
    x = b.input("x")
    source, width = x, "input"
    last = None
    for k in range(blocks):
        with b.group(f"block {k}"):
            h, c = b.state(f"h{k}"), b.state(f"c{k}")
            gates = {}
            for g in "ifog":
                w = b.weight(f"W{g}{k}", width, "hidden")
                u = b.weight(f"U{g}{k}", "hidden", "hidden")
                bias = b.weight(f"b{g}{k}", "hidden")
                act = tanh if g == "g" else sigmoid
                gates[g] = act(source @ w + h @ u + bias)
            c_new = (gates["f"] * c + gates["i"] * gates["g"]).named(f"c_new{k}")
            h_new = (gates["o"] * tanh(c_new)).named(f"h_new{k}")
        b.update(h, h_new)
        b.update(c, c_new)
        source, width, last = h_new, "hidden", h_new
    b.output(last)
    return b.build()
