"""The cell as equations, read off its graph: what a paper would print for it.

    i  = sigmoid(x @ W_i + h @ U_i + b_i)
    c' = f * c + i * g
    h' = o * tanh(c')
    y  = h'

One equation for each state's update (`h'`, the value state `h` takes for the next step; `h` alone is
its value from the previous step), one for the output (`y`), and one for each value that has a name of
its own. A value is named, rather than written out where it is used, when it is used more than once
(written out twice it would read as computed twice), when it is a state's update, or when it is a
function of a weighted sum (the gates and candidates of a gated cell: `f = sigmoid(...)`), unless its id
is only its op's name, which the builder gives a node nobody named. A value that no update or output
uses (one just typed, or left over) has an equation too, so that an editor shows it. Everything else is
written out where it is used, with the input, the states, the weights and the constants by their ids.

Operators are the op table's `symbol`s, with Python's precedence; ops without one are function calls
named after the op. So the plain text of an equation is a formula `formula.py` reads back: `@` for the
matrix product and `*` for the elementwise one. In LaTeX (and matplotlib's mathtext, which takes the
same strings), the matrix product is `x W_f`, the elementwise one `f \\odot c`, sigmoid is `\\sigma`,
and an id `W_f` is W with the subscript f.

Each equation is a row of terms: a name, a product such as `x @ W_f`, an operator, a function's
head or closing parenthesis. Each term carries the ids of the nodes it stands for, so that an editor
can select them when the term is clicked.
"""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from .cell import Cell, Node
from .ops import OPS
from .validate import ID_PATTERN

PRIME = "'"  # h' is the value state h takes for the next step
OUTPUT_NAME = "y"  # the output's equation: y = ...
UNKNOWN = "?"  # an argument that is not connected, or names no node

# Beyond this many values written out inside each other, the next one gets an equation of its own: an
# expression nested deeper cannot be read, and a long chain of nodes would exhaust Python's recursion.
MAX_INLINE_DEPTH = 24

# "juxtaposition": an operator LaTeX writes as a space alone (the matrix product)
TermKind = Literal["lhs", "equals", "value", "operator", "juxtaposition", "open", "close", "separator"]

# Binding strength of Python's operators (higher binds tighter), whichever the op table spells its
# ops with; unary operators bind at _UNARY.
_BINARY_PRECEDENCE = {"|": 1, "^": 2, "&": 3, "<<": 4, ">>": 4, "+": 5, "-": 5,
                      "*": 6, "/": 6, "//": 6, "%": 6, "@": 6, "**": 8}
_UNARY = 7
_ATOM = 9
_ADDITIVE = 5
_RIGHT_ASSOCIATIVE = {"**"}

# How LaTeX writes an operator symbol (mathtext has no \bmod nor \&); `@` is the matrix product,
# written as juxtaposition.
_JUXTAPOSED = {"@"}
_TEX_BINARY = {"*": r"\odot", "@": r"\,", "%": r"\mathrm{mod}", "&": r"\wedge", "^": r"\oplus",
               "|": r"\vee", "<<": r"\ll", ">>": r"\gg", "//": r"/\!/", "**": r"\ast\ast"}
_TEX_UNARY = {"~": r"\neg "}
# How LaTeX writes a function of the op table; any other op is \operatorname{op}.
_TEX_FUNCTIONS = {"sigmoid": r"\sigma", "tanh": r"\tanh", "exp": r"\exp", "log": r"\log", "max": r"\max",
                  "min": r"\min"}
_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda",
          "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi", "chi", "psi", "omega",
          "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma", "Upsilon", "Phi", "Psi", "Omega"}
_ACCENTS = {"tilde", "hat", "bar"}


@dataclass(frozen=True)
class Term:
    """One clickable piece of an equation: its plain text (with the spaces around an operator), its
    LaTeX, and the nodes it stands for."""

    text: str
    tex: str
    nodes: tuple[str, ...]
    kind: TermKind = "value"


