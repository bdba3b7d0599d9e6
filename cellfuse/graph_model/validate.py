"""Validation and shape inference of a cell.

Shapes are symbolic: a tuple of "B" (the batch), "input", "hidden" and "1" (the one column of a row
reduction's result, [batch, 1], which spreads over a row as a [N] row spreads over the batch). A cell
is checked once for
all sizes, so a cell that validates runs at any input and hidden size, except where an elementwise op
combines a [batch, input] value with a [batch, hidden] one: such a cell runs only where the two sizes
are equal, and its analysis lists the nodes that tie them (`CellInfo.ties`).
"""

from __future__ import annotations

import math
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from .cell import Cell, Node
from .limits import MAX_NODES
from .ops import OPS

Shape = tuple[str, ...]
ROW = "B"
DIMS = ("input", "hidden")
ONE = "1"  # the width of a row reduction's result: one number per row
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


def update_title(state_id: str) -> str:
    """The editor's title of a state's update node (the value the state takes for the next step); never
    a valid cell id, so it cannot clash with one. Messages name the node by it."""
    return f"{state_id} (next)"


OUTPUT_TITLE = "cell output"  # the editor's title of the output node


def shape_str(shape: Shape | None) -> str:
    if shape is None:
        return "?"
    return "[" + ", ".join("batch" if d == ROW else d for d in shape) + "]"


@dataclass(frozen=True)
class Problem:
    """An error (the cell cannot run), a warning (it runs, but something in it is likely a mistake) or
    an info (it runs, under a condition the user should know of)."""

    severity: Literal["error", "warning", "info"]
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


@dataclass(frozen=True)
class WidthTie:
    """An elementwise node that combines a [batch, input] value with a [batch, hidden] one: the cell
    runs only where the input size equals the hidden size, as it does in every layer above the first."""

    node: str
    reason: str  # what the node combines, e.g. "adds 'x' [batch, input] to 'h_new' [batch, hidden]"


@dataclass
class CellInfo:
    """What validation learnt about a cell."""

    problems: list[Problem] = field(default_factory=list)  # errors and warnings
    shapes: dict[str, Shape] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # topological order of the live nodes
    dead: set[str] = field(default_factory=set)
    ties: list[WidthTie] = field(default_factory=list)  # of the nodes that are computed, in topological order

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def notes(self) -> list[Problem]:
        """What a user should know of a cell that runs, as info-level problems: the conditions its
        sizes must meet. Apart from `problems`, which lists what may need fixing."""
        return [Problem("info", f"{t.reason}, so the first layer's input size must equal the hidden size; "
                                "the result is [batch, hidden]", t.node) for t in self.ties]


def broadcast(a: Shape, b: Shape) -> Shape | None:
    """The shape of an elementwise op on values of shapes a and b (none of them a 2-D weight), None where
    they do not combine: validation's rule, public for any other module that infers shapes."""
    if a == b:
        return a
    if a == ():
        return b
    if b == ():
        return a
    # [batch, 1]: one number per row, the same for every column of the row
    if a == (ROW, ONE) and (len(b) == 2 or len(b) == 1 and b[0] != ONE):
        return (ROW, b[-1])
    if b == (ROW, ONE) and (len(a) == 2 or len(a) == 1 and a[0] != ONE):
        return (ROW, a[-1])
    if len(a) == 2 and len(b) == 2:
        # [batch, input] and [batch, hidden]: a width tie (see WidthTie). The result is hidden-wide, so
        # that it can be a state's update or the output.
        return (ROW, "hidden")
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
    """Every problem of the cell, the shape of every node whose shape can be known, and, when the cell
    has no structural error, its order.

    Shapes and unused nodes are checked whatever other errors the cell has, so that a half-drawn cell
    shows all it can: only what is computed from a node with an error of its own goes unchecked.
    Messages name nodes and ports as the editor's canvas shows them.

    Raises CellError only for a cell whose fields have the wrong types (see `check_types`)."""
    check_types(cell)
    info = CellInfo()
    if len(cell.nodes) > MAX_NODES:  # the scheduler's passes are not linear in the nodes
        info.problems.append(Problem("error", f"the cell has {len(cell.nodes)} nodes, more than the limit "
                                              f"of {MAX_NODES}"))
        return info
    _check_structure(cell, info)
    structural = not info.ok
    # A node with an error of its own has no shape, nor has anything computed from it; the rest of
    # the graph is checked as usual. A state's errors never make its shape unknown, unless another
    # node has its id.
    counts = Counter(n.id for n in cell.nodes)
    broken = {p.node for p in info.errors if p.node is not None} - {s.id for s in cell.of_op("state")}
    broken |= {nid for nid, count in counts.items() if count > 1}
    order = _infer_shapes(cell, info, broken)
    _check_liveness(cell, info)
    info.ties = [t for t in info.ties if t.node not in info.dead]  # a node not computed ties nothing
    if order is not None and not structural:
        info.order = [nid for nid in order if nid not in info.dead]
    return info


