"""Validation and shape inference of a cell.

Shapes are symbolic: a tuple of "B" (the batch), "input" and "hidden". A cell is checked once for
all sizes, so a cell that validates runs at any input and hidden size.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Literal

from .cell import Cell, Node
from .limits import MAX_NODES
from .ops import OPS

Shape = tuple[str, ...]
ROW = "B"
DIMS = ("input", "hidden")
ID_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def is_finite_number(v: object) -> bool:
    """A finite int or float (not a bool, and not an int too large for a float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def shown(value: object, limit: int = 60) -> str:
    """repr(value) for a message, cut short: a value from a file or a caller may be huge, or an int too
    long for Python to print, and a message must still come out, and stay one line."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        text = f"<a {type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[:limit] + "..."


def number_str(n: int) -> str:
    """An int for a message; one too long to print (Python refuses beyond 4300 digits) by its size."""
    if n.bit_length() <= 64:
        return str(n)
    return f"a number of about {int(n.bit_length() * math.log10(2)) + 1} digits"


def check_count(name: str, value: object, limit: int) -> int:
    """`value` as a whole number from 1 to `limit`; a CellError naming `name`, the value and the limit
    otherwise. A bool is refused: True is an int to Python, but never a size."""
    try:
        n = None if isinstance(value, bool) else operator.index(value)  # numpy's integers too
    except TypeError:
        n = None
    if n is None:
        raise CellError(f"{name} must be a whole number, got {shown(value)}")
    if n < 1:
        raise CellError(f"{name} must be at least 1, got {number_str(n)}")
    if n > limit:
        raise CellError(f"{name} is {number_str(n)}, above the limit of {limit}")
    return n


def shape_str(shape: Shape | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("batch" if d == ROW else d for d in shape) + "]"


@dataclass(frozen=True)
class Problem:
    severity: Literal["error", "warning"]
    message: str
    node: str | None = None

    def __str__(self) -> str:
        where = f"node '{self.node}': " if self.node else ""
        return f"{self.severity}: {where}{self.message}"


class CellError(Exception):
    """A cell, a cell file or a run's data that cannot be used; the message says what and where."""

    def __init__(self, message: str, problems: list[Problem] | None = None):
        super().__init__(message)
        self.problems = problems or []


@dataclass
class CellInfo:
    """What validation learnt about a cell."""

    problems: list[Problem] = field(default_factory=list)
    shapes: dict[str, Shape] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # topological order of the live nodes
    dead: set[str] = field(default_factory=set)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    if a == b:
        return a
    if a == ():
        return b
    if b == ():
        return a
    if len(a) == 2 and len(b) == 1 and a[1] == b[0]:
        return a
    if len(b) == 2 and len(a) == 1 and b[1] == a[0]:
        return b
    return None


def _find_cycle(ids: list[str], args: dict[str, list[str]]) -> list[str] | None:
    color = dict.fromkeys(ids, 0)  # 0 new, 1 on the path, 2 done
    for root in ids:
        if color[root]:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = []
        while stack:
            node, i = stack.pop()
            if i == 0:
                color[node] = 1
                path.append(node)
            succ = args.get(node, [])
            if i < len(succ):
                stack.append((node, i + 1))
                nxt = succ[i]
                if color.get(nxt) == 1:
                    return path[path.index(nxt):]
                if color.get(nxt) == 0:
                    stack.append((nxt, 0))
            else:
                color[node] = 2
                path.pop()
    return None


def _topo(ids: list[str], args: dict[str, list[str]]) -> list[str]:
    order: list[str] = []
    seen: set[str] = set()
    for root in ids:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            stack.extend((a, False) for a in reversed(args[node]) if a not in seen)
    return order


def _check_node_types(i: int, n: object) -> None:
    if not isinstance(n, Node):
        raise CellError(f"node #{i + 1} is a {type(n).__name__}, not a Node")
    if not isinstance(n.id, str):
        raise CellError(f"node #{i + 1}: 'id' must be a string, got {shown(n.id)}")
    if not isinstance(n.op, str):
        raise CellError(f"node '{n.id}': 'op' must be a string, got {shown(n.op)}")
    if not isinstance(n.args, list) or not all(isinstance(a, str) for a in n.args):
        raise CellError(f"node '{n.id}': 'args' must be a list of node ids, got {shown(n.args)}")


def check_types(cell: object) -> None:
    """Raises CellError unless the cell's fields have the types a loaded cell has.

    A cell file's loader guarantees them; a Cell built by hand in Python may break them, and then
    there is no graph to report problems about: the message names the node or field instead.
    """
    if not isinstance(cell, Cell):
        raise CellError(f"expected a Cell, got a {type(cell).__name__}")
    if not isinstance(cell.name, str):
        raise CellError(f"the cell's 'name' must be a string, got {shown(cell.name)}")
    if not isinstance(cell.nodes, list):
        raise CellError(f"'nodes' must be a list of Node, got {shown(cell.nodes)}")
    for i, n in enumerate(cell.nodes):
        _check_node_types(i, n)
    if not isinstance(cell.updates, dict) or not all(isinstance(s, str) and isinstance(t, str)
                                                     for s, t in cell.updates.items()):
        raise CellError(f"'updates' must map state ids to node ids, got {shown(cell.updates)}")
    if cell.output is not None and not isinstance(cell.output, str):
        raise CellError(f"'output' must be a node id or None, got {shown(cell.output)}")
    if not isinstance(cell.sizes, dict):  # its values are checked where they are used, as any size is
        raise CellError(f"'sizes' must map 'input' and 'hidden' to sizes, got {shown(cell.sizes)}")


def analyze(cell: Cell) -> CellInfo:
    """Every problem of the cell, and, when it has no structural error, its shapes and order.

    Raises CellError only for a cell whose fields have the wrong types (see `check_types`)."""
    check_types(cell)
    info = CellInfo()
    err = info.problems.append

    def error(msg: str, node: str | None = None) -> None:
        err(Problem("error", msg, node))

    if len(cell.nodes) > MAX_NODES:  # the scheduler's passes are not linear in the nodes
        error(f"the cell has {len(cell.nodes)} nodes, more than the limit of {MAX_NODES}")
        return info

    # Ids, ops, arity, args.
    seen: set[str] = set()
    for n in cell.nodes:
        if not ID_PATTERN.match(n.id):
            error(f"id '{n.id}' is not a valid name (letters, digits and _, not starting with a digit)",
                  n.id)
        if n.id in seen:
            error(f"duplicate id '{n.id}'", n.id)
        seen.add(n.id)
    nodes = cell.by_id()
    for n in cell.nodes:
        spec = OPS.get(n.op)
        if spec is None:
            error(f"unknown op '{n.op}' (known: {', '.join(OPS)})", n.id)
            continue
        if len(n.args) != spec.arity:
            error(f"'{n.op}' takes {spec.arity} arg{'s' if spec.arity != 1 else ''}, "
                  f"got {len(n.args)}", n.id)
        for a in n.args:
            if a not in nodes:
                error(f"arg '{a}' names no node", n.id)
        if n.op == "weight":
            if (not isinstance(n.shape, list) or len(n.shape) not in (1, 2)
                    or any(d not in DIMS for d in n.shape)):
                error(f"weight shape must be one or two of {list(DIMS)}, got {shown(n.shape)}", n.id)
        elif n.shape is not None:
            error(f"only weights have a shape ('{n.op}' node has {shown(n.shape)})", n.id)
        if n.op == "const":
            if not is_finite_number(n.value):
                error(f"a const needs a finite number as its value, got {shown(n.value)}", n.id)
        elif n.value is not None:
            error(f"only consts have a value ('{n.op}' node has {shown(n.value)})", n.id)

    inputs = cell.of_op("input")
    if not inputs:
        error("the cell has no input node")
    for extra_input in inputs[1:]:
        error("a cell has exactly one input node", extra_input.id)

    for state, target in cell.updates.items():
        if state not in nodes:
            error(f"updates names '{state}', which is no node")
        elif nodes[state].op != "state":
            error(f"updates names '{state}', which is a '{nodes[state].op}' node, not a state",
                  state)
        if target not in nodes:
            error(f"the update of '{state}' names '{target}', which is no node", state)
    for s in cell.of_op("state"):
        if s.id not in cell.updates:
            error("state has no update (add it to 'updates')", s.id)
        if s.id == "x":  # the inputs file keys initial states by id, and the input sequence is its 'x'
            error("a state cannot be called 'x': an inputs file holds the input sequence under 'x'", s.id)
    if cell.output is None:
        error("the cell has no output")
    elif cell.output not in nodes:
        error(f"output names '{cell.output}', which is no node")

    if info.errors:
        return info

    args = {n.id: list(n.args) for n in cell.nodes}
    cycle = _find_cycle([n.id for n in cell.nodes], args)
    if cycle:
        error("cycle that passes through no state: " + " -> ".join(cycle + [cycle[0]])
              + " (a value of the previous step must come from a state node)", cycle[0])
        return info

    # Shapes, in topological order.
    order = _topo([n.id for n in cell.nodes], args)
    shapes: dict[str, Shape] = {}
    for nid in order:
        n = nodes[nid]
        if n.op == "input":
            shapes[nid] = (ROW, "input")
        elif n.op == "state":
            shapes[nid] = (ROW, "hidden")
        elif n.op == "weight":
            shapes[nid] = tuple(n.shape or ())
        elif n.op == "const":
            shapes[nid] = ()
        elif any(a not in shapes for a in n.args):
            continue  # an arg is already wrong; its node carries the error
        elif n.op == "matmul":
            a, w = n.args
            wn = nodes[w]
            if wn.op != "weight" or len(shapes[w]) != 2:
                error(f"the second arg of matmul must be a 2-D weight; '{w}' is "
                      f"{'a ' + wn.op if wn.op != 'weight' else 'a 1-D weight'} "
                      f"of shape {shape_str(shapes[w])}", nid)
                continue
            sa = shapes[a]
            if len(sa) != 2 or sa[0] != ROW or sa[1] != shapes[w][0]:
                error(f"shape mismatch: '{a}' is {shape_str(sa)} but '{w}' is "
                      f"{shape_str(shapes[w])}; matmul needs [batch, K] @ [K, N]", nid)
                continue
            shapes[nid] = (ROW, shapes[w][1])
        else:
            arg_shapes = [shapes[a] for a in n.args]
            bad = [a for a in n.args if len(shapes[a]) == 2 and shapes[a][0] != ROW]
            if bad:
                error(f"'{bad[0]}' is a 2-D weight of shape {shape_str(shapes[bad[0]])}; 2-D weights "
                      "are only used as the W of a matmul", nid)
                continue
            out = arg_shapes[0]
            for s in arg_shapes[1:]:
                out = _broadcast(out, s)
                if out is None:
                    break
            if out is None:
                desc = ", ".join(f"'{a}' is {shape_str(shapes[a])}" for a in n.args)
                error(f"shape mismatch in '{n.op}': {desc}", nid)
                continue
            shapes[nid] = out
    info.shapes = shapes

    hidden_row = (ROW, "hidden")
    for state, target in cell.updates.items():
        if target in shapes and shapes[target] != hidden_row:
            error(f"the update of state '{state}' is '{target}' of shape "
                  f"{shape_str(shapes[target])}; a state must be {shape_str(hidden_row)}", state)
    if cell.output in shapes and shapes[cell.output] != hidden_row:
        error(f"the output '{cell.output}' is {shape_str(shapes[cell.output])}; the output must be "
              f"hidden-sized, {shape_str(hidden_row)}", cell.output)

    # Liveness: what the updates and the output depend on.
    live: set[str] = set()
    stack = [t for t in cell.updates.values()] + [cell.output]
    while stack:
        nid = stack.pop()
        if nid in live:
            continue
        live.add(nid)
        stack.extend(args[nid])
    for n in cell.nodes:
        if n.id in live or n.op == "state":
            continue
        if n.op == "input":
            error("the input is not used by any update or the output", n.id)
        else:
            info.problems.append(Problem("warning", "no update or output depends on this node", n.id))
    info.dead = {n.id for n in cell.nodes if n.id not in live and n.op != "state"}
    info.order = [nid for nid in order if nid not in info.dead]
    return info


def state_dependent(cell: Cell, order: list[str]) -> dict[str, bool]:
    """For each node of `order` (a topological order, as CellInfo.order), whether it depends on a state:
    what must run inside the time loop, and what may run once for all steps before it."""
    nodes = cell.by_id()
    dep: dict[str, bool] = {}
    for n in order:
        dep[n] = nodes[n].op == "state" or any(dep[a] for a in nodes[n].args)
    return dep


def require_valid(cell: Cell) -> CellInfo:
    """The cell's analysis; raises CellError listing every error if it has any."""
    info = analyze(cell)
    if not info.ok:
        lines = "\n".join(f"  {p}" for p in info.errors)
        raise CellError(f"cell '{cell.name}' has {len(info.errors)} error(s):\n{lines}", info.errors)
    return info
