"""Sequences of their own lengths in one batch: the cell rewritten so that each batch row stops at its own
length, in whatever schedule runs it, forward and backward.

`masked(cell)` adds a state, STEPS_LEFT, that a run starts at each row's length (in every element of the
row) and that each step lowers by one; while it is positive the step's mask m is 1, after it 0 (min(relu(
left), 1), exact for whole numbers). Every state's update becomes m * new + (1 - m) * old, which is new or
old exactly where m is 1 or 0, so that a row's states stay at their values of its last step; and the
output becomes m * y, zero past the row's length. The rewritten cell is a cell like any other: every rung
plans and runs it, and its backward pass is derived as any cell's (no gradient reaches x past a row's
length; STEPS_LEFT's gradient is dropped by the caller).

The new nodes' ids start with RESERVED, which a user's cell may not use for this to apply.
"""

from __future__ import annotations

from copy import deepcopy

from .cell import Cell, Node
from .validate import CellError

RESERVED = "cf_len_"
STEPS_LEFT = f"{RESERVED}left"


def masked(cell: Cell) -> Cell:
    """The cell that runs each batch row to its own length: STEPS_LEFT is its last state, to be started
    at the rows' lengths."""
    clash = [n.id for n in cell.nodes if n.id.startswith(RESERVED)]
    if clash:
        raise CellError(f"cell '{cell.name}': node '{clash[0]}' has an id that starts with {RESERVED!r}, "
                        "which sequences of their own lengths need for nodes of their own")
    out = deepcopy(cell)
    out.groups, out.layout = [], {}
    out.description = " ".join(filter(None, [cell.description, (
        f"Each batch row runs to its own length: its last state, {STEPS_LEFT}, starts at the row's length in "
        "every element of the row.")]))

    def add(node_id: str, op: str, *args: str, value: float | None = None) -> str:
        out.nodes.append(Node(RESERVED + node_id, op, list(args), value=value))
        return RESERVED + node_id

    left = add("left", "state")
    one = add("one", "const", value=1.0)
    mask = add("mask", "min", add("left_positive", "relu", left), one)
    keep = add("keep", "sub", one, mask)
    for state, new in cell.updates.items():
        out.updates[state] = add(f"{state}_next", "add", add(f"{state}_new", "mul", mask, new),
                                 add(f"{state}_old", "mul", keep, state))
    out.updates[left] = add("left_next", "sub", left, one)
    out.output = add("y", "mul", mask, cell.output)
    return out