@dataclass(frozen=True)
class Equation:
    """`lhs = rhs`: a state's update (`h'`), the output (`y`), a named value (its id), or a value that
    no update or output uses (its id)."""

    kind: Literal["update", "output", "value", "unused"]
    lhs: Term
    rhs: tuple[Term, ...]

    @property
    def name(self) -> str:
        return self.lhs.text

    @property
    def terms(self) -> tuple[Term, ...]:
        """The whole equation as terms: the left side, the equals sign, the right side."""
        return (self.lhs, Term(" = ", "=", self.lhs.nodes, "equals"), *self.rhs)

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.terms)

    @property
    def tex(self) -> str:
        return tex_of(self.terms)

    @property
    def mathtext(self) -> str:
        """For matplotlib's mathtext: the LaTeX between dollars."""
        return f"${self.tex}$"

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for t in self.terms for n in t.nodes))


def tex_of(terms: tuple[Term, ...] | list[Term]) -> str:
    """Terms as one LaTeX string: a space between terms, none inside parentheses or before a comma."""
    out = ""
    for i, t in enumerate(terms):
        if i and terms[i - 1].kind != "open" and t.kind not in ("close", "separator"):
            out += " "
        out += t.tex
    return out


def _upright(text: str) -> str:
    """Text as upright LaTeX; a character no id may hold (a broken file's) as `?`, so that the LaTeX
    always parses."""
    return "".join(c if c.isascii() and c.isalnum() else r"\_" if c == "_" else "?" for c in text)


def name_tex(name: str) -> str:
    """An id as a mathematical name: `W_f` is W with the subscript f, `W_ir` W sub ir, `b0` b sub 0,
    `h_tilde` h with a tilde, `alpha` the Greek letter; an id that starts with a longer word is upright
    text. A trailing prime stays a prime."""
    prime = PRIME if name.endswith(PRIME) else ""
    bare = name[:-1] if prime else name
    base, *subs = bare.split("_")
    digits = re.search(r"\d+\Z", base)
    if digits and digits.start() > 0:
        base, subs = base[:digits.start()], [digits.group(), *subs]
    subs = [p for p in subs if p]
    if not ID_PATTERN.match(bare) or not (base in _GREEK or len(base) == 1):
        return r"\mathrm{" + _upright(bare) + "}" + prime
    head = "\\" + base if base in _GREEK else base
    if len(subs) == 1 and subs[0] in _ACCENTS:
        return f"\\{subs[0]}{{{head}}}{prime}"
    if subs:
        shown = ",".join(p if len(p) <= 2 else r"\mathrm{" + p + "}" for p in subs)
        head += f"_{{{shown}}}" if len(shown) > 1 else f"_{shown}"
    return head + prime


def number_text(value: float | None) -> str:
    """A constant as a formula writes it: the shortest text that reads back as the same float."""
    if value is None:
        return UNKNOWN
    if math.isfinite(value) and value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _number_tex(value: float | None) -> str:
    text = number_text(value)
    mantissa, e, exponent = text.partition("e")
    if not e:
        return text if math.isfinite(value or 0.0) else r"\mathrm{" + text + "}"
    power = f"10^{{{int(exponent)}}}"
    return power if mantissa == "1" else rf"{mantissa} \times {power}"


def _function_tex(op: str) -> str:
    return _TEX_FUNCTIONS.get(op, r"\operatorname{" + _upright(op) + "}")


def _auto_named(node: Node) -> bool:
    """The id the builder gives a node nobody named: its op, with a number when that is taken."""
    return re.fullmatch(re.escape(node.op) + r"\d*", node.id) is not None


# -- expressions ------------------------------------------------------------------------------------

@dataclass
class _Expr:
    """A value written out: its terms and how tightly it binds (for parentheses)."""

    terms: list[Term]
    precedence: int
    symbol: str | None = None  # the operator at its top, if any

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for t in self.terms for n in t.nodes))

    @property
    def atomic(self) -> bool:
        return len(self.terms) == 1


