"""Cells typed as formulas, one line each: `f = sigmoid(x @ W_f + h @ U_f + b_f)`.

A formula is read with Python's `ast` module and never run. It may hold one assignment, `NAME =
expression`, and in the expression only names, numbers, parentheses, the operators of the op table
(its `symbol`s: `+ - * / @`, and `-` of one operand) and calls of the op table's functions (the ops
without a symbol: `sigmoid(a)`, `max(a, b)`). `s'`, a name and a prime, is the value state `s` takes
for the next step, as the equations (equations.py) write it, so an equation the editor shows can be
typed back.

The left side says what the formula sets:

- `y = ...` sets the cell's output;
- `s' = ...`, or `s = ...` where `s` is a state, sets the update of state `s`; `s' = ...` in a cell
  without a node `s` adds state `s` first;
- `s = state()` adds state `s`;
- any other name the cell does not have yet adds the expression's value under that id. A name the cell
  has is refused: a formula adds nodes, it never changes one.

A name on the right side is the cell's node of that id (a state's: its value from the previous step);
`x` is the input, added when the cell has none. A name the cell does not have is made what its place
asks for: the right operand of `@`, a weight [K, hidden], K the width of the left operand (input or
hidden); the left operand of `@`, a state; an operand of an elementwise op whose other operand is a
[batch, D] value, a weight [D]. Anything else unknown is an error.

Values the formula computes are new nodes with their op's name as id (`add`, `matmul1`), as the builder
names them; the one the whole formula computes takes the left side's name (`s_new` for the update of
`s`, `y` for the output). A formula is planned before anything changes (`plan_formula`): one that
cannot be applied raises a FormulaError naming the column where the problem starts, and changes
nothing.
"""

from __future__ import annotations

import ast
import math
import re
import unicodedata
from dataclasses import dataclass, field

from .builder import CellBuilder
from .cell import Cell, Node
from .equations import OUTPUT_NAME, PRIME
from .limits import MAX_NODES
from .ops import OPS, OpSpec
from .validate import DIMS, ID_PATTERN, ROW, CellError, Shape, analyze, broadcast, reduced, shape_str

MAX_FORMULA_LENGTH = 2000
# Stands for the prime while Python reads the formula: a letter Python allows in a name, one character
# long like the prime, so that every column stays where it was typed.
_PRIME_MARK = "\u02b9"
_STRING_PREFIXES = {"r", "u", "b", "f", "br", "rb", "fr", "rf"}
_DECLARABLE = ("state",)  # source ops a formula may add by a call: `c = state()`

# Python's operators, by the class `ast` parses them to, as the op table's `symbol`s spell them.
_BINARY_SYMBOLS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.MatMult: "@",
                   ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>",
                   ast.BitOr: "|", ast.BitXor: "^", ast.BitAnd: "&"}
_UNARY_SYMBOLS = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~", ast.Not: "not"}

# What a user may have typed that a formula does not take, by the class Python reads it as.
_REFUSED = {
    ast.Attribute: "attribute access (a.b)", ast.Subscript: "subscripts (a[i])", ast.Lambda: "lambda",
    ast.Compare: "comparisons", ast.BoolOp: "'and' and 'or'", ast.IfExp: "'if ... else'",
    ast.NamedExpr: "':='", ast.Starred: "'*' unpacking", ast.List: "lists", ast.Tuple: "tuples",
    ast.Dict: "dicts", ast.Set: "sets", ast.ListComp: "comprehensions", ast.SetComp: "comprehensions",
    ast.DictComp: "comprehensions", ast.GeneratorExp: "generators", ast.Await: "'await'",
    ast.Yield: "'yield'", ast.YieldFrom: "'yield'", ast.JoinedStr: "strings", ast.Slice: "slices",
    ast.Import: "imports", ast.ImportFrom: "imports", ast.AugAssign: "'+=' and its kin",
    ast.AnnAssign: "annotations", ast.Delete: "'del'", ast.FunctionDef: "definitions",
    ast.AsyncFunctionDef: "definitions", ast.ClassDef: "definitions",
}


def _functions() -> list[str]:
    return [name for name, spec in OPS.items() if spec.symbol is None and not spec.is_source]


