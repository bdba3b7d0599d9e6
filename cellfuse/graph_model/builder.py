"""Build cells in Python: `f = sigmoid(x @ W_f + h @ U_f + b_f)`. The nodes added inside a block
`with b.group("forget gate"):` are one group, which the editor shows as one node.

    b = CellBuilder("Elman")
    x, h = b.input("x"), b.state("h")
    W, U, bias = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden"), b.weight("b", "hidden")
    h_new = tanh(x @ W + h @ U + bias).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    cell = b.build()
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Union

from .cell import DEFAULT_SIZES, Cell, Group, Node
from .cellfile import group_name_problem
from .ops import OPS
from .validate import CellError, require_valid

Operand = Union["Value", float, int]

COLUMN_SPACING = 240.0
ROW_SPACING = 90.0


class Value:
    """A node of the cell being built; Python operators add nodes (see `_operators`)."""

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


_BINARY_DUNDER = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "@": "matmul"}


def _install_operators() -> None:
    """Value's Python operators, one per op of the table that has a symbol: `a + b` adds an `add` node,
    `-a` a `neg` node, `2 * a` a const and a `mul` node."""
    for spec in OPS.values():
        if spec.symbol is None:
            continue
        if spec.arity == 1:
            if spec.symbol != "-":
                raise ValueError(f"op '{spec.name}': no Python operator '{spec.symbol}' of one operand")
            Value.__neg__ = lambda v, name=spec.name: v.builder._node(name, v)  # type: ignore[method-assign]
            continue
        stem = _BINARY_DUNDER[spec.symbol]

        def forward(a: Value, b: Operand, name: str = spec.name) -> Value:
            return a.builder._node(name, a, a.builder._lift(b))

        def reverse(a: Value, b: Operand, name: str = spec.name) -> Value:
            return a.builder._node(name, a.builder._lift(b), a)

        setattr(Value, f"__{stem}__", forward)
        if spec.is_elementwise:
            setattr(Value, f"__r{stem}__", reverse)


_install_operators()


def apply(op: str, *args: Operand) -> Value:
    """A node of op `op` (any op of the table) over the args; at least one arg must be a Value."""
    spec = OPS.get(op)
    if spec is None or spec.is_source:
        known = ", ".join(n for n, s in OPS.items() if not s.is_source)
        raise CellError(f"unknown op '{op}' (known: {known})")
    if len(args) != spec.arity:
        raise CellError(f"'{op}' takes {spec.arity} arg{'s' if spec.arity != 1 else ''}, got {len(args)}")
    builder = next((a.builder for a in args if isinstance(a, Value)), None)
    if builder is None:
        raise CellError(f"'{op}' needs at least one node of the cell being built among its args")
    return builder._node(op, *(builder._lift(a) for a in args))


def function(op: str):
    """The builder function of an op of the table: `function("sigmoid")(v)` is `apply("sigmoid", v)`."""
    def call(*args: Operand) -> Value:
        return apply(op, *args)

    call.__name__ = op
    call.__doc__ = f"A '{op}' node: {OPS[op].doc}."
    return call


def __getattr__(name: str):
    # Every op of the table without an operator is a function of this module: `from
    # cellfuse.graph_model.builder import sigmoid`. Looked up when asked, so an op added to the table
    # has its function too.
    spec = OPS.get(name)
    if spec is not None and spec.symbol is None and not spec.is_source:
        return function(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class CellBuilder:
    def __init__(self, name: str, description: str = "", input: int = DEFAULT_SIZES["input"],
                 hidden: int = DEFAULT_SIZES["hidden"]):
        self.cell = Cell(name=name, description=description, sizes={"input": input, "hidden": hidden})
        self._group: str | None = None  # the name of the group being built

    @contextmanager
    def group(self, name: str) -> Iterator[None]:
        """Every node added inside the block joins the group `name` (presentation only: the editor shows
        the group as one node). Raises CellError for a bad name, a group inside another, or no node."""
        problem = group_name_problem(name)
        if problem is not None:
            raise CellError(problem)
        if self._group is not None:
            raise CellError(f"group {name!r} inside group {self._group!r}: groups do not nest")
        start = len(self.cell.nodes)
        self._group = name
        try:
            yield
        finally:
            self._group = None
        added = self.cell.nodes[start:]
        if not added:
            raise CellError(f"group {name!r} holds no node: add its nodes inside the 'with' block")
        self.cell.groups.append(Group(name, [n.id for n in added]))

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
    Matmuls that share their left operand (what the scheduler makes one GEMM of) stay together in
    their column, and so do the weights they multiply; otherwise a column keeps the cell's order.

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
    gemm_of_weight: dict[str, str] = {}  # a weight -> the left operand of the first matmul it is W of
    for n in cell.nodes:
        if n.op == "matmul" and len(n.args) == 2:
            gemm_of_weight.setdefault(n.args[1], n.args[0])

    def run(n: Node) -> tuple[str, str]:
        """What a node is kept together with in its column, in the order each first appears."""
        if n.op == "matmul" and len(n.args) == 2:
            return "matmuls of", n.args[0]
        if n.op == "weight" and n.id in gemm_of_weight:
            return "weights of", gemm_of_weight[n.id]
        return "node", n.id

    columns: dict[int, dict[tuple[str, str], list[str]]] = {}
    placed: set[str] = set()
    for n in cell.nodes:
        if n.id in placed:
            continue  # a duplicate id; the first node of it has the place
        placed.add(n.id)
        columns.setdefault(depth[n.id], {}).setdefault(run(n), []).append(n.id)
    place: dict[str, list[float]] = {}
    for d, runs in columns.items():
        for row, nid in enumerate(nid for members in runs.values() for nid in members):
            place[nid] = [d * COLUMN_SPACING, row * ROW_SPACING]
    return {nid: place[nid] for nid in cell.by_id()}  # in the cell's order, as a file lists it