def _leaf(text: str, tex: str, nodes: tuple[str, ...], precedence: int = _ATOM) -> _Expr:
    return _Expr([Term(text, tex, nodes)], precedence)


def _parenthesized(e: _Expr) -> _Expr:
    nodes = e.nodes
    return _Expr([Term("(", "(", nodes, "open"), *e.terms, Term(")", ")", nodes, "close")], _ATOM)


def _needs_parentheses(child: _Expr, symbol: str, precedence: int, left: bool) -> bool:
    if child.precedence != precedence:
        return child.precedence < precedence
    if (symbol in _RIGHT_ASSOCIATIVE) == left:
        return True  # a - (b - c), and (a ** b) ** c: the other grouping than Python's
    # (r * h) @ U: Python groups it so without parentheses, but few readers would know
    return precedence != _ADDITIVE and child.symbol != symbol


class _Writer:
    """Writes the cell's values out; names what must be named (see the module's docstring)."""

    def __init__(self, cell: Cell):
        self.nodes = cell.by_id()
        uses: Counter[str] = Counter()
        for n in self.nodes.values():
            uses.update(a for a in n.args if a in self.nodes)
        uses.update(t for t in cell.updates.values() if t in self.nodes)
        if cell.output in self.nodes:
            uses[cell.output] += 1
        self.names: dict[str, str] = {}  # node id -> the name its equation gives it
        for state, target in cell.updates.items():
            if target in self.nodes and not self._is_source(target):
                self.names.setdefault(target, state + PRIME)
        # what nothing uses (a value just typed, or left over) has an equation of its own
        self.unused = [nid for nid in self.nodes if not self._is_source(nid) and uses[nid] == 0]
        for nid in self.unused:
            self.names[nid] = nid
        self._name_values(uses)
        self.written: dict[str, _Expr] = {}  # named node -> its right-hand side
        self.depends: dict[str, list[str]] = {}  # named node -> the named nodes its right-hand side uses

    def _is_source(self, nid: str) -> bool:
        spec = OPS.get(self.nodes[nid].op)
        return spec is not None and spec.is_source

    def _is_matmul(self, nid: str) -> bool:
        spec = OPS.get(self.nodes[nid].op)
        return spec is not None and spec.is_matmul

    def _name_values(self, uses: Counter[str]) -> None:
        """Names each node used more than once, and each function (an op without a symbol) whose
        argument, as written out, holds a matmul: `f = sigmoid(x @ W_f + ...)`, though `tanh(c')` is
        written out where it is used. In the order of the graph, args first, as whether an arg is
        written out depends on whether it is named."""
        inline_matmul: dict[str, bool] = {}  # node -> whether a matmul shows in it written out
        for root in self.nodes:
            stack = [(root, False)]
            while stack:  # depth-first without recursion; an edge that closes a cycle counts as none
                nid, expanded = stack.pop()
                args = [a for a in self.nodes[nid].args if a in self.nodes]
                if not expanded:
                    if nid not in inline_matmul:
                        inline_matmul[nid] = False
                        stack.append((nid, True))
                        stack.extend((a, False) for a in args if a not in inline_matmul)
                    continue
                node = self.nodes[nid]
                shown = any(self._is_matmul(a) or (a not in self.names and inline_matmul[a]) for a in args)
                inline_matmul[nid] = shown
                if self._is_source(nid) or nid in self.names:
                    continue
                spec = OPS.get(node.op)
                gate = spec is not None and spec.symbol is None and shown and not _auto_named(node)
                if uses[nid] > 1 or gate:
                    self.names[nid] = nid

    def name_of(self, nid: str) -> Term:
        name = self.names[nid]
        return Term(name, name_tex(name), (nid,), "lhs")

    def write_all(self, roots: list[str]) -> None:
        """Writes the right-hand side of each root and of every named node they use, once each. A
        worklist rather than recursion: a long chain of named nodes must not exhaust the stack."""
        todo = list(reversed(roots))
        while todo:
            nid = todo.pop()
            if nid in self.written:
                continue
            self.depends[nid] = []
            self.written[nid] = self._body(nid, 0, {nid}, self.depends[nid])
            todo.extend(reversed([d for d in self.depends[nid] if d not in self.written]))

    def _operand(self, nid: str, depth: int, path: set[str], depends: list[str]) -> _Expr:
        """A value where another uses it: by its name, or written out."""
        node = self.nodes.get(nid)
        if node is None:
            return _leaf(UNKNOWN, UNKNOWN, ())
        if node.op == "const":
            text = number_text(node.value)
            negative = node.value is not None and node.value < 0
            return _leaf(text, _number_tex(node.value), (nid,), _UNARY if negative else _ATOM)
        if self._is_source(nid):
            return _leaf(nid, name_tex(nid), (nid,))
        if nid not in self.names and (nid in path or depth >= MAX_INLINE_DEPTH):
            self.names[nid] = nid  # a cycle (the cell is not valid), or too deep to read written out
        if nid in self.names:
            depends.append(nid)
            name = self.names[nid]
            return _leaf(name, name_tex(name), (nid,))
        return self._body(nid, depth + 1, path | {nid}, depends)

    def _body(self, nid: str, depth: int, path: set[str], depends: list[str]) -> _Expr:
        """A computed node written out: operator or function call over its args."""
        node = self.nodes[nid]
        spec = OPS.get(node.op)
        args = [self._operand(a, depth, path, depends) for a in node.args]
        if spec is not None and len(args) < spec.arity:  # ports left unconnected at the end
            args += [_leaf(UNKNOWN, UNKNOWN, ()) for _ in range(spec.arity - len(args))]
        if spec is not None and spec.symbol is not None and len(args) == spec.arity == 2:
            return self._binary(nid, spec.symbol, args[0], args[1])
        if spec is not None and spec.symbol is not None and len(args) == spec.arity == 1:
            return self._unary(nid, spec.symbol, args[0])
        return self._call(nid, node.op, args)

    def _binary(self, nid: str, symbol: str, a: _Expr, b: _Expr) -> _Expr:
        precedence = _BINARY_PRECEDENCE.get(symbol, _ATOM - 1)
        if _needs_parentheses(a, symbol, precedence, left=True):
            a = _parenthesized(a)
        if _needs_parentheses(b, symbol, precedence, left=False):
            b = _parenthesized(b)
        tex = _TEX_BINARY.get(symbol, symbol)
        if precedence > _ADDITIVE and a.atomic and b.atomic:
            # A product of names, `x @ W_f`, is one term: it reads as one thing.
            ta, tb = a.terms[0], b.terms[0]
            nodes = tuple(dict.fromkeys((nid, *ta.nodes, *tb.nodes)))
            term = Term(f"{ta.text} {symbol} {tb.text}", f"{ta.tex} {tex} {tb.tex}", nodes)
            return _Expr([term], precedence, symbol)
        operator = Term(f" {symbol} ", tex, (nid,), "juxtaposition" if symbol in _JUXTAPOSED else "operator")
        return _Expr([*a.terms, operator, *b.terms], precedence, symbol)

    def _unary(self, nid: str, symbol: str, a: _Expr) -> _Expr:
        if a.precedence <= _UNARY:
            a = _parenthesized(a)
        tex = _TEX_UNARY.get(symbol, symbol)
        if a.atomic:
            t = a.terms[0]
            return _Expr([Term(f"{symbol}{t.text}", f"{tex}{t.tex}", (nid, *t.nodes))], _UNARY, symbol)
        return _Expr([Term(symbol, tex, (nid,), "open"), *a.terms], _UNARY, symbol)

    def _call(self, nid: str, op: str, args: list[_Expr]) -> _Expr:
        inner: list[Term] = []
        for i, arg in enumerate(args):
            if i:
                inner.append(Term(", ", ",", (nid,), "separator"))
            inner.extend(arg.terms)
        nodes = tuple(dict.fromkeys((nid, *(n for t in inner for n in t.nodes))))
        if op == "abs" and len(args) == 1:
            return _Expr([Term("abs(", "|", nodes, "open"), *inner, Term(")", "|", nodes, "close")], _ATOM)
        return _Expr([Term(f"{op}(", _function_tex(op) + "(", nodes, "open"), *inner,
                      Term(")", ")", nodes, "close")], _ATOM)


