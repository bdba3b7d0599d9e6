"""Where an access points at step t, and how many rows a buffer or a launch has: small expressions of the
run's sizes and the step, evaluated to ints by the executors and written as C by the emitters, so that
each rule is written once.

An expression is made of ints, symbols (`t`, `batch`, `seq`, `layers`), sums, products, quotients and
remainders of non-negative values (C's integer division is Python's floor division there).
`evaluate` gives its value for given symbols; `c` writes it as C, where a count of rows or elements
may pass INT_MAX and is therefore computed in size_t (`wide`, as element offsets are) or stays an int
(a launch's rows, which the plan checks against INT_MAX).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Protocol

# How an access's first row moves with the step t (B is the batch):
#   fixed: row 0;  all: row 0 and every T*B rows;  all+1: from row B (a [T+1, B, .] buffer's steps 1..T)
#   t: row t*B;  t+1: row (t+1)*B;  t%2 and (t+1)%2: one of two alternating [B, .] slots
Slot = Literal["fixed", "all", "all+1", "t", "t+1", "t%2", "(t+1)%2"]
# How many rows of its width a buffer (or a launch) has: T*B, (T+1)*B, 2*B, B, L*B, or 1.
Rows = Literal["seq", "seq+1", "pair", "batch", "layers", "one"]


@dataclass(frozen=True)
class Expr:
    """An integer expression: `op` is "int" (args: the value), "sym" (args: the name), "+", "*", "/" (an
    integer quotient) or "%"."""

    op: str
    args: tuple

    def __add__(self, other: Expr | int) -> Expr:
        return _add(self, as_expr(other))

    def __radd__(self, other: int) -> Expr:
        return _add(as_expr(other), self)

    def __mul__(self, other: Expr | int) -> Expr:
        return _mul(self, as_expr(other))

    def __rmul__(self, other: int) -> Expr:
        return _mul(as_expr(other), self)

    def __mod__(self, other: int) -> Expr:
        if self.op == "int":
            return Int(self.args[0] % other)
        return Expr("%", (self, Int(other)))

    def __floordiv__(self, other: int) -> Expr:
        if self.op == "int":
            return Int(self.args[0] // other)
        return self if other == 1 else Expr("/", (self, Int(other)))

    @property
    def constant(self) -> int | None:
        return self.args[0] if self.op == "int" else None

    def __int__(self) -> int:
        if self.constant is None:
            raise ValueError(f"{self.c()} is not a constant")
        return self.constant

    def substitute(self, values: Mapping[str, Expr | int]) -> Expr:
        """The expression with symbols replaced (by ints or other expressions), folded again."""
        match self.op:
            case "int":
                return self
            case "sym":
                return as_expr(values[self.args[0]]) if self.args[0] in values else self
            case "+":
                return self.args[0].substitute(values) + self.args[1].substitute(values)
            case "*":
                return self.args[0].substitute(values) * self.args[1].substitute(values)
            case "%":
                return self.args[0].substitute(values) % self.args[1].args[0]
            case "/":
                return self.args[0].substitute(values) // self.args[1].args[0]
        raise ValueError(f"unknown expression {self.op!r}")

    def evaluate(self, **values: int) -> int:
        """The value for these values of its symbols (each of them given)."""
        return _function(self, tuple(sorted(values)))(**values)

    def c(self, wide: bool = True) -> str:
        """As C. `wide`: products computed in size_t (the first factor of each cast), as element counts and
        offsets must be; otherwise in int."""
        return _c(self, wide)[0]


def Int(value: int) -> Expr:  # noqa: N802  (a constructor, named as one)
    return Expr("int", (value,))


def Sym(name: str) -> Expr:  # noqa: N802
    return Expr("sym", (name,))


def as_expr(value: Expr | int) -> Expr:
    return value if isinstance(value, Expr) else Int(value)


def _add(a: Expr, b: Expr) -> Expr:
    """A sum, its terms in order and its constants added up, last."""
    terms = [*_terms(a), *_terms(b)]
    constant = sum(term.constant for term in terms if term.constant is not None)
    others = [term for term in terms if term.constant is None]
    out = others[0] if others else Int(constant)
    for term in [*others[1:], *([Int(constant)] if others and constant else [])]:
        out = Expr("+", (out, term))
    return out


def _terms(e: Expr) -> list[Expr]:
    return [*_terms(e.args[0]), *_terms(e.args[1])] if e.op == "+" else [e]


def _mul(a: Expr, b: Expr) -> Expr:
    if a.constant is not None and b.constant is not None:
        return Int(a.constant * b.constant)
    if 0 in (a.constant, b.constant):
        return Int(0)
    if a.constant == 1:
        return b
    if b.constant == 1:
        return a
    return Expr("*", (a, b))


def _c(e: Expr, wide: bool) -> tuple[str, bool]:
    """The C text of an expression, and whether it is computed in size_t."""
    match e.op:
        case "int":  # (from 2^63 a byte count's, in size_t: modulo 2^64, as C would have wrapped it)
            v = e.args[0]
            return (f"{v % 2**64}ULL" if v >= 2**63 else str(v)), False
        case "sym":
            return e.args[0], False
        case "+":
            (a, wa), (b, wb) = _c(e.args[0], wide), _c(e.args[1], wide)
            return f"{a} + {b}", wa or wb
        case "%":  # (of a step: small)
            a, _ = _c(e.args[0], False)
            return f"{_factor(e.args[0], a)} % {e.args[1].args[0]}", False
        case "/":  # (of a count, which may pass INT_MAX before it is divided)
            a, wa = _c(e.args[0], wide)
            return f"{_factor(e.args[0], a)} / {e.args[1].args[0]}", wa
        case "*":
            (a, wa), (b, wb) = _c(e.args[0], wide), _c(e.args[1], wide)
            if wide and not (wa or wb):  # the product of ints that may pass INT_MAX: in size_t
                return f"(size_t){_factor(e.args[0], a)} * {_factor(e.args[1], b)}", True
            left = f"({a})" if e.args[0].op in ("+", "%", "/") else a  # (a product runs left to right)
            return f"{left} * {_factor(e.args[1], b)}", wa or wb
    raise ValueError(f"unknown expression {e.op!r}")


@lru_cache(maxsize=4096)
def _function(e: Expr, names: tuple[str, ...]):
    """The expression as a Python function of the named symbols, made once: executors evaluate addresses
    for every step of every launch."""
    def py(e: Expr) -> str:
        match e.op:
            case "int" | "sym":
                return str(e.args[0])
            case "+" | "*" | "%":
                return f"({py(e.args[0])} {e.op} {py(e.args[1])})"
            case "/":
                return f"({py(e.args[0])} // {py(e.args[1])})"
        raise ValueError(f"unknown expression {e.op!r}")

    missing = _symbols(e) - set(names)
    if missing:
        raise ValueError(f"{e.c()} needs a value for {', '.join(sorted(missing))}")
    return eval(f"lambda {', '.join(names)}: {py(e)}")  # noqa: S307  (text made above from ints and names)


def _symbols(e: Expr) -> set[str]:
    if e.op == "sym":
        return {e.args[0]}
    return set().union(*(_symbols(a) for a in e.args if isinstance(a, Expr)))


def _factor(e: Expr, text: str) -> str:
    """The right factor of a product as C: a sum, a product or a remainder in parentheses."""
    return f"({text})" if e.op in ("+", "*", "%", "/") else text


T, BATCH, SEQ, LAYERS = Sym("t"), Sym("batch"), Sym("seq"), Sym("layers")

# Of each slot, the first row at step t, in rows of B
_SLOT_STEPS: dict[str, Expr] = {"fixed": Int(0), "all": Int(0), "all+1": Int(1), "t": T, "t+1": T + 1,
                                "t%2": T % 2, "(t+1)%2": (T + 1) % 2}
_ROWS: dict[str, Expr] = {"seq": SEQ * BATCH, "seq+1": (SEQ + 1) * BATCH, "pair": 2 * BATCH,
                          "batch": BATCH, "layers": LAYERS * BATCH, "one": Int(1)}


def slot_rows(slot: Slot) -> Expr:
    """The first row a slot's access touches at step t."""
    return _SLOT_STEPS[slot] * BATCH


def rows_of(kind: Rows) -> Expr:
    """The rows of a buffer, or of a launch, of this kind."""
    return _ROWS[kind]


class _Accessing(Protocol):  # plan.Access, which imports this module
    kind: str
    ld: int
    col: int
    slot: Slot
    block: int


@lru_cache(maxsize=4096)
def access_offset(acc: _Accessing) -> Expr:
    """The element offset of an access's first element at step t, in its buffer: its block of B rows (a
    layer's part of a [layers, B, .] buffer), its slot's rows at step t (of values with rows), its column."""
    blocks = acc.block + (_SLOT_STEPS[acc.slot] if acc.kind in ("row", "col") else Int(0))
    return blocks * BATCH * acc.ld + acc.col


def c_address(base: str, acc: _Accessing, t: Expr | int = T) -> str:
    """The address of an access's first element at step `t` (the symbol t by default), from the pointer
    `base` to its buffer's first element, in C with `batch` a variable."""
    offset = access_offset(acc).substitute({"t": t})
    return base if offset.constant == 0 else f"{base} + {offset.c()}"