def allowed() -> str:
    """What a formula may hold, from the op table: said by every error about a formula's form."""
    binary = [s.symbol for s in OPS.values() if s.symbol and s.arity == 2]
    functions = ", ".join(f"{f}()" for f in _functions())
    return (f"a formula is NAME = expression, of names, numbers, ( ), the operators {' '.join(binary)} "
            f"and the functions {functions}")


class FormulaError(CellError):
    """A formula that cannot be read or applied. `column` (from 0) is where the problem starts."""

    def __init__(self, formula: str, column: int, reason: str):
        self.formula = formula
        self.column = max(0, min(column, len(formula)))
        self.reason = reason
        super().__init__(f"column {self.column + 1}: {reason}")

    def pointed(self) -> str:
        """The formula, and under it a caret at the column."""
        return f"{self.formula}\n{' ' * self.column}^"


@dataclass
class FormulaEdit:
    """What a formula adds to a cell: new nodes (args before the nodes that use them), and the state
    updates and the output it sets. `target` is its left side as typed (`f`, `h'`, `y`)."""

    formula: str
    target: str
    nodes: list[Node] = field(default_factory=list)
    updates: dict[str, str] = field(default_factory=dict)
    output: str | None = None

    def describe(self) -> str:
        ids = ", ".join(n.id for n in self.nodes)
        added = f"added {len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''} ({ids})" if ids else ""
        sets = [f"the update of '{s}' is '{t}'" for s, t in self.updates.items()]
        if self.output is not None:
            sets.append(f"the output is '{self.output}'")
        return "; ".join(p for p in [added, *sets] if p) or "nothing to do"


@dataclass
class _Value:
    """An operand as the formula reads it. `id` None: a name the cell does not have, made what its
    place asks for. `shape` None: not known (the node has an error of its own)."""

    id: str | None
    shape: Shape | None
    name: str
    column: int


def _mark_primes(text: str) -> str:
    """The formula with each prime after a name replaced by _PRIME_MARK, strings left as they are (so
    that one is refused as a string, not misread)."""
    out: list[str] = []
    quote = ""
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                out.append(text[i:i + 2])
                i += 2
            elif text.startswith(quote, i):
                out.append(quote)
                i += len(quote)
                quote = ""
            else:
                out.append(c)
                i += 1
            continue
        if c in "'\"":
            word = re.search(r"\w*\Z", text[:i]).group()  # type: ignore[union-attr]
            after_name = bool(word) and not word[0].isdigit() and word.lower() not in _STRING_PREFIXES
            if c == "'" and (after_name or (out and out[-1] == _PRIME_MARK)):
                out.append(_PRIME_MARK)
                i += 1
                continue
            quote = text[i:i + 3] if text[i:i + 3] in ("'''", '"""') else c
            out.append(quote)
            i += len(quote)
            continue
        out.append(c)
        i += 1
    return "".join(out)