def equations(cell: Cell) -> list[Equation]:
    """The equations of a cell, each named value's before the first that uses it, the output's last.

    Works on any cell the editor may hold: an argument that is missing or names no node is written
    `?`, and a cycle (which only an invalid cell has) is cut by naming a node on it."""
    w = _Writer(cell)
    updates: list[tuple[str, _Expr]] = []  # the updates that are not a named node's own equation
    for state, target in cell.updates.items():
        if w.names.get(target) != state + PRIME:
            depends: list[str] = []
            updates.append((state, w._operand(target, 0, set(), depends)))
            w.write_all(depends)
    output: _Expr | None = None
    if cell.output is not None:
        depends = []
        if cell.output in w.nodes and not w._is_source(cell.output) and cell.output not in w.names:
            output = w._body(cell.output, 0, {cell.output}, depends)
        else:
            output = w._operand(cell.output, 0, set(), depends)
        w.write_all(depends)
    w.write_all([t for t in cell.updates.values() if t in w.names])
    w.write_all(w.unused)

    out: list[Equation] = []
    unused = set(w.unused)
    for nid in _in_order(w):
        kind = "update" if w.names[nid].endswith(PRIME) else "unused" if nid in unused else "value"
        out.append(Equation(kind, w.name_of(nid), tuple(w.written[nid].terms)))
    for state, rhs in updates:
        lhs = Term(state + PRIME, name_tex(state + PRIME), rhs.nodes, "lhs")
        out.append(Equation("update", lhs, tuple(rhs.terms)))
    if output is not None and cell.output is not None:
        out.append(Equation("output", Term(OUTPUT_NAME, OUTPUT_NAME, (cell.output,), "lhs"),
                            tuple(output.terms)))
    return out


