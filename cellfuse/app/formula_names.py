"""Names for the nodes a typed formula adds (Ctrl+Shift+F), from the formula itself.

The formula's planner names the node the whole formula computes after its left side (`f`, `h_new`,
`y`) and every node inside it after its op (`matmul1`, `add2`), which say nothing on the canvas. Here
each of those inner nodes is named after what it computes from its operands: `x @ W_f` is `xW_f`,
`xW_f + b_f` is `xW_f_plus_b_f`, `tanh(c_new)` is `tanh_c_new`; a name that would run longer than
MAX_NAME falls back to the left side's name and the op (`f_plus` in `f = sigmoid(x @ W_f + h @ U_f
+ b_f)`). Sources (weights, states, constants)
keep the names they were given.

Plain Python on graph_model's FormulaEdit.
"""

from __future__ import annotations

import re

from ..graph_model import Cell, FormulaEdit
from ..graph_model.validate import ID_PATTERN

MAX_NAME = 16  # about what a node's title shows whole
OP_WORDS = {"add": "plus", "sub": "minus", "mul": "times", "div": "over"}


def _planner_named(node_id: str, op: str) -> bool:
    """Whether an id is the one the planner gives a node after its op ('add', 'add3')."""
    return re.fullmatch(rf"{re.escape(op)}\d*", node_id) is not None


def expression_name(op: str, args: list[str]) -> str:
    """A node's name from what it computes: `xW_f`, `a_plus_b`, `sigmoid_af`."""
    if op == "matmul" and len(args) == 2:
        a, w = args
        return f"{a}{w}" if len(a) == 1 else f"{a}_{w}"
    if op in OP_WORDS and len(args) == 2:
        return f"{args[0]}_{OP_WORDS[op]}_{args[1]}"
    return "_".join([op, *args])


def name_nodes(edit: FormulaEdit, cell: Cell) -> FormulaEdit:
    """`edit` with its inner nodes renamed after what they compute (see the module's doc); the ids it
    sets as updates or as the output, and every source, keep theirs. Returns the same edit."""
    kept = set(edit.updates.values()) | {edit.output}
    taken = {n.id for n in cell.nodes} | {n.id for n in edit.nodes}
    stem = edit.target.rstrip("'′")
    renamed: dict[str, str] = {}
    for node in edit.nodes:  # args before the nodes that use them
        node.args = [renamed.get(a, a) for a in node.args]
        if node.id in kept or not node.args or not _planner_named(node.id, node.op):
            continue
        name = expression_name(node.op, node.args)
        if len(name) > MAX_NAME or not ID_PATTERN.match(name):
            name = f"{stem}_{OP_WORDS.get(node.op, node.op)}"
        if not ID_PATTERN.match(name):
            continue
        taken.discard(node.id)
        name = _fresh(name, taken)
        taken.add(name)
        renamed[node.id] = node.id = name
    return edit


def _fresh(name: str, taken: set[str]) -> str:
    if name not in taken:
        return name
    i = 2
    while f"{name}{i}" in taken:
        i += 1
    return f"{name}{i}"
