"""Build cells in Python: `f = sigmoid(x @ W_f + h @ U_f + b_f)`.

    b = CellBuilder("Elman")
    x, h = b.input("x"), b.state("h")
    W, U, bias = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight("b", "hidden")
    h_new = tanh(x @ W + h @ U + bias).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
"""

from __future__ import annotations

from typing import Union

from .cell import DEFAULT_SIZES, Cell, Node
from .validate import CellError, require_valid

Operand = Union["Value", float, int]

COLUMN_SPACING = 240.0
ROW_SPACING = 90.0


class Value:
    """A node of the cell being built; Python operators add nodes."""

    def __init__(self, builder: CellBuilder, node_id: str):
        self.builder = builder
        self.id = node_id

    def named(self, node_id: str) -> Value:
        """Gives this node a readable id; raises CellError if another node has it."""
        if node_id != self.id and self.builder.cell.has(node_id):
            raise CellError(f"cannot name node '{self.id}' '{node_id}': that id is taken")
        self.builder.cell.rename(self.id, node_id)
        self.id = node_id
        return self

    def _binary(self, op: str, other: Operand, reverse: bool = False) -> Value:
        o = self.builder._lift(other)
        a, b = (o, self) if reverse else (self, o)
        return self.builder._node(op, a, b)

    def __matmul__(self, w: Value) -> Value:
        return self.builder._node("matmul", self, w)

    def __add__(self, o: Operand) -> Value:
        return self._binary("add", o)

    def __radd__(self, o: Operand) -> Value:
        return self._binary("add", o, reverse=True)

    def __sub__(self, o: Operand) -> Value:
        return self._binary("sub", o)

    def __rsub__(self, o: Operand) -> Value:
        return self._binary("sub", o, reverse=True)

    def __mul__(self, o: Operand) -> Value:
        return self._binary("mul", o)

    def __rmul__(self, o: Operand) -> Value:
        return self._binary("mul", o, reverse=True)

    def __truediv__(self, o: Operand) -> Value:
        return self._binary("div", o)

    def __rtruediv__(self, o: Operand) -> Value:
        return self._binary("div", o, reverse=True)

    def __neg__(self) -> Value:
        return self.builder._node("neg", self)


def _unary(op: str):
    def apply(v: Value) -> Value:
        return v.builder._node(op, v)

    apply.__name__ = op
    apply.__doc__ = f"A '{op}' node of v."
    return apply


sigmoid = _unary("sigmoid")
tanh = _unary("tanh")
relu = _unary("relu")
exp = _unary("exp")


class CellBuilder:
    def __init__(self, name: str, description: str = "", input: int = DEFAULT_SIZES["input"],
                 hidden: int = DEFAULT_SIZES["hidden"]):
        self.cell = Cell(name=name, description=description, sizes={"input": input, "hidden": hidden})

    def _add(self, node: Node) -> Value:
        self.cell.add(node)
        return Value(self, node.id)

    def _node(self, op: str, *args: Value) -> Value:
        return self._add(Node(self.cell.fresh_id(op), op, [a.id for a in args]))

    def _lift(self, v: Operand) -> Value:
        if isinstance(v, Value):
            return v
        return self.const(float(v))

    def input(self, node_id: str = "x") -> Value:
        return self._add(Node(node_id, "input"))

    def state(self, node_id: str) -> Value:
        return self._add(Node(node_id, "state"))

    def weight(self, node_id: str, *shape: str) -> Value:
        return self._add(Node(node_id, "weight", shape=list(shape)))

    def const(self, value: float, node_id: str | None = None) -> Value:
        return self._add(Node(node_id or self.cell.fresh_id("const"), "const", value=float(value)))

    def update(self, state: Value, value: Value) -> None:
        self.cell.updates[state.id] = value.id

    def output(self, value: Value) -> None:
        self.cell.output = value.id

    def build(self) -> Cell:
        """The finished cell, validated and laid out; raises CellError if it is not valid."""
        require_valid(self.cell)
        self.cell.layout = auto_layout(self.cell)
        return self.cell


def auto_layout(cell: Cell) -> dict[str, list[float]]:
    """Columns by depth from the sources; each source sits one column left of its first consumer.

    Works on any cell the editor may hold: args that name no node are ignored, and so is the edge
    that closes a cycle.
    """
    nodes = cell.by_id()
    depth: dict[str, int] = {}
    seen: set[str] = set()
    for root in nodes:
        if root in seen:
            continue
        seen.add(root)
        stack: list[tuple[str, int]] = [(root, 0)]
        while stack:  # depth-first, without recursion: a cell may be a very long chain
            nid, i = stack[-1]
            args = [a for a in nodes[nid].args if a in nodes]
            if i < len(args):
                stack[-1] = (nid, i + 1)
                if args[i] not in seen:
                    seen.add(args[i])
                    stack.append((args[i], 0))
                continue
            stack.pop()
            done = [depth[a] for a in args if a in depth]
            depth[nid] = 1 + max(done, default=-1) if nodes[nid].args else 0
    consumers = cell.consumers()
    for n in cell.nodes:
        if not n.args and consumers[n.id]:
            depth[n.id] = max(0, min(depth[c] for c in consumers[n.id]) - 1)
    rows: dict[int, int] = {}
    layout: dict[str, list[float]] = {}
    for n in cell.nodes:
        if n.id in layout:
            continue  # a duplicate id; the first node of it has the place
        d = depth[n.id]
        layout[n.id] = [d * COLUMN_SPACING, rows.get(d, 0) * ROW_SPACING]
        rows[d] = rows.get(d, 0) + 1
    return layout