class _Planner:
    def __init__(self, cell: Cell, formula: str, marked: str):
        self.cell = cell
        self.formula = formula
        self.marked = marked.encode("utf-8")
        self.nodes = cell.by_id()
        self.shapes = analyze(cell).shapes
        self.taken = set(self.nodes)
        self.edit = FormulaEdit(formula, "")
        self.new: dict[str, Node] = {}
        self.state_names: set[str] = set()  # unknown names the formula reads as states

    # -- errors and columns ---------------------------------------------------------------------------
    def column(self, node: ast.AST) -> int:
        # ast counts columns in UTF-8 bytes; a formula may hold other characters than ASCII
        return len(self.marked[:getattr(node, "col_offset", 0)].decode("utf-8", errors="ignore"))

    def error(self, at: ast.AST | int, reason: str) -> FormulaError:
        return FormulaError(self.formula, at if isinstance(at, int) else self.column(at), reason)

    def refuse(self, node: ast.AST) -> FormulaError:
        what = _REFUSED.get(type(node))
        if isinstance(node, ast.Constant):
            what = "strings" if isinstance(node.value, str | bytes) else f"the constant {node.value!r}"
        if what is None:
            what = f"'{type(node).__name__}'"
        return self.error(node, f"{what} cannot be part of a formula: {allowed()}")

    # -- names ---------------------------------------------------------------------------------------------
    def typed(self, name: str) -> str:
        return name.replace(_PRIME_MARK, PRIME)

    def check_id(self, name: str, at: ast.AST) -> None:
        if not ID_PATTERN.match(name):
            raise self.error(at, f"'{self.typed(name)}' is not a valid id: use letters, digits and _, not "
                                 "starting with a digit")

    def fresh(self, stem: str) -> str:
        nid, i = stem, 0
        while nid in self.taken:
            i += 1
            nid = f"{stem}{i}"
        return nid

    def add(self, op: str, args: list[str], shape: Shape | None, node_id: str | None = None,
            weight_shape: list[str] | None = None, value: float | None = None) -> _Value:
        nid = node_id or self.fresh(op)
        node = Node(nid, op, list(args), shape=weight_shape, value=value)
        self.taken.add(nid)
        self.new[nid] = node
        self.edit.nodes.append(node)
        if len(self.nodes) + len(self.new) > MAX_NODES:
            raise self.error(0, f"the cell would have more than {MAX_NODES} nodes")
        return _Value(nid, shape, nid, 0)

    def node(self, nid: str) -> Node | None:
        return self.new.get(nid) or self.nodes.get(nid)

    def shape(self, nid: str) -> Shape | None:
        node = self.new.get(nid)
        if node is None:
            return self.shapes.get(nid)
        if node.op == "weight":
            return tuple(node.shape or ())
        return {"state": (ROW, "hidden"), "input": (ROW, "input")}.get(node.op)

    def the_input(self) -> str | None:
        inputs = [n.id for n in self.cell.nodes if n.op == "input"] + [n for n, v in self.new.items()
                                                                       if v.op == "input"]
        return inputs[0] if inputs else None

    def state(self, name: str, at: ast.AST) -> str:
        """The state `name`, added when the cell has no node of that id."""
        node = self.node(name)
        if node is None:
            self.check_id(name, at)
            if name == "x":
                raise self.error(at, "'x' is the input; a state needs another name")
            self.add("state", [], None, node_id=name)
            return name
        if node.op != "state":
            raise self.error(at, f"'{name}' is a '{node.op}' node, not a state")
        return name

    def name(self, node: ast.Name) -> _Value:
        at = self.column(node)
        if node.id.endswith(_PRIME_MARK):
            state = node.id[:-1]
            if state not in self.nodes or self.nodes[state].op != "state" or state not in self.cell.updates:
                raise self.error(node, f"{self.typed(node.id)} is the next value of a state '{state}', but "
                                       f"the cell has no state '{state}' whose update is set")
            target = self.cell.updates[state]
            return _Value(target, self.shape(target), self.typed(node.id), at)
        self.check_id(node.id, node)
        if self.node(node.id) is not None:
            return _Value(node.id, self.shape(node.id), node.id, at)
        if node.id == "x":
            nid = self.the_input() or self.add("input", [], None, node_id="x").id
            return _Value(nid, self.shape(nid), "x", at)
        if node.id in self.state_names:
            return _Value(self.state(node.id, node), (ROW, "hidden"), node.id, at)
        if node.id in OPS:
            raise self.error(node, f"'{node.id}' is a function: call it, {node.id}(...)")
        return _Value(None, None, node.id, at)

    def weight(self, v: _Value, shape: list[str]) -> _Value:
        """An unknown name made a weight of `shape`; or the node of that name, where the formula made
        one since the name was read (`b * (h + b)` makes b where it meets h)."""
        if self.node(v.name) is None:
            self.add("weight", [], None, node_id=v.name, weight_shape=shape)
        return _Value(v.name, self.shape(v.name), v.name, v.column)

    def unknown(self, v: _Value, why: str) -> FormulaError:
        return self.error(v.column, f"unknown name '{v.name}': {why}. A new name is a weight as the right "
                                    "operand of @, a state as its left operand, and a weight [D] beside a "
                                    "[batch, D] value; declare a state with NAME = state()")

    # -- expressions ------------------------------------------------------------------------------------
    def value(self, node: ast.expr) -> _Value:
        if isinstance(node, ast.Name):
            return self.name(node)
        if isinstance(node, ast.Constant):
            return self.number(node, node.value)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub | ast.UAdd) and isinstance(node.operand, ast.Constant):
                number = self.number(node.operand, node.operand.value)  # -1 is a constant, not neg(1)
                const = self.new[number.id]  # type: ignore[index]
                if isinstance(node.op, ast.USub):
                    const.value = -(const.value or 0.0)
                return number
            symbol = _UNARY_SYMBOLS[type(node.op)]
            return self.apply(node, self.op_of(node, symbol, 1), [node.operand])
        if isinstance(node, ast.BinOp):
            symbol = _BINARY_SYMBOLS[type(node.op)]
            return self.apply(node, self.op_of(node, symbol, 2), [node.left, node.right])
        if isinstance(node, ast.Call):
            return self.call(node)
        raise self.refuse(node)

    def number(self, node: ast.Constant, value: object) -> _Value:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.refuse(node)
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            typed = ast.get_source_segment(self.marked.decode("utf-8"), node) or repr(value)
            raise self.error(node, f"{typed} is too large: a number must be finite")
        v = self.add("const", [], (), value=number)
        v.column = self.column(node)
        return v

    def op_of(self, node: ast.AST, symbol: str, arity: int) -> OpSpec:
        spec = _op_of_symbol(symbol, arity)
        if spec is not None:
            return spec
        symbols = " ".join(s.symbol for s in OPS.values() if s.symbol and s.arity == arity)
        kind = "binary" if arity == 2 else "unary"
        raise self.error(node, f"'{symbol}' is no {kind} operator of the op table (those are: {symbols})")

    def call(self, node: ast.Call) -> _Value:
        if isinstance(node.func, ast.Attribute):
            raise self.refuse(node.func)
        if not isinstance(node.func, ast.Name):
            raise self.error(node.func, f"only the op table's functions can be called, by name: {allowed()}")
        name = node.func.id
        spec = OPS.get(name)
        if spec is None or spec.symbol is not None or spec.is_source:
            hint = f"use the operator {spec.symbol}" if spec is not None and spec.symbol else allowed()
            if spec is not None and spec.is_source:
                hint = f"'{name}()' can only be the whole right side, as in c = state()"
            raise self.error(node.func, f"'{self.typed(name)}' is not a function of the op table: {hint}")
        if node.keywords:
            raise self.error(node.keywords[0].value, f"'{name}' takes its args by position, without names")
        if len(node.args) != spec.arity:
            raise self.error(node, f"'{name}' takes {spec.arity} arg{'s' if spec.arity != 1 else ''}, "
                                   f"got {len(node.args)}")
        return self.apply(node, spec, node.args)

    def apply(self, node: ast.AST, spec: OpSpec, operands: list[ast.expr]) -> _Value:
        """A new node of `spec` over the operands, after checking that their shapes fit it."""
        values = [self.value(a) for a in operands]
        if spec.is_matmul:
            shape = self.matmul(node, values)
        elif spec.is_reduction:
            shape = self.reduction(node, spec, values[0])
        else:
            shape = self.elementwise(node, spec, values)
        made = self.add(spec.name, [v.id for v in values], shape)  # type: ignore[misc]
        made.column = self.column(node)
        return made

    def matmul(self, node: ast.AST, values: list[_Value]) -> Shape | None:
        a, w = values
        assert a.id is not None, "an unknown left operand of @ is a state (see `plan`)"
        if a.shape is not None and (len(a.shape) != 2 or a.shape[0] != ROW or a.shape[1] not in DIMS):
            raise self.error(a.column, f"the left operand of @ must be a [batch, D] value (the input, a "
                                       f"state or one computed from them); '{a.name}' is "
                                       f"{shape_str(a.shape)}")
        if w.id is None:
            if a.shape is None:
                raise self.unknown(w, f"the width of '{a.name}', which would be its first dim, is not known")
            values[1] = w = self.weight(w, [a.shape[1], "hidden"])
        wnode = self.node(w.id)  # type: ignore[arg-type]
        if wnode is None or wnode.op != "weight" or (w.shape is not None and len(w.shape) != 2):
            raise self.error(w.column, f"the right operand of @ must be a 2-D weight [K, N]; '{w.name}' is "
                                       f"{'a ' + wnode.op if wnode else 'no node'} {shape_str(w.shape)}")
        if a.shape is None or w.shape is None:
            return None
        if a.shape[1] != w.shape[0]:
            raise self.error(node, f"'{a.name}' {shape_str(a.shape)} @ '{w.name}' {shape_str(w.shape)}: the "
                                   f"weight's first dim must be {a.shape[1]}")
        return (ROW, w.shape[1])

    def reduction(self, node: ast.AST, spec: OpSpec, v: _Value) -> Shape | None:
        if v.id is None:
            raise self.unknown(v, f"nothing beside it in '{spec.name}' says what it is")
        if v.shape is None:
            return None
        out = reduced(v.shape)
        if out is None:
            raise self.error(v.column, f"'{spec.name}' reduces a [batch, hidden] value; '{v.name}' is "
                                       f"{shape_str(v.shape)}")
        return out

    def elementwise(self, node: ast.AST, spec: OpSpec, values: list[_Value]) -> Shape | None:
        # the [batch, D] values whose D a new weight [D] beside them takes ([batch, 1] gives none)
        rows = [v.shape for v in values if v.id is not None and v.shape is not None and len(v.shape) == 2
                and v.shape[1] in DIMS]
        for i, v in enumerate(values):
            if v.id is not None:
                continue
            if not rows or rows[0][0] != ROW:
                why = ("no other operand is a [batch, D] value to take D from" if len(values) > 1
                       else f"nothing beside it in '{spec.name}' says what it is")
                raise self.unknown(v, why)
            values[i] = self.weight(v, [rows[0][1]])
        shapes = [v.shape for v in values]
        for v in values:
            if v.shape is not None and len(v.shape) == 2 and v.shape[0] != ROW:
                raise self.error(v.column, f"'{v.name}' is a 2-D weight {shape_str(v.shape)}; it can only be "
                                           "the right operand of @")
        if any(s is None for s in shapes):
            return None
        out: Shape = shapes[0]  # type: ignore[assignment]
        for s in shapes[1:]:
            joined = broadcast(out, s)  # type: ignore[arg-type]
            if joined is None:
                described = " and ".join(f"'{v.name}' {shape_str(v.shape)}" for v in values)
                raise self.error(node, f"'{spec.name}' of {described}: the shapes must be equal, or one a "
                                       "number or a 1-D weight that spreads over the rows")
            out = joined
        return out

    # -- the formula ------------------------------------------------------------------------------------
    def plan(self, statement: ast.stmt) -> FormulaEdit:
        if not isinstance(statement, ast.Assign):
            if isinstance(statement, ast.Expr):
                raise self.error(statement, f"give the value a name: {allowed()}")
            raise self.refuse(statement)
        if len(statement.targets) != 1:
            raise self.error(statement.targets[1], f"one name on the left: {allowed()}")
        target = statement.targets[0]
        if not isinstance(target, ast.Name):
            raise self.refuse(target)
        self.edit.target = self.typed(target.id)
        rhs = statement.value
        if (isinstance(rhs, ast.Call) and isinstance(rhs.func, ast.Name) and rhs.func.id in OPS
                and OPS[rhs.func.id].is_source):
            return self.declare(target, rhs)
        for sub in ast.walk(rhs):  # names that stand left of @ and are no node yet: new states
            if (isinstance(sub, ast.BinOp) and isinstance(sub.left, ast.Name)
                    and (spec := _op_of_symbol(_BINARY_SYMBOLS[type(sub.op)], 2)) is not None
                    and spec.is_matmul
                    and self.node(sub.left.id) is None and sub.left.id != "x"):
                self.state_names.add(sub.left.id)

        name = target.id
        if name == OUTPUT_NAME:
            result = self.result(rhs, "the output", OUTPUT_NAME)
            self.edit.output = result
        elif name.endswith(_PRIME_MARK) or (name in self.nodes and self.nodes[name].op == "state"):
            if name.count(_PRIME_MARK) > 1:
                raise self.error(target, f"{self.typed(name)}: one prime marks the next value, not more")
            state = self.state(name.rstrip(_PRIME_MARK), target)
            self.edit.updates[state] = self.result(rhs, f"the update of '{state}'", f"{state}_new")
        else:
            self.check_id(name, target)
            existing = self.node(name)
            if existing is not None:
                raise self.error(target, f"the cell has a node '{name}' ({existing.op}); a formula adds "
                                         "nodes: choose a new name, or rename or delete that node first")
            if name == "x":
                raise self.error(target, "'x' is the input; give the value another name")
            value = self.value(rhs)
            if value.id is None:
                raise self.unknown(value, "it cannot be told what it is")
            if value.id not in self.new or self.new[value.id].op in ("weight", "state", "input"):
                raise self.error(rhs, f"'{name} = {value.name}' computes nothing: a node has one id (rename "
                                      f"'{value.name}' to call it '{name}')")
            self.rename(value.id, name)
        return self.edit

    def result(self, rhs: ast.expr, what: str, stem: str) -> str:
        """The node the right side computes, for an update or the output; a new one takes the id `stem`."""
        value = self.value(rhs)
        if value.id is None:
            raise self.unknown(value, "it cannot be told what it is")
        hidden_row = (ROW, "hidden")
        if value.shape is not None and value.shape != hidden_row:
            raise self.error(rhs, f"{what} must be {shape_str(hidden_row)}; this is {shape_str(value.shape)}")
        if value.id in self.new and self.new[value.id].op not in ("weight", "state", "input"):
            new_id = self.fresh(stem)
            self.rename(value.id, new_id)
            return new_id
        return value.id

    def rename(self, old: str, new: str) -> None:
        """Gives the node the whole formula computes the id its left side asks for (nothing refers to it
        yet: the formula's other nodes are its args)."""
        node = self.new.pop(old)
        self.taken.discard(old)
        node.id = new
        self.taken.add(new)
        self.new[new] = node

    def declare(self, target: ast.Name, rhs: ast.Call) -> FormulaEdit:
        """`c = state()`: a new source node."""
        op = rhs.func.id  # type: ignore[attr-defined]
        if op not in _DECLARABLE:
            how = "the input is x" if op == "input" else f"a {op} is made where its name stands"
            raise self.error(rhs, f"'{op}()' cannot be typed: {how}")
        if rhs.args or rhs.keywords:
            raise self.error(rhs, f"'{op}()' takes no args")
        name = target.id
        self.check_id(name, target)
        existing = self.node(name)
        if existing is not None:
            raise self.error(target, f"the cell has a node '{name}' ({existing.op})")
        self.state(name, target)
        return self.edit


