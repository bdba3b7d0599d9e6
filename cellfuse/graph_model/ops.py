"""The op table: the single source of truth for every op a cell may use.

Each entry says how many args the op takes, what kind of node it is (a source of values, a matmul, an
elementwise op, or a row reduction), what it means in numpy (the reference) and in PyTorch (the
baselines), how it is written in CUDA C, its derivative (in numpy for the reference's backward pass, in
CUDA C for generated backward kernels), how the Python builder spells it, and how random test cells may
use it without values growing. The validator, the scheduler, the reference interpreter, the CUDA
emitter, the builder, the editor's palette and the random cells of the tests all read it: an op added
here works everywhere, or a test that walks the table names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np


class OpKind(StrEnum):
    SOURCE = "source"  # a value the step starts from: the input, a state, a weight, a constant
    MATMUL = "matmul"  # a row value times a 2-D weight: a GEMM
    ELEMENTWISE = "elementwise"  # one output element from the same element of each arg (broadcasting)
    REDUCTION = "reduction"  # one number per row of a [B, hidden] arg: a [B, 1] value


# What a random test cell must guarantee of an argument before it feeds an op, so that values stay
# bounded over any number of steps:
#   any: nothing;  bounded: |a| <= 3 (squashed by tanh or sigmoid when it may be larger);
#   unit: |a| <= 1 (passed through tanh);  positive: a >= 1/e (a divisor)
ArgDomain = Literal["any", "bounded", "unit", "positive"]


@dataclass(frozen=True)
class RandomUse:
    """How random cells may use an elementwise op: what each argument must satisfy, and a bound of the
    result's magnitude from the arguments' bounds."""

    args: tuple[ArgDomain, ...]
    bound: Callable[..., float]


@dataclass(frozen=True)
class OpSpec:
    name: str
    arity: int
    kind: OpKind
    doc: str
    args: tuple[str, ...] = ()
    numpy: Callable[..., np.ndarray] | None = None
    # A C expression over the argument expressions {0}, {1}; functions named cf_* are defined in
    # codegen's kernel prelude. For a row reduction, over {0}, the sum of its arg over the row, and
    # {width}, the row's width as a float.
    cuda: str | None = None
    # The function of the `torch` module with the same meaning (torch.<name>(*args)); a dotted name
    # reaches into its submodules ("nn.functional.softplus"). A row reduction's function is called with
    # dim=-1, keepdim=True.
    torch: str | None = None
    # The builder's spelling: a Python operator ("+", "-", ... ; "-" of arity 1 is negation), or None
    # for a function of the same name as the op (`sigmoid(v)`).
    symbol: str | None = None
    random: RandomUse | None = None
    # a + b: a 1-D weight added to a GEMM's output can be added by the GEMM itself (C = bias; C += A @ W)
    folds_into_gemm: bool = False
    # The derivative, one function per arg: grad[i](dy, *args, y) is the gradient of sum(dy * y) with
    # respect to arg i, for y the op's output and dy of y's shape. The result has y's shape: where an
    # arg was broadcast (a [N] row or a scalar), the caller sums the result over the broadcast axes.
    grad: tuple[Callable[..., np.ndarray], ...] | None = None
    # The same for generated backward kernels: for each arg, a C expression over {dy}, {y} and the
    # argument expressions {0}, {1}, in float (and {width}, a row reduction's width as a float). A row
    # reduction's rule gives each element of the row its part of the row's gradient: it broadcasts.
    cuda_grad: tuple[str, ...] | None = None
    # Where the derivative jumps (relu's and abs's at 0, max's and min's where the args are equal): the
    # signed distance of the args from there, kink(*args), of y's shape. Moving the first arg by twice
    # minus that distance takes it to the kink's other side (see `kinks`).
    kink: Callable[..., np.ndarray] | None = None

    @property
    def is_source(self) -> bool:
        return self.kind is OpKind.SOURCE

    @property
    def is_matmul(self) -> bool:
        return self.kind is OpKind.MATMUL

    @property
    def is_elementwise(self) -> bool:
        return self.kind is OpKind.ELEMENTWISE

    @property
    def is_reduction(self) -> bool:
        return self.kind is OpKind.REDUCTION

    @property
    def in_kernel(self) -> bool:
        """Computed by a generated kernel from the values of a row: an elementwise op or a row reduction."""
        return self.kind in (OpKind.ELEMENTWISE, OpKind.REDUCTION)


def _sigmoid(a: np.ndarray) -> np.ndarray:
    # e = e^-|a| never overflows; 1 / (1 + e) for a >= 0 and e / (1 + e) for a < 0 are both the
    # logistic function, each without the cancellation that 1 + tanh(a / 2) suffers for a << 0.
    a = np.asarray(a)
    e = np.exp(-np.abs(a))
    return np.where(a >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _relu(a: np.ndarray) -> np.ndarray:
    return np.maximum(a, 0.0)


def _softplus(a: np.ndarray) -> np.ndarray:
    # ln(1 + e^a) = max(a, 0) + ln(1 + e^-|a|): e^-|a| never overflows, and log1p keeps the digits of a
    # tiny e^-|a| (for a << 0 the result is about e^a, where ln(1 + e^a) would round to 0).
    return np.maximum(a, 0.0) + np.log1p(np.exp(-np.abs(a)))


def _rsqrt(a: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(a)


def _tie_split(dy: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The gradient of max(a, b) with respect to a: dy where a wins, none where b does. Where they tie,
    max has no derivative: each arg gets half of dy, as PyTorch gives it; the halves still sum to dy, so
    max(a, a) has the derivative 1 of a, and a central difference across the tie gives the same."""
    return np.where(a > b, dy, np.where(a == b, 0.5 * dy, 0.0))


