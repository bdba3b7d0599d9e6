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
from .validate import require_valid

Operand = Union["Value", float, int]

COLUMN_SPACING = 240.0
ROW_SPACING = 90.0


class Value:
    """A node of the cell being built; Python operators add nodes."""

    def __init__(self, builder: CellBuilder, node_id: str):
        self.builder = builder
        self.id = node_id

    def named(self, node_id: str) -> Value:
        """Gives this node a readable id."""
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
    """Columns by depth from the sources; each source sits one column left of its first consumer."""
    nodes = cell.by_id()
    depth: dict[str, int] = {}

    def node_depth(nid: str) -> int:
        if nid not in depth:
            args = nodes[nid].args
            depth[nid] = 1 + max((node_depth(a) for a in args), default=-1) if args else 0
        return depth[nid]

    for n in cell.nodes:
        node_depth(n.id)
    consumers = cell.consumers()
    for n in cell.nodes:
        if not n.args and consumers[n.id]:
            depth[n.id] = max(0, min(depth[c] for c in consumers[n.id]) - 1)
    rows: dict[int, int] = {}
    layout: dict[str, list[float]] = {}
    for n in cell.nodes:
        d = depth[n.id]
        layout[n.id] = [d * COLUMN_SPACING, rows.get(d, 0) * ROW_SPACING]
        rows[d] = rows.get(d, 0) + 1
    return layout