def _op_of_symbol(symbol: str, arity: int) -> OpSpec | None:
    return next((s for s in OPS.values() if s.symbol == symbol and s.arity == arity), None)


def plan_formula(cell: Cell, formula: str) -> FormulaEdit:
    """What `formula` would add to `cell`, which is left as it is; raises FormulaError (a CellError)
    pointing at the column of the first problem."""
    text = formula.rstrip()
    if not text.strip():
        raise FormulaError(formula, 0, f"the formula is empty: {allowed()}")
    if len(text) > MAX_FORMULA_LENGTH:
        raise FormulaError(formula, MAX_FORMULA_LENGTH,
                           f"a formula is at most {MAX_FORMULA_LENGTH} characters long")
    for i, c in enumerate(text):
        if c in "\r\n":
            raise FormulaError(formula, i, "one formula at a time, on one line")
        if c != "\t" and unicodedata.category(c) == "Cc":
            raise FormulaError(formula, i, f"a control character (U+{ord(c):04X}) cannot be part of a "
                                           "formula")
    lead = len(text) - len(text.lstrip())
    marked = _mark_primes(text.lstrip())
    try:
        module = ast.parse(marked, mode="exec")
    except SyntaxError as e:
        reason = (e.msg or "invalid syntax").replace(_PRIME_MARK, PRIME)
        raise FormulaError(formula, lead + max(0, (e.offset or 1) - 1), f"{reason}: {allowed()}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # a NUL character; nesting beyond Python's limit
        raise FormulaError(formula, lead, f"cannot read the formula: {e}") from None
    if not module.body:
        raise FormulaError(formula, lead, f"the formula is empty: {allowed()}")
    planner = _Planner(cell, text.lstrip(), marked)
    try:
        if len(module.body) > 1:
            raise planner.error(module.body[1], "one formula at a time")
        edit = planner.plan(module.body[0])
    except FormulaError as e:
        raise FormulaError(formula, lead + e.column, e.reason) from None
    except RecursionError:
        raise FormulaError(formula, lead, "the formula nests too deeply") from None
    edit.formula = formula
    return edit


def apply_formula(target: Cell | CellBuilder, formula: str) -> FormulaEdit:
    """Adds what `formula` computes to a cell (or to the cell a builder is building), and sets the update
    or output it names; returns what changed. A formula that cannot be applied raises FormulaError and
    changes nothing."""
    cell = target.cell if isinstance(target, CellBuilder) else target
    edit = plan_formula(cell, formula)
    cell.nodes.extend(edit.nodes)
    cell.updates.update(edit.updates)
    if edit.output is not None:
        cell.output = edit.output
    return edit