def _sigmoid_grad(dy: np.ndarray, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    # sigmoid'(a) = sigmoid(a) sigmoid(-a) = e / (1 + e)^2 with e = e^-|a|: exact for every a, where
    # y (1 - y) is 0 once y rounds to 1 (a > 37), though the derivative is not.
    e = np.exp(-np.abs(a))
    return dy * (e / ((1.0 + e) * (1.0 + e)))


def _tanh_grad(dy: np.ndarray, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    # 1 - tanh(a)^2 = 4e / (1 + e)^2 with e = e^-2|a|: exact for every a, where 1 - y^2 loses digits as
    # |y| nears 1 and is 0 once y rounds to +-1 (|a| > 19).
    e = np.exp(-2.0 * np.abs(a))
    return dy * (4.0 * e / ((1.0 + e) * (1.0 + e)))


def _relu_grad(dy: np.ndarray, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    # At a = 0, where relu has no derivative, 0, as PyTorch takes it.
    return np.where(a > 0.0, dy, 0.0)


def _abs_grad(dy: np.ndarray, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    # sign(0) = 0: at a = 0, where |a| has no derivative, 0, as PyTorch takes it.
    return dy * np.sign(a)


def _rsqrt_grad(dy: np.ndarray, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    # d(a^-1/2)/da = -a^-3/2 / 2 = -y / (2a): from the forward's y, without another square root.
    return -0.5 * dy * y / a


def _row_sum(a: np.ndarray) -> np.ndarray:
    return np.sum(a, axis=-1, keepdims=True)


def _row_mean(a: np.ndarray) -> np.ndarray:
    return np.mean(a, axis=-1, keepdims=True)


def _row_sum_grad(dy: np.ndarray, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    # Every element of the row adds to the sum once: the row's gradient goes to each of them.
    return dy * np.ones_like(a)


def _row_mean_grad(dy: np.ndarray, a: np.ndarray, y: np.ndarray) -> np.ndarray:
    return dy * np.ones_like(a) / np.shape(a)[-1]


_E = float(np.e)  # e^1: the largest exp of a unit argument

# Node.op names an entry; the order is the palette's.
OPS: dict[str, OpSpec] = {spec.name: spec for spec in [
    OpSpec("input", 0, OpKind.SOURCE, "the step's input x_t, [B, input]"),
    OpSpec("state", 0, OpKind.SOURCE, "a recurrent state's value at t-1, [B, hidden]"),
    OpSpec("weight", 0, OpKind.SOURCE, "a learned parameter, [K, N] or [N]"),
    OpSpec("const", 0, OpKind.SOURCE, "a scalar constant"),
    OpSpec("matmul", 2, OpKind.MATMUL, "a @ W, W a 2-D weight", ("a", "W"), symbol="@",
           grad=(lambda dy, a, w, y: dy @ w.T, lambda dy, a, w, y: a.T @ dy)),
    OpSpec("add", 2, OpKind.ELEMENTWISE, "a + b", ("a", "b"), np.add, "({0} + {1})", "add", "+",
           RandomUse(("any", "any"), lambda a, b: a + b), folds_into_gemm=True,
           grad=(lambda dy, a, b, y: dy, lambda dy, a, b, y: dy), cuda_grad=("{dy}", "{dy}")),
    OpSpec("sub", 2, OpKind.ELEMENTWISE, "a - b", ("a", "b"), np.subtract, "({0} - {1})", "sub", "-",
           RandomUse(("any", "any"), lambda a, b: a + b),
           grad=(lambda dy, a, b, y: dy, lambda dy, a, b, y: -dy), cuda_grad=("{dy}", "(-{dy})")),
    OpSpec("mul", 2, OpKind.ELEMENTWISE, "a * b", ("a", "b"), np.multiply, "({0} * {1})", "mul", "*",
           RandomUse(("bounded", "bounded"), lambda a, b: a * b),
           grad=(lambda dy, a, b, y: dy * b, lambda dy, a, b, y: dy * a),
           cuda_grad=("({dy} * {1})", "({dy} * {0})")),
    OpSpec("div", 2, OpKind.ELEMENTWISE, "a / b", ("a", "b"), np.divide, "({0} / {1})", "div", "/",
           RandomUse(("any", "positive"), lambda a, b: 2.8 * a),
           # d(a/b)/db = -a / b^2, written -(a/b) / b: b^2 would overflow for |b| > 1e154
           grad=(lambda dy, a, b, y: dy / b, lambda dy, a, b, y: -dy * y / b),
           cuda_grad=("({dy} / {1})", "(-{dy} * {y} / {1})")),
    OpSpec("max", 2, OpKind.ELEMENTWISE, "max(a, b)", ("a", "b"), np.maximum, "fmaxf({0}, {1})", "maximum",
           None, RandomUse(("any", "any"), lambda a, b: max(a, b)),
           grad=(lambda dy, a, b, y: _tie_split(dy, a, b), lambda dy, a, b, y: _tie_split(dy, b, a)),
           cuda_grad=("({0} > {1} ? {dy} : ({0} == {1} ? 0.5f * {dy} : 0.0f))",
                      "({1} > {0} ? {dy} : ({0} == {1} ? 0.5f * {dy} : 0.0f))"), kink=np.subtract),
    # |min(a, b)| is bounded by the larger of the bounds of |a| and |b|, as |max(a, b)| is.
    OpSpec("min", 2, OpKind.ELEMENTWISE, "min(a, b)", ("a", "b"), np.minimum, "fminf({0}, {1})", "minimum",
           None, RandomUse(("any", "any"), lambda a, b: max(a, b)),
           grad=(lambda dy, a, b, y: _tie_split(dy, b, a), lambda dy, a, b, y: _tie_split(dy, a, b)),
           cuda_grad=("({0} < {1} ? {dy} : ({0} == {1} ? 0.5f * {dy} : 0.0f))",
                      "({1} < {0} ? {dy} : ({0} == {1} ? 0.5f * {dy} : 0.0f))"), kink=np.subtract),
    OpSpec("neg", 1, OpKind.ELEMENTWISE, "-a", ("a",), np.negative, "(-{0})", "neg", "-",
           RandomUse(("any",), lambda a: a),
           grad=(lambda dy, a, y: -dy,), cuda_grad=("(-{dy})",)),
    OpSpec("abs", 1, OpKind.ELEMENTWISE, "|a|", ("a",), np.abs, "fabsf({0})", "abs", None,
           RandomUse(("any",), lambda a: a), grad=(_abs_grad,),
           cuda_grad=("({0} > 0.0f ? {dy} : ({0} < 0.0f ? (-{dy}) : 0.0f))",), kink=np.positive),
    OpSpec("square", 1, OpKind.ELEMENTWISE, "a * a", ("a",), np.square, "({0} * {0})", "square", None,
           RandomUse(("bounded",), lambda a: a * a),
           grad=(lambda dy, a, y: 2.0 * dy * a,), cuda_grad=("(2.0f * {dy} * {0})",)),
    OpSpec("exp", 1, OpKind.ELEMENTWISE, "e^a", ("a",), np.exp, "expf({0})", "exp", None,
           RandomUse(("unit",), lambda a: _E),
           grad=(lambda dy, a, y: dy * y,), cuda_grad=("({dy} * {y})",)),
    # A positive arg lies in [1/e, bound]: its log in [-1, ln bound].
    OpSpec("log", 1, OpKind.ELEMENTWISE, "ln(a), -inf at a = 0", ("a",), np.log, "logf({0})", "log", None,
           RandomUse(("positive",), lambda a: max(1.0, math.log(a))),
           grad=(lambda dy, a, y: dy / a,), cuda_grad=("({dy} / {0})",)),
    # At a = 0 the derivative is infinite, as PyTorch has it: random cells give sqrt positive args.
    OpSpec("sqrt", 1, OpKind.ELEMENTWISE, "sqrt(a), a >= 0", ("a",), np.sqrt, "sqrtf({0})", "sqrt", None,
           RandomUse(("positive",), lambda a: math.sqrt(a)),
           grad=(lambda dy, a, y: 0.5 * dy / y,), cuda_grad=("(0.5f * {dy} / {y})",)),
    OpSpec("rsqrt", 1, OpKind.ELEMENTWISE, "1 / sqrt(a), a > 0", ("a",), _rsqrt, "rsqrtf({0})", "rsqrt",
           None, RandomUse(("positive",), lambda a: math.sqrt(_E)), grad=(_rsqrt_grad,),
           cuda_grad=("(-0.5f * {dy} * {y} / {0})",)),
    OpSpec("sigmoid", 1, OpKind.ELEMENTWISE, "1 / (1 + e^-a)", ("a",), _sigmoid, "cf_sigmoid({0})",
           "sigmoid", None, RandomUse(("any",), lambda a: 1.0), grad=(_sigmoid_grad,),
           # In float, y (1 - y) is off by the rounding of y at most (1e-7 where y nears 1), as the
           # forward is: not worth computing e^-|a| again.
           cuda_grad=("({dy} * {y} * (1.0f - {y}))",)),
    OpSpec("tanh", 1, OpKind.ELEMENTWISE, "tanh(a)", ("a",), np.tanh, "tanhf({0})", "tanh", None,
           RandomUse(("any",), lambda a: 1.0), grad=(_tanh_grad,),
           # In float, 1 - y^2 is off by the rounding of y at most, as for sigmoid.
           cuda_grad=("({dy} * (1.0f - {y} * {y}))",)),
    OpSpec("relu", 1, OpKind.ELEMENTWISE, "max(a, 0)", ("a",), _relu, "fmaxf({0}, 0.0f)", "relu", None,
           RandomUse(("any",), lambda a: a), grad=(_relu_grad,), cuda_grad=("({0} > 0.0f ? {dy} : 0.0f)",),
           kink=np.positive),
    # PyTorch's softplus gives a itself for a > 20, 2e-9 off at most.
    OpSpec("softplus", 1, OpKind.ELEMENTWISE, "ln(1 + e^a), computed so that it never overflows", ("a",),
           _softplus, "(fmaxf({0}, 0.0f) + log1pf(expf(-fabsf({0}))))", "nn.functional.softplus", None,
           RandomUse(("any",), lambda a: a + math.log(2.0)),
           grad=(lambda dy, a, y: dy * _sigmoid(a),),
           # sigmoid(a) = 1 - e^-y, as e^y = 1 + e^a; expm1f keeps its digits where y is tiny (a << 0).
           cuda_grad=("(-{dy} * expm1f(-{y}))",)),
    # Row reductions: of a [B, hidden] value, one number per row, a [B, 1] value that spreads over the row
    # in elementwise ops. A kernel that computes one runs a block per row (see codegen.cuda_kernels).
    OpSpec("row_sum", 1, OpKind.REDUCTION, "the sum of the row, [batch, 1]", ("a",), _row_sum, "{0}", "sum",
           None, grad=(_row_sum_grad,), cuda_grad=("{dy}",)),
    OpSpec("row_mean", 1, OpKind.REDUCTION, "the mean of the row, [batch, 1]", ("a",), _row_mean,
           "({0} / {width})", "mean", None, grad=(_row_mean_grad,), cuda_grad=("({dy} / {width})",)),
]}