def _in_order(w: _Writer) -> list[str]:
    """The named nodes, each after those its equation uses, otherwise in the cell's order (which a
    hand-written cell keeps in the order of its paper)."""
    position = {nid: i for i, nid in enumerate(w.nodes)}
    users: dict[str, list[str]] = {nid: [] for nid in w.written}
    waiting: dict[str, int] = {}
    for nid in w.written:
        uses = set(w.depends[nid]) - {nid}
        waiting[nid] = len(uses)
        for d in uses:
            users[d].append(nid)
    ready = [(position[n], n) for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while len(order) < len(w.written):
        if not ready:  # a cycle through named nodes: go on from its first node in the cell's order
            first = min((n for n in w.written if waiting[n] > 0), key=position.__getitem__)
            waiting[first] = 0
            heapq.heappush(ready, (position[first], first))
        _, nid = heapq.heappop(ready)
        if waiting[nid] < 0:
            continue
        waiting[nid] = -1
        order.append(nid)
        for u in users[nid]:
            if waiting[u] > 0:
                waiting[u] -= 1
                if waiting[u] == 0:
                    heapq.heappush(ready, (position[u], u))
    return order


def equations_text(cell: Cell) -> str:
    """The equations as plain text, one a line, their equals signs aligned."""
    eqs = equations(cell)
    width = max((len(e.name) for e in eqs), default=0)
    return "".join(f"{e.name:<{width}} = {''.join(t.text for t in e.rhs)}\n" for e in eqs)


def equations_latex(cell: Cell) -> str:
    """The equations as a LaTeX `align*` block (amsmath), for a paper."""
    rows = [f"  {e.lhs.tex} &= {tex_of(e.rhs)}" for e in equations(cell)]
    return "\\begin{align*}\n" + " \\\\\n".join(rows) + "\n\\end{align*}\n"
