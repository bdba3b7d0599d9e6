"""Random valid cells, for property tests and benchmarks of the scheduler and the backends.

`random_cell(rng)` draws a cell from a numpy Generator; `random_cells()` is a hypothesis strategy.
Both build through CellBuilder, so every cell they return has passed validation. The elementwise ops
come from the op table, each used as its `random` entry allows, so an op added to the table is drawn
here too.

A cell drawn here has one input `x`, one to three states, 2-D weights `W0, W1, ...` and 1-D weights
`b0, b1, ...`, and mixes what the scheduler has to find:

- matmuls whose left operand is x, a state, or an earlier row value, including values computed from
  other matmuls of the same step (dependent GEMM chains, as in Cho's GRU), and several matmuls on one
  left operand (combinable GEMMs);
- elementwise DAGs of every op of the op table, on [batch, hidden] and [batch, input] rows, with
  [N]-shaped weight-only values (`neg(b)`, `exp(tanh(p))`) and scalar const expressions broadcast in;
- elementwise work on x before a matmul (`relu(x) @ W`);
- 1-D weights added directly to matmuls, so that hoisted GEMMs fold their bias;
- state updates of every kind a user may draw: a squashed value, a gated mix of the state, a matmul,
  another state, or a node shared with another state's update;
- with `reductions`, row reductions: [batch, 1] values (a row's mean or squashed sum) spread over rows
  of either width and over [N] values, and layer norms, some of them before a matmul (so hoisted when
  they depend on no state), the [batch, 1] values reused across kernels and steps' stages;
- with `ties`, input-wide and hidden-wide rows meeting in an op of the table (a residual or highway
  term), which ties the two widths: such a cell runs only where the input size equals the hidden size.

Values stay bounded whatever the sequence length: anything that may grow is squashed by tanh or
sigmoid before it feeds a matmul or a state, and every argument of an op meets the domain its table
entry asks for (a divisor is at least 1/e, exp only sees arguments in [-1, 1]).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from cellfuse.graph_model import OPS, Cell, CellBuilder, OpSpec, Value
from cellfuse.graph_model.builder import apply, exp, sigmoid, tanh

T = TypeVar("T")

STATE_NAMES = ("h", "c", "m")
CONST_VALUES = (1.0, 0.5, -1.0, 2.0, 0.25, -0.5)
# Above this rough bound of |value|, a value is squashed before it feeds a matmul, a state or a product.
SQUASH_ABOVE = 3.0


class _Draws:
    """The random choices a cell is made of. Subclasses draw from numpy or from hypothesis; the
    hypothesis one shrinks every choice towards its first option and every chance towards False."""

    def integer(self, lo: int, hi: int) -> int:  # lo..hi inclusive
        raise NotImplementedError

    def chance(self, p: float) -> bool:
        raise NotImplementedError

    def pick(self, options: Sequence[T]) -> T:
        return options[self.integer(0, len(options) - 1)]


class _NumpyDraws(_Draws):
    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)


class _HypothesisDraws(_Draws):
    def __init__(self, draw: Callable[[Any], Any]):
        from hypothesis import strategies as st

        self.draw, self.st = draw, st

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(self.st.integers(lo, hi)) if hi > lo else lo

    def chance(self, p: float) -> bool:
        return self.draw(self.st.integers(0, 99)) >= 100 - round(100 * p)


@dataclass
class _Row:
    """A [batch, width] value of the cell being drawn, with a rough bound of its magnitude."""

    value: Value
    width: str
    bound: float


class _CellDrawer:
    def __init__(self, draws: _Draws, name: str, max_rounds: int, reductions: bool = False,
                 ties: bool = False):
        self.d = draws
        self.reductions, self.ties = reductions, ties
        self.cols: list[tuple[Value, float]] = []  # [batch, 1] values, with a bound of their magnitude
        self.ops = [spec for spec in OPS.values() if spec.is_elementwise]
        self.max_rounds = max_rounds
        self.b = CellBuilder(name, description="a random cell for tests", input=8, hidden=8)
        self.rows: dict[str, list[_Row]] = {"input": [], "hidden": []}
        self.vecs: dict[str, list[Value]] = {"input": [], "hidden": []}
        self.weights2d: dict[tuple[str, str], list[Value]] = {}
        self.lefts: list[_Row] = []  # left operands already used by a matmul
        self.must_use: list[Value] = []  # values the output must depend on
        self.n_weights = 0
        self.n_biases = 0

    # -- leaves ----------------------------------------------------------------------------------
    def weight2d(self, k: str, n: str) -> Value:
        have = self.weights2d.setdefault((k, n), [])
        if have and self.d.chance(0.25):
            return self.d.pick(have)
        w = self.b.weight(f"W{self.n_weights}", k, n)
        self.n_weights += 1
        have.append(w)
        return w

    def bias(self, width: str) -> Value:
        """A 1-D weight node (new or reused)."""
        have = [v for v in self.vecs[width] if self.b.cell.node(v.id).op == "weight"]
        if have and self.d.chance(0.3):
            return self.d.pick(have)
        w = self.b.weight(f"b{self.n_biases}", width)
        self.n_biases += 1
        self.vecs[width].append(w)
        return w

    def const(self) -> Value:
        return self.b.const(self.d.pick(CONST_VALUES))

    def scalar(self) -> tuple[Value, float]:
        """A scalar: a const or an op of the table over consts."""
        c = self.const()
        if self.d.chance(0.4):
            return c, abs(self.b.cell.node(c.id).value or 0.0)
        return self.combine(self.d.pick(self.ops), lambda: (self.const(), 2.0))

    def vec(self, width: str) -> tuple[Value, float]:
        """An [N] value: a 1-D weight, or an op of the table over weights and scalars."""
        if self.vecs[width] and self.d.chance(0.3):
            return self.d.pick(self.vecs[width]), 1.0
        if self.d.chance(0.2):
            return self.bias(width), 1.0
        v, bound = self.combine(self.d.pick(self.ops), lambda: (self.bias(width), 1.0),
                                lambda: self.scalar() if self.d.chance(0.5) else (self.bias(width), 1.0))
        v, bound = tanh(v), 1.0  # weight-only values stay small whatever the op
        self.vecs[width].append(v)
        return v, bound

    # -- ops of the table -------------------------------------------------------------------------
    def meet(self, v: Value, bound: float, domain: str) -> tuple[Value, float]:
        """The value, changed as little as needed to lie in an op's argument domain."""
        if domain == "bounded" and bound > SQUASH_ABOVE or domain == "unit" and bound > 1.0:
            return (tanh(v) if domain == "unit" or self.d.chance(0.5) else sigmoid(v)), 1.0
        if domain == "positive":  # at least 1/e
            if self.d.chance(0.5):
                return self.b.const(self.d.pick((1.0, 0.5))) + sigmoid(v), 2.0
            return exp(tanh(v)), 2.8
        return v, bound

    def combine(self, spec: OpSpec, first: Callable[[], tuple[Value, float]],
                other: Callable[[], tuple[Value, float]] | None = None) -> tuple[Value, float]:
        """`spec` applied to values drawn by `first` (its first arg) and `other` (the rest), each brought
        into the domain the op's table entry asks for; sometimes with the args swapped."""
        use = spec.random
        drawn = [self.meet(*(first() if i == 0 else (other or first)()), domain)
                 for i, domain in enumerate(use.args)]
        if len(drawn) == 2 and use.args[0] == use.args[1] and self.d.chance(0.3):
            drawn.reverse()
        return apply(spec.name, *(v for v, _ in drawn)), use.bound(*(b for _, b in drawn))

    # -- row reductions ----------------------------------------------------------------------------
    def column(self) -> tuple[Value, float]:
        """A [batch, 1] value: a row reduction of a hidden-wide value, or one drawn before."""
        if self.cols and self.d.chance(0.3):
            return self.d.pick(self.cols)
        r = self.operand("hidden")
        if self.d.chance(0.5):
            col = (apply("row_mean", r.value), r.bound)
        else:  # a sum grows with the width, which a drawn cell does not know
            col = (tanh(apply("row_sum", r.value)), 1.0)
        self.cols.append(col)
        return col

    def normalised(self) -> _Row:
        """A layer norm without gain: (r - mean(r)) / sqrt(mean((r - mean(r))^2) + 1/2), of a row of the
        cell or of a new projection of the input (which depends on no state)."""
        if self.d.chance(0.5):
            r = self.operand("hidden")
        else:
            r = _Row(self.rows["input"][0].value @ self.weight2d("input", "hidden"), "hidden", 2.0)
        d = r.value - apply("row_mean", r.value)
        spread = apply("row_mean", apply("square", d)) + self.b.const(0.5)
        self.cols.append((spread, 2.0 * r.bound * r.bound + 0.5))
        return _Row(d * apply("rsqrt", spread), "hidden", 2.0 * r.bound * math.sqrt(2.0))

    # -- rows --------------------------------------------------------------------------------------
    def squash(self, r: _Row, limit: float = SQUASH_ABOVE) -> _Row:
        if r.bound <= limit:
            return r
        if self.d.chance(0.5):
            return _Row(tanh(r.value), r.width, 1.0)
        return _Row(sigmoid(r.value), r.width, 1.0)

    def operand(self, width: str) -> _Row:
        """A bounded row value of this width already in the cell (there is always one of each width)."""
        return self.squash(self.d.pick(self.rows[width]))

    def keep(self, r: _Row) -> _Row:
        self.rows[r.width].append(r)
        return r

    def expr(self, width: str, depth: int) -> _Row:
        """A random elementwise DAG over values of the cell, of shape [batch, width]: ops of the table
        whose first arg is a row and whose other args are rows, [N] values or scalars."""
        if depth == 0 or self.d.chance(0.2):
            return self.operand(width)

        def row() -> tuple[Value, float]:
            r = self.expr(width, depth - 1)
            return r.value, r.bound

        def any_operand() -> tuple[Value, float]:
            which = self.d.integer(0, 3 if self.reductions else 2)
            if which == 3:
                return self.column()
            return row() if which == 0 else self.vec(width) if which == 1 else self.scalar()

        value, bound = self.combine(self.d.pick(self.ops), row, any_operand)
        return _Row(value, width, bound)

    def matmul(self, n: str) -> _Row:
        """left @ W with W of shape [K, n]; the left operand is often one already used, so that
        matmuls share it and combine."""
        if self.lefts and self.d.chance(0.4):
            left = self.d.pick(self.lefts)
        else:
            width = self.d.pick(("hidden", "input"))
            # A small value feeds the matmul as it is (a matmul of a matmul, or of a biased matmul).
            left = self.squash(self.d.pick(self.rows[width]), self.d.pick((1.5, 4.5)))
            self.lefts.append(left)
        w = self.weight2d(left.width, n)
        return _Row(left.value @ w, n, 2.0 * left.bound)

    def with_bias(self, m: _Row) -> _Row:
        b = self.bias(m.width)
        v = b + m.value if self.d.chance(0.3) else m.value + b
        return _Row(v, m.width, m.bound + 1.0)

    def tie(self) -> None:
        """An input-wide row and a hidden-wide one in one op: the result is hidden-wide."""
        x, h = self.operand("input"), self.operand("hidden")
        binary = [op for op in self.ops if op.arity == 2]
        value, bound = self.combine(self.d.pick(binary), lambda: (h.value, h.bound),
                                    lambda: (x.value, x.bound))
        self.keep(_Row(value, "hidden", bound))

    def round(self) -> None:
        if self.ties and self.d.chance(0.3):  # drawn only with ties: other seeds give the cells they gave
            self.tie()
            return
        kind = self.d.integer(0, 8 if self.reductions else 6)
        if kind == 0:  # a matmul, perhaps also kept itself (then its bias cannot fold)
            m = self.matmul(self.d.pick(("hidden", "hidden", "input")))
            self.keep(m)
        elif kind == 1:  # a matmul with its bias added directly
            m = self.matmul(self.d.pick(("hidden", "input")))
            self.keep(self.with_bias(m))
            if self.d.chance(0.2):
                self.keep(m)
        elif kind == 2:  # an elementwise island on hidden rows
            self.keep(self.expr("hidden", self.d.integer(1, 3)))
        elif kind == 3:  # elementwise work on the input's width, then a matmul of it
            e = self.squash(self.expr("input", self.d.integer(1, 2)), 1.5)
            self.keep(e)
            self.lefts.append(e)
            self.keep(self.matmul("hidden"))
        elif kind == 4:  # a sum of matmuls and a bias, like a gate's pre-activation
            total = self.matmul("hidden")
            for _ in range(self.d.integer(0, 2)):
                m = self.matmul("hidden")
                total = _Row(total.value + m.value, "hidden", total.bound + m.bound)
            if self.d.chance(0.6):
                total = self.with_bias(total)
            self.keep(_Row(self.d.pick((sigmoid, tanh))(total.value), "hidden", 1.0))
        elif kind == 5:  # a gate times a row, then a matmul of the product (Cho's U(r * h))
            gate = _Row(sigmoid(self.matmul("hidden").value), "hidden", 1.0)
            prod = _Row(gate.value * self.operand("hidden").value, "hidden", SQUASH_ABOVE)
            self.keep(prod)
            self.lefts.append(self.squash(prod, 1.5))
            self.keep(self.matmul(self.d.pick(("hidden", "input"))))
        elif kind == 7:  # a layer norm, perhaps before a matmul (hoisted where it depends on no state)
            n = self.keep(self.normalised())
            if self.d.chance(0.5):
                left = self.squash(n, 1.5)
                self.lefts.append(left)
                self.keep(_Row(left.value @ self.weight2d("hidden", "hidden"), "hidden", 2.0 * left.bound))
        elif kind == 8:  # a [batch, 1] value spread over a row of either width by an op of the table
            width = self.d.pick(("hidden", "hidden", "input"))
            col = self.column()

            def row() -> tuple[Value, float]:
                r = self.operand(width)
                return r.value, r.bound

            binary = [op for op in self.ops if op.arity == 2]
            value, bound = self.combine(self.d.pick(binary), row, lambda: col)
            first = self.keep(_Row(value, width, bound))
            if self.d.chance(0.7):  # and again after a matmul of that: the column crosses kernels
                left = self.squash(first, 1.5)
                self.lefts.append(left)
                m = left.value @ self.weight2d(width, "hidden")
                value, bound = self.combine(self.d.pick(binary), lambda: (m, 2.0 * left.bound), lambda: col)
                self.keep(_Row(value, "hidden", bound))
        else:  # relu(x) @ W, a classic input transform
            x = self.rows["input"][0]
            r = _Row(apply("relu", x.value), "input", x.bound)
            self.keep(r)
            self.lefts.append(r)
            self.keep(self.with_bias(self.matmul("hidden")) if self.d.chance(0.5) else self.matmul("hidden"))

    # -- updates and output ------------------------------------------------------------------------
    def update_value(self, state: Value, states: list[Value], done: list[Value]) -> Value:
        kind = self.d.integer(0, 5)
        if kind == 0:  # a squashed expression
            e = self.expr("hidden", self.d.integer(1, 3))
            return self.d.pick((tanh, sigmoid))(e.value)
        if kind == 1:  # a gated mix of the state with a candidate: z*s + (1 - z)*n
            z = sigmoid(self.operand("hidden").value)
            n = tanh(self.expr("hidden", self.d.integer(0, 2)).value)
            return z * state + (1.0 - z) * n
        if kind == 2 and done:  # shared with an earlier state's update
            return self.d.pick(done)
        if kind == 3:  # a matmul; sometimes also with a bias added to it, which the output then uses
            # Its left operand is squashed, so that no state is a linear recurrence of itself.
            left = self.squash(self.d.pick(self.rows[self.d.pick(("hidden", "input"))]), 1.0)
            self.lefts.append(left)
            m = _Row(left.value @ self.weight2d(left.width, "hidden"), "hidden", 2.0)
            if self.d.chance(0.5):
                self.must_use.append(tanh(self.with_bias(m).value))
            return m.value
        if kind == 4:  # another state (or itself)
            return self.d.pick(states)
        return self.squash(self.d.pick(self.rows["hidden"]), 1.0).value

    def depends_on(self, root: str, target: str) -> bool:
        nodes = self.b.cell.by_id()
        stack, seen = [root], set()
        while stack:
            nid = stack.pop()
            if nid == target:
                return True
            if nid not in seen:
                seen.add(nid)
                stack.extend(nodes[nid].args)
        return False

    def build(self) -> Cell:
        d, b = self.d, self.b
        x = b.input("x")
        self.rows["input"].append(_Row(x, "input", 1.0))
        states = [b.state(STATE_NAMES[i]) for i in range(d.integer(1, 3))]
        for s in states:
            self.rows["hidden"].append(_Row(s, "hidden", 3.0))
        for _ in range(d.integer(1, self.max_rounds)):
            self.round()
        done: list[Value] = []
        for s in states:
            v = self.update_value(s, states, done)
            b.update(s, v)
            done.append(v)
            if self.b.cell.node(v.id).op != "state":
                self.keep(_Row(v, "hidden", 3.0))
        kind = d.integer(0, 4)
        if kind == 0:
            out = done[0]
        elif kind == 1:
            out = self.squash(d.pick(self.rows["hidden"]), d.pick((1.0, 4.5))).value
        elif kind == 2:
            out = tanh(self.expr("hidden", d.integer(1, 2)).value)
        elif kind == 3:
            out = d.pick(done)
        else:
            out = d.pick(states)
        for v in self.must_use:
            out = tanh(out + v)
        # The input must reach an update or the output.
        if not any(self.depends_on(v, x.id) for v in [*b.cell.updates.values(), out.id]):
            out = tanh(out + x @ self.weight2d("input", "hidden"))
        b.output(out)
        return b.build()


def random_cell(rng: np.random.Generator | int | None = None, name: str = "random",
                max_rounds: int = 6, reductions: bool = False, ties: bool = False) -> Cell:
    """A random valid cell; `rng` is a numpy Generator or a seed. With `reductions` it may reduce rows,
    with `ties` combine input-wide and hidden-wide rows; a seed gives the same cell without them as before."""
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    return _CellDrawer(_NumpyDraws(rng), name, max_rounds, reductions, ties).build()


def draw_cell(draw: Callable[[Any], Any], name: str = "random", max_rounds: int = 6,
              reductions: bool = False, ties: bool = False) -> Cell:
    """A random valid cell from a hypothesis `draw` (inside a composite strategy)."""
    return _CellDrawer(_HypothesisDraws(draw), name, max_rounds, reductions, ties).build()


def random_cells(max_rounds: int = 6, reductions: bool = False, ties: bool = False):
    """A hypothesis strategy of random valid cells."""
    from hypothesis import strategies as st

    @st.composite
    def cells(draw):
        return draw_cell(draw, max_rounds=max_rounds, reductions=reductions, ties=ties)

    return cells()