def _error(info: CellInfo, message: str, node: str | None = None) -> None:
    info.problems.append(Problem("error", message, node))


def port_name(op: str, i: int) -> str:
    """The canvas's name of the i-th (0-based) input port of an op: the op table's arg name."""
    spec = OPS.get(op)
    names = spec.args if spec is not None else ()
    return names[i] if i < len(names) else f"#{i + 1}"


def _ports(names: list[str]) -> str:
    if len(names) == 1:
        return f"port {names[0]}"
    return f"ports {', '.join(names[:-1])} and {names[-1]}"


def _check_args(n: Node, nodes: dict[str, Node], info: CellInfo) -> None:
    """Each port of the node connected once, to a node that exists."""
    spec = OPS[n.op]
    if len(n.args) > spec.arity:
        ports = f" ({', '.join(spec.args)})" if spec.args else ""
        _error(info, f"'{n.op}' takes {spec.arity} arg{'s' if spec.arity != 1 else ''}{ports}, "
                     f"got {len(n.args)}", n.id)
    # An empty id is a port the editor shows unconnected; missing args at the end are too.
    unconnected = [port_name(n.op, i) for i, a in enumerate(n.args[:spec.arity]) if a == ""]
    unconnected += [port_name(n.op, i) for i in range(len(n.args), spec.arity)]
    if unconnected:
        verb = "is" if len(unconnected) == 1 else "are"
        _error(info, f"{_ports(unconnected)} of '{n.id}' {verb} not connected", n.id)
    for i, a in enumerate(n.args):
        if a != "" and a not in nodes:
            _error(info, f"{_ports([port_name(n.op, i)])} of '{n.id}' names '{a}', which is no node", n.id)


def _check_structure(cell: Cell, info: CellInfo) -> None:
    """Ids, ops, ports, weight shapes, const values, the input, the updates and the output."""
    seen: set[str] = set()
    for n in cell.nodes:
        if not ID_PATTERN.match(n.id):
            _error(info, f"id '{n.id}' is not a valid name (letters, digits and _, not starting with a "
                         "digit)", n.id)
        if n.id in seen:
            _error(info, f"duplicate id '{n.id}'", n.id)
        seen.add(n.id)
    nodes = cell.by_id()
    for n in cell.nodes:
        if n.op not in OPS:
            _error(info, f"unknown op '{n.op}' (known: {', '.join(OPS)})", n.id)
            continue
        _check_args(n, nodes, info)
        if n.op == "weight":
            if (not isinstance(n.shape, list) or len(n.shape) not in (1, 2)
                    or any(d not in DIMS for d in n.shape)):
                _error(info, f"weight shape must be one or two of {list(DIMS)}, got {shown(n.shape)}", n.id)
        elif n.shape is not None:
            _error(info, f"only weights have a shape ('{n.op}' node has {shown(n.shape)})", n.id)
        if n.op == "const":
            if not is_finite_number(n.value):
                _error(info, f"a const needs a finite number as its value, got {shown(n.value)}", n.id)
        elif n.value is not None:
            _error(info, f"only consts have a value ('{n.op}' node has {shown(n.value)})", n.id)

    inputs = cell.of_op("input")
    if not inputs:
        _error(info, "the cell has no input node")
    for extra_input in inputs[1:]:
        _error(info, "a cell has exactly one input node", extra_input.id)

    for state, target in cell.updates.items():
        if state not in nodes:
            _error(info, f"updates names '{state}', which is no node")
        elif nodes[state].op != "state":
            _error(info, f"updates names '{state}', which is a '{nodes[state].op}' node, not a state", state)
        if target not in nodes:
            _error(info, f"the update of '{state}' names '{target}', which is no node", state)
    for s in cell.of_op("state"):
        if s.id not in cell.updates:
            _error(info, f"'{update_title(s.id)}' has no input: connect the update of state '{s.id}' "
                         "(its value for the next step) to it", s.id)
        if s.id == "x":  # the inputs file keys initial states by id, and the input sequence is its 'x'
            _error(info, "a state cannot be called 'x': an inputs file holds the input sequence under 'x'",
                   s.id)
    if cell.output is None:
        _error(info, f"the cell has no output: connect the layer's output value to the '{OUTPUT_TITLE}' node")
    elif cell.output not in nodes:
        _error(info, f"output names '{cell.output}', which is no node")


