"""The op table: the single source of truth for every op a cell may use.

Each entry says how many args the op takes, what kind of node it is (a source of values, a matmul,
or an elementwise op), what it means in numpy (the reference), and how it is written in CUDA C.
The scheduler, the reference interpreter, the CUDA emitter and the editor's palette all read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

OpKind = Literal["source", "matmul", "elementwise"]


def _sigmoid(a: np.ndarray) -> np.ndarray:
    # e = e^-|a| never overflows; 1 / (1 + e) for a >= 0 and e / (1 + e) for a < 0 are both the
    # logistic function, each without the cancellation that 1 + tanh(a / 2) suffers for a << 0.
    a = np.asarray(a)
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int
    kind: OpKind
    doc: str
    args: tuple[str, ...] = ()
    numpy: Callable[..., np.ndarray] | None = None
    # A C expression over the argument expressions {0}, {1}; functions named cf_* are defined in
    # codegen's kernel prelude.
    cuda: str | None = None


OPS: dict[str, OpSpec] = {
    spec.name: spec
    for spec in [
        OpSpec("input", 0, "source", "the step's input x_t, [B, input]"),
        OpSpec("state", 0, "source", "a recurrent state's value at t-1, [B, hidden]"),
        OpSpec("weight", 0, "source", "a learned parameter, [K, N] or [N]"),
        OpSpec("const", 0, "source", "a scalar constant"),
        OpSpec("matmul", 2, "matmul", "a @ W, W a 2-D weight", ("a", "W")),
        OpSpec("add", 2, "elementwise", "a + b", ("a", "b"), np.add, "({0} + {1})"),
        OpSpec("sub", 2, "elementwise", "a - b", ("a", "b"), np.subtract, "({0} - {1})"),
        OpSpec("mul", 2, "elementwise", "a * b", ("a", "b"), np.multiply, "({0} * {1})"),
        OpSpec("div", 2, "elementwise", "a / b", ("a", "b"), np.divide, "({0} / {1})"),
        OpSpec("neg", 1, "elementwise", "-a", ("a",), np.negative, "(-{0})"),
        OpSpec("exp", 1, "elementwise", "e^a", ("a",), np.exp, "expf({0})"),
        OpSpec("sigmoid", 1, "elementwise", "1 / (1 + e^-a)", ("a",), _sigmoid, "cf_sigmoid({0})"),
        OpSpec("tanh", 1, "elementwise", "tanh(a)", ("a",), np.tanh, "tanhf({0})"),
        OpSpec("relu", 1, "elementwise", "max(a, 0)", ("a",), lambda a: np.maximum(a, 0.0),
               "fmaxf({0}, 0.0f)"),
    ]
}

SOURCE_OPS = frozenset(n for n, s in OPS.items() if s.kind == "source")
ELEMENTWISE_OPS = frozenset(n for n, s in OPS.items() if s.kind == "elementwise")