def _describe(nid: str, node: Node, shape: Shape) -> str:
    """A value as a message names it: its id, what it is where that explains the shape, its shape."""
    if node.op == "weight":
        return f"'{nid}', a {len(shape)}-D weight {shape_str(shape)}"
    if node.op == "const":
        return f"'{nid}', a const {shape_str(shape)}"
    return f"'{nid}' {shape_str(shape)}"


def _matmul_shape(nid: str, n: Node, nodes: dict[str, Node], shapes: dict[str, Shape],
                  info: CellInfo) -> Shape | None:
    a, w = n.args
    sa, sw = shapes[a], shapes[w]
    pa, pw = port_name("matmul", 0), port_name("matmul", 1)
    if nodes[w].op != "weight" or len(sw) != 2:
        what = "a 1-D weight" if nodes[w].op == "weight" else f"a {nodes[w].op}"
        _error(info, f"matmul '{nid}': port {pw} takes a 2-D weight [K, N]; it gets '{w}', {what} of shape "
                     f"{shape_str(sw)}", nid)
        return None
    if sa == (ROW, ONE):
        _error(info, f"matmul '{nid}': port {pa} gets {_describe(a, nodes[a], sa)}, one number per row (a "
                     f"row reduction's result), which is no GEMM operand; a matmul takes a [batch, {sw[0]}] "
                     "value", nid)
        return None
    if len(sa) != 2 or sa[0] != ROW:
        _error(info, f"matmul '{nid}': port {pa} takes a [batch, {sw[0]}] value (the input, a state or one "
                     f"computed from them); it gets {_describe(a, nodes[a], sa)}", nid)
        return None
    if sa[1] != sw[0]:
        _error(info, f"shape mismatch in matmul '{nid}': port {pa} gets '{a}' {shape_str(sa)}, but port "
                     f"{pw} holds '{w}' {shape_str(sw)}, which expects [batch, {sw[0]}]", nid)
        return None
    return (ROW, sw[1])


def _elementwise_shape(nid: str, n: Node, nodes: dict[str, Node], shapes: dict[str, Shape],
                       info: CellInfo) -> Shape | None:
    for i, a in enumerate(n.args):
        if len(shapes[a]) == 2 and shapes[a][0] != ROW:
            _error(info, f"{n.op} '{nid}': port {port_name(n.op, i)} gets "
                         f"{_describe(a, nodes[a], shapes[a])}; a 2-D weight only goes into port "
                         f"{port_name('matmul', 1)} of a matmul", nid)
            return None
    out: Shape | None = shapes[n.args[0]]
    for a in n.args[1:]:
        out = broadcast(out, shapes[a]) if out is not None else None
    if out is None:
        desc = ", ".join(f"port {port_name(n.op, i)} gets {_describe(a, nodes[a], shapes[a])}"
                         for i, a in enumerate(n.args))
        _error(info, f"shape mismatch in {n.op} '{nid}': {desc}; the shapes must be equal, or one a const "
                     "or a 1-D weight that spreads over the rows", nid)
    elif {shapes[a] for a in n.args} >= {(ROW, "input"), (ROW, "hidden")}:
        info.ties.append(WidthTie(nid, _combines(n, nodes, shapes)))
    return out


def reduced(shape: Shape) -> Shape | None:
    """The shape of a row reduction of a value of `shape`, None where it cannot be reduced: validation's
    rule, public for any other module that infers shapes. Only a [batch, hidden] value is: the kernel that
    reduces it runs a block per row of the hidden width."""
    return (ROW, ONE) if shape == (ROW, "hidden") else None


def _reduction_shape(nid: str, n: Node, nodes: dict[str, Node], shapes: dict[str, Shape],
                     info: CellInfo) -> Shape | None:
    a = n.args[0]
    out = reduced(shapes[a])
    if out is None:
        _error(info, f"{n.op} '{nid}': port {port_name(n.op, 0)} gets {_describe(a, nodes[a], shapes[a])}; "
                     "a row reduction takes a [batch, hidden] value", nid)
    return out


# How a width tie's reason says what its node does with two values, by op; other ops say "applies".
_COMBINING = {"add": "adds {b} to {a}", "sub": "subtracts {b} from {a}", "mul": "multiplies {a} by {b}",
              "div": "divides {a} by {b}"}


def _combines(n: Node, nodes: dict[str, Node], shapes: dict[str, Shape]) -> str:
    described = [_describe(a, nodes[a], shapes[a]) for a in n.args]
    if n.op in _COMBINING and len(described) == 2:
        return _COMBINING[n.op].format(a=described[0], b=described[1])
    return f"applies '{n.op}' to {' and '.join(described)}"


def _infer_shapes(cell: Cell, info: CellInfo, broken: set[str]) -> list[str] | None:
    """The shapes of the nodes not in `broken` and of what is computed from them only, and their
    topological order (None for a cycle)."""
    nodes = cell.by_id()
    ids = [nid for nid in nodes if nid not in broken]
    # A source takes no args (a state with some has its error already).
    args = {nid: [] if OPS[nodes[nid].op].is_source else [a for a in nodes[nid].args
                                                          if a in nodes and a not in broken]
            for nid in ids}
    cycle = _find_cycle(ids, args)
    if cycle:
        _error(info, "cycle that passes through no state: " + " -> ".join(cycle + [cycle[0]])
               + " (a value of the previous step must come from a state node)", cycle[0])
        return None

    order = _topo(ids, args)
    shapes: dict[str, Shape] = {}
    for nid in order:
        n = nodes[nid]
        shape: Shape | None
        if n.op == "input":
            shape = (ROW, "input")
        elif n.op == "state":
            shape = (ROW, "hidden")
        elif n.op == "weight":
            shape = tuple(n.shape or ())
        elif n.op == "const":
            shape = ()
        elif any(a not in shapes for a in n.args):
            continue  # an arg is already wrong; its node carries the error
        elif n.op == "matmul":
            shape = _matmul_shape(nid, n, nodes, shapes, info)
        elif OPS[n.op].is_reduction:
            shape = _reduction_shape(nid, n, nodes, shapes, info)
        else:
            shape = _elementwise_shape(nid, n, nodes, shapes, info)
        if shape is not None:
            shapes[nid] = shape
    info.shapes = shapes

    hidden_row = (ROW, "hidden")
    for state, target in cell.updates.items():
        if target in shapes and shapes[target] != hidden_row:
            _error(info, f"'{update_title(state)}' gets '{target}' of shape {shape_str(shapes[target])}; "
                         f"a state's update must be {shape_str(hidden_row)}", state)
    if cell.output in shapes and shapes[cell.output] != hidden_row:
        _error(info, f"the '{OUTPUT_TITLE}' node gets '{cell.output}' of shape "
                     f"{shape_str(shapes[cell.output])}; the output must be hidden-sized, "
                     f"{shape_str(hidden_row)}", cell.output)
    return order


def _check_liveness(cell: Cell, info: CellInfo) -> None:
    """What the updates and the output depend on; the rest is unused. Checked on any cell that has an
    output, valid or not: with none, every node would be unused, and the missing output says why."""
    nodes = cell.by_id()
    if cell.output not in nodes:
        return
    live: set[str] = set()
    stack = [t for t in cell.updates.values() if t in nodes] + [cell.output]
    while stack:
        nid = stack.pop()
        if nid in live:
            continue
        live.add(nid)
        stack.extend(a for a in nodes[nid].args if a in nodes)
    for n in cell.nodes:
        if n.id in live or n.op == "state":
            continue
        if n.op == "input":
            _error(info, "the input is not used by any update or the output", n.id)
        else:
            info.problems.append(Problem("warning", "no update or output depends on this node", n.id))
    info.dead = {n.id for n in cell.nodes if n.id not in live and n.op != "state"}


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
