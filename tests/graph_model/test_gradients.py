"""The derivative of a cell: the op table's derivative rules, and the reference backward pass against
finite differences of the reference's forward pass, all in float64."""

from __future__ import annotations

import shutil
import string
import subprocess
from dataclasses import dataclass

import numpy as np
import pytest
from compile_cuda import nvcc_ptx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_cells import random_cells
from tiers import slow_where

from cellfuse.graph_model import (
    OPS,
    Cell,
    CellBuilder,
    CellError,
    OpSpec,
    analyze,
    backward,
    init_params,
    load_template,
    record_forward,
    run_reference,
    run_reference_backward,
    tanh,
    template_names,
)
from cellfuse.graph_model.builder import apply
from cellfuse.graph_model.ops import OpKind, RandomUse

T, B, INPUT, HIDDEN = 4, 2, 3, 4
EPS = 1e-6
RTOL = 1e-6
# A difference quotient of a loss of magnitude S is good to about 1e-16 S / EPS = 1e-10 S: a gradient
# smaller than FLOOR * S (a rare coordinate) is compared as if it were FLOOR * S.
FLOOR = 1e-3

ELEMENTWISE = sorted(name for name, spec in OPS.items() if spec.is_elementwise)
no_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")


# -- the reference backward pass against finite differences --------------------------------------------

@dataclass
class Case:
    """A run and seeds: `variables` are x, every initial state and every parameter, by name."""

    cell: Cell
    layers: int
    variables: dict[str, np.ndarray]
    given_states: bool
    dy: np.ndarray
    dfinal: dict[str, np.ndarray] | None

    @property
    def states(self) -> list[str]:
        return [s.id for s in self.cell.of_op("state")]

    def split(self, variables: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        params = {k: v for k, v in variables.items() if "." in k}  # parameter keys are l{layer}.{weight}
        return params, {k: v for k, v in variables.items() if "." not in k}

    def loss(self, variables: dict[str, np.ndarray]) -> tuple[float, float]:
        """sum(dy * y) + sum(dfinal * final) in float64, and its magnitude sum(|dy * y|) + ..."""
        tape = record_forward(self.cell, *self.split(variables), self.layers)
        terms = [self.dy * tape.y, *((v * tape.final[s]) for s, v in (self.dfinal or {}).items())]
        return float(sum(np.sum(t) for t in terms)), float(sum(np.sum(np.abs(t)) for t in terms))

    def moved(self) -> dict[str, np.ndarray]:
        """The variables the finite differences move. Not the initial states when they are not given: at
        zero, relu(h) has no derivative, and a difference quotient across its kink means nothing (the
        gradients there are checked where the states are given)."""
        return {k: v for k, v in self.variables.items() if self.given_states or k not in self.states}

    def along(self, direction: dict[str, np.ndarray]) -> float:
        """The central difference of the loss along `direction` (of some variables)."""
        plus = {k: v + EPS * direction[k] if k in direction else v for k, v in self.variables.items()}
        minus = {k: v - EPS * direction[k] if k in direction else v for k, v in self.variables.items()}
        return (self.loss(plus)[0] - self.loss(minus)[0]) / (2.0 * EPS)

    def gradients(self) -> dict[str, np.ndarray]:
        params, inputs = self.split(self.variables)
        if not self.given_states:  # the states start at zero, as when they are not given
            inputs = {"x": inputs["x"]}
        g = run_reference_backward(self.cell, params, inputs, self.layers, self.dy, self.dfinal)
        return {"x": g.dx, **g.dinitial, **g.dparams}


def make_case(cell: Cell, layers: int, seed: int, given_states: bool = True, with_dfinal: bool = True,
              seq: int = T, batch: int = B) -> Case:
    rng = np.random.default_rng(seed)
    width = HIDDEN if analyze(cell).ties else INPUT  # a cell that ties the two widths runs only where equal
    # twice PyTorch's scale, so that the gates work away from their linear middle
    params = init_params(cell, layers, width, HIDDEN, seed)
    params = {k: 2.0 * v.astype(np.float64) for k, v in params.items()}
    states = {s.id: (rng.standard_normal((layers, batch, HIDDEN)) if given_states
                     else np.zeros((layers, batch, HIDDEN))) for s in cell.of_op("state")}
    variables = {"x": rng.standard_normal((seq, batch, width)), **states, **params}
    dfinal = {s: rng.standard_normal((layers, batch, HIDDEN)) for s in states} if with_dfinal else None
    return Case(cell, layers, variables, given_states, rng.standard_normal((seq, batch, HIDDEN)), dfinal)


def assert_close(fd: float, analytic: float, scale: float, what: str) -> None:
    # (a loss that is 0 at every point, of a cell whose output only its zero states reach, has 0 for both)
    err = abs(fd - analytic) / max(abs(fd), abs(analytic), FLOOR * scale, np.finfo(np.float64).tiny)
    assert err < RTOL, f"{what}: finite difference {fd!r}, backward {analytic!r}, relative error {err:.2e}"


def check_directions(case: Case, grads: dict[str, np.ndarray], rng: np.random.Generator, count: int) -> None:
    scale = case.loss(case.variables)[1]
    for i in range(count):
        direction = {k: rng.standard_normal(v.shape) for k, v in case.moved().items()}
        analytic = sum(float(np.sum(grads[k] * d)) for k, d in direction.items())
        assert_close(case.along(direction), analytic, scale, f"direction {i}")


def check_coordinates(case: Case, grads: dict[str, np.ndarray], rng: np.random.Generator, count: int) -> None:
    scale = case.loss(case.variables)[1]
    for name, value in case.moved().items():
        for index in rng.choice(value.size, min(count, value.size), replace=False):
            direction = {name: np.zeros_like(value)}
            direction[name].flat[index] = 1.0
            assert_close(case.along(direction), float(grads[name].flat[index]), scale,
                         f"{name}[{np.unravel_index(index, value.shape)}]")


# The default tier: one layer from given states (the random cells' [dev] run draws stacks and zero states)
@pytest.mark.parametrize("given_states", slow_where([True, False], lambda given: not given),
                         ids=["initial-states", "zero-states"])
@pytest.mark.parametrize("layers", slow_where([1, 2], lambda layers: layers == 2))
@pytest.mark.parametrize("name", template_names())
def test_every_template_against_finite_differences(name, layers, given_states):
    case = make_case(load_template(name), layers, seed=layers, given_states=given_states)
    grads = case.gradients()
    assert set(grads) == set(case.variables)
    for k, v in case.variables.items():
        assert grads[k].shape == v.shape and grads[k].dtype == np.float64, k
    rng = np.random.default_rng(7)
    check_coordinates(case, grads, rng, 3)
    check_directions(case, grads, rng, 3)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cell=random_cells(), layers=st.integers(1, 2), seq=st.integers(1, 4), batch=st.integers(1, 3),
       given_states=st.booleans(), with_dfinal=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_cells_against_finite_differences(cell, layers, seq, batch, given_states, with_dfinal, seed):
    case = make_case(cell, layers, seed, given_states, with_dfinal, seq, batch)
    check_directions(case, case.gradients(), np.random.default_rng(seed), 2)


@pytest.mark.parametrize("name", template_names())
def test_the_tape_is_run_reference_in_float64(name):
    case = make_case(load_template(name), 2, seed=3)
    params, inputs = case.split(case.variables)
    tape = record_forward(case.cell, params, inputs, 2)
    ref = run_reference(case.cell, params, inputs, 2)
    assert tape.y.dtype == np.float64
    np.testing.assert_array_equal(tape.y.astype(np.float32), ref.y)
    for s, v in ref.final.items():
        np.testing.assert_array_equal(tape.final[s].astype(np.float32), v)


def test_the_backward_pass_of_a_tape_is_run_reference_backward():
    case = make_case(load_template("gru"), 2, seed=5)
    params, inputs = case.split(case.variables)
    once = backward(record_forward(case.cell, params, inputs, 2), case.dy, case.dfinal)
    again = run_reference_backward(case.cell, params, inputs, 2, case.dy, case.dfinal)
    np.testing.assert_array_equal(once.dx, again.dx)
    assert once.dparams.keys() == again.dparams.keys() and once.dinitial.keys() == again.dinitial.keys()


def test_a_state_seen_only_through_dfinal():
    """h' = h carries dfinal['h'] back unchanged to h's initial value; y does not see h."""
    b = CellBuilder("carry", input=INPUT, hidden=HIDDEN)
    x, h, g = b.input("x"), b.state("h"), b.state("g")
    b.update(h, h)
    g_new = tanh(x @ b.weight("W", "input", "hidden"))
    b.update(g, g_new)
    b.output(g_new)
    case = make_case(b.build(), 2, seed=11)
    grads = case.gradients()
    np.testing.assert_array_equal(grads["h"], case.dfinal["h"])
    np.testing.assert_array_equal(grads["g"], np.zeros_like(grads["g"]))


# -- seeds and refusals ---------------------------------------------------------------------------------

@pytest.fixture
def elman_run():
    case = make_case(load_template("elman"), 1, seed=2)
    params, inputs = case.split(case.variables)
    return case, params, inputs


@pytest.mark.parametrize("dy, message", [
    (np.zeros((T, B, HIDDEN + 1)), "dy has shape"),
    (np.zeros((T, B, HIDDEN), np.int64), "dy has dtype"),
    (np.full((T, B, HIDDEN), np.nan), "dy holds NaN"),
    ([[0.0]], "dy must be a float array"),
])
def test_a_seed_that_does_not_fit_is_refused(elman_run, dy, message):
    case, params, inputs = elman_run
    with pytest.raises(CellError, match=message):
        run_reference_backward(case.cell, params, inputs, 1, dy)


def test_dfinal_must_name_states_with_their_final_shape(elman_run):
    case, params, inputs = elman_run
    with pytest.raises(CellError, match="'c' is not a state"):
        run_reference_backward(case.cell, params, inputs, 1, case.dy, {"c": np.zeros((1, B, HIDDEN))})
    with pytest.raises(CellError, match=r"dfinal 'h' has shape \[2, 2, 4\], expected \[1, 2, 4\]"):
        run_reference_backward(case.cell, params, inputs, 1, case.dy, {"h": np.zeros((2, B, HIDDEN))})
    with pytest.raises(CellError, match="dfinal must map states"):
        run_reference_backward(case.cell, params, inputs, 1, case.dy, [np.zeros((1, B, HIDDEN))])


def test_a_gradient_too_large_for_float64_is_refused(elman_run):
    case, params, inputs = elman_run
    with pytest.raises(CellError, match="the gradient of .* holds NaN or infinity"):
        run_reference_backward(case.cell, params, inputs, 1, np.full((T, B, HIDDEN), 1e308))


def test_an_op_without_a_derivative_is_named(monkeypatch):
    monkeypatch.setitem(OPS, "cube", OpSpec("cube", 1, OpKind.ELEMENTWISE, "a * a * a", ("a",),
                                            lambda a: a * a * a, "({0} * {0} * {0})", "pow", None,
                                            RandomUse(("unit",), lambda a: a * a * a)))
    b = CellBuilder("cubes", input=INPUT, hidden=HIDDEN)
    x, h = b.input("x"), b.state("h")
    h_new = tanh(apply("cube", x @ b.weight("W", "input", "hidden")) + h)
    b.update(h, h_new)
    b.output(h_new)
    case = make_case(b.build(), 1, seed=0)
    with pytest.raises(CellError, match="no derivative in the op table: cube"):
        case.gradients()


# -- the op table's derivative rules --------------------------------------------------------------------

def test_every_op_that_computes_has_a_derivative_rule_per_arg():
    for name, spec in OPS.items():
        if spec.is_source:
            assert spec.grad is None and spec.cuda_grad is None, name
        else:
            assert spec.grad is not None and len(spec.grad) == spec.arity, name
        if spec.is_elementwise:
            assert spec.cuda_grad is not None and len(spec.cuda_grad) == spec.arity, name
        if spec.is_matmul:
            assert spec.cuda_grad is None, name  # a GEMM's derivative is two GEMMs, not an expression


def draw_args(spec: OpSpec, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """n values of each arg inside the domain the op's RandomUse entry gives it."""
    draw = {
        "any": lambda: rng.uniform(-8.0, 8.0, n),
        "bounded": lambda: rng.uniform(-3.0, 3.0, n),
        "unit": lambda: rng.uniform(-1.0, 1.0, n),
        "positive": lambda: rng.uniform(np.exp(-1.0), 6.0, n),
    }
    return [draw[domain]() for domain in spec.random.args]


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_each_rule_against_finite_differences_of_the_numpy_meaning(op):
    spec = OPS[op]
    rng = np.random.default_rng(0)
    args = draw_args(spec, rng, 400)
    dy = rng.standard_normal(400)
    y = spec.numpy(*args)
    for i, rule in enumerate(spec.grad):
        h = EPS * np.maximum(1.0, np.abs(args[i]))
        plus = [a + h if j == i else a for j, a in enumerate(args)]
        minus = [a - h if j == i else a for j, a in enumerate(args)]
        fd = (spec.numpy(*plus) - spec.numpy(*minus)) / (plus[i] - minus[i])
        got = rule(dy, *args, y)
        assert got.shape == y.shape
        # the difference quotient's own rounding: 1e-16 |y| / h
        np.testing.assert_allclose(got, dy * fd, rtol=RTOL, atol=1e-9 * np.max(np.abs(dy * y)) + 1e-12,
                                   err_msg=f"{op}, arg {spec.args[i]}")


@pytest.mark.parametrize("op", [name for name in ELEMENTWISE if OPS[name].arity == 2])
def test_a_binary_rule_takes_a_row_or_a_scalar_broadcast_over_the_batch(op):
    spec = OPS[op]
    rng = np.random.default_rng(1)
    a, row, scalar = rng.uniform(1.0, 2.0, (3, 4)), rng.uniform(1.0, 2.0, 4), np.float64(1.5)
    dy = rng.standard_normal((3, 4))
    for b in (row, scalar):
        y = spec.numpy(a, b)
        for i, rule in enumerate(spec.grad):
            full = [a, np.broadcast_to(b, a.shape)]
            np.testing.assert_allclose(rule(dy, a, b, y), rule(dy, *full, y), rtol=1e-15, err_msg=f"{op} {i}")


def test_the_matmul_rule_against_finite_differences():
    rule = OPS["matmul"].grad
    rng = np.random.default_rng(2)
    a, w, dy = rng.standard_normal((3, 5)), rng.standard_normal((5, 4)), rng.standard_normal((3, 4))
    da, dw = rng.standard_normal(a.shape), rng.standard_normal(w.shape)
    fd_a = np.sum(dy * ((a + EPS * da) @ w - (a - EPS * da) @ w)) / (2 * EPS)
    fd_w = np.sum(dy * (a @ (w + EPS * dw) - a @ (w - EPS * dw))) / (2 * EPS)
    ga, gw = rule[0](dy, a, w, a @ w), rule[1](dy, a, w, a @ w)
    assert ga.shape == a.shape and gw.shape == w.shape
    assert_close(fd_a, float(np.sum(ga * da)), 0.0, "a")
    assert_close(fd_w, float(np.sum(gw * dw)), 0.0, "W")


# Where a rule written the obvious way is wrong in float64 (y (1 - y) is 0 once sigmoid rounds to 1,
# a / b^2 overflows), and where the function is so flat that float64's own differences cannot see the
# slope: checked against differences in 400 digits of the op written here with mpmath.
EXTREMES: dict[str, list[tuple[float, ...]]] = {
    "add": [(1e300, -1e300), (1e-300, 3.0)],
    "sub": [(1e300, 1e300), (-1e-300, 3.0)],
    "mul": [(1e200, 1e-200), (-1e-150, 1e150)],
    "div": [(1e100, 1e200), (1e300, 0.5), (-3.0, 1e-150), (1e-300, 7.0)],
    "neg": [(1e300,), (-1e-300,)],
    "exp": [(-700.0,), (700.0,), (1e-300,)],
    "sigmoid": [(40.0,), (-40.0,), (700.0,), (-700.0,), (20.0,), (1e-300,)],
    "tanh": [(20.0,), (-20.0,), (40.0,), (-350.0,), (1e-300,)],
    "relu": [(1e-300,), (-1e-300,), (1e300,), (-1e300,)],
    # at a tie, the central difference of max or min is 1/2 for each arg, as the rule has it
    "max": [(1e300, -1e300), (-1e-300, 1e-300), (2.0, 2.0), (-3.0, -3.0)],
    "min": [(1e300, -1e300), (-1e-300, 1e-300), (2.0, 2.0), (-3.0, -3.0)],
    "abs": [(1e-300,), (-1e-300,), (1e300,), (-1e300,)],
    "square": [(1e150,), (-1e150,), (1e-300,)],
    "log": [(1e-300,), (1e300,), (1.0,)],
    "sqrt": [(1e-300,), (1e300,), (5e-324,)],
    "rsqrt": [(1e-200,), (1e200,), (4.0,)],
    "softplus": [(40.0,), (-40.0,), (700.0,), (-700.0,), (1e-300,), (-1e-300,)],
}


def mp_meaning(op: str):
    mp = pytest.importorskip("mpmath").mp
    return {
        "add": lambda a, b: a + b,
        "sub": lambda a, b: a - b,
        "mul": lambda a, b: a * b,
        "div": lambda a, b: a / b,
        "neg": lambda a: -a,
        "exp": mp.exp,
        "sigmoid": lambda a: 1 / (1 + mp.exp(-a)),
        "tanh": mp.tanh,
        "relu": lambda a: a if a > 0 else 0 * a,
        "max": max,
        "min": min,
        "abs": abs,
        "square": lambda a: a * a,
        "log": mp.log,
        "sqrt": mp.sqrt,
        "rsqrt": lambda a: 1 / mp.sqrt(a),
        "softplus": lambda a: mp.log(1 + mp.exp(a)),
    }[op]


def test_every_elementwise_op_has_extreme_values_to_check():
    assert set(EXTREMES) == set(ELEMENTWISE)


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_each_rule_is_exact_at_extreme_values(op):
    mpmath = pytest.importorskip("mpmath")
    spec, meaning = OPS[op], mp_meaning(op)
    for point in EXTREMES[op]:
        args = [np.float64(v) for v in point]
        with np.errstate(over="ignore"):  # exp(700) is finite; e^-|a| of a huge a underflows to 0
            y = spec.numpy(*args)
        for i, rule in enumerate(spec.grad):
            with mpmath.workdps(400):
                exact = [mpmath.mpf(v) for v in point]
                h = mpmath.mpf(10) ** -60 * abs(exact[i])  # relative: no step crosses relu's kink
                plus = [v + h if j == i else v for j, v in enumerate(exact)]
                minus = [v - h if j == i else v for j, v in enumerate(exact)]
                expected = float((meaning(*plus) - meaning(*minus)) / (2 * h))
            got = float(rule(np.float64(1.0), *args, y))
            assert got == pytest.approx(expected, rel=1e-13, abs=0.0), f"{op}'{i} at {point}"


def test_relu_takes_zero_as_its_derivative_at_zero():
    assert float(OPS["relu"].grad[0](np.float64(1.0), np.float64(0.0), np.float64(0.0))) == 0.0


def test_abs_takes_zero_as_its_derivative_at_zero():
    for zero in (0.0, -0.0):
        assert float(OPS["abs"].grad[0](np.float64(1.0), np.float64(zero), np.float64(0.0))) == 0.0


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_give_each_arg_half_the_gradient_at_a_tie(op):
    """As PyTorch does; the halves sum to the whole, so max(a, a) has the derivative of a."""
    a, b = np.array([2.0, -0.0, 1.0, 3.0]), np.array([2.0, 0.0, 3.0, 1.0])
    dy = np.array([1.0, -4.0, 1.0, 1.0])
    y = OPS[op].numpy(a, b)
    da, db = (rule(dy, a, b, y) for rule in OPS[op].grad)
    np.testing.assert_array_equal(da[:2], [0.5, -2.0])
    np.testing.assert_array_equal(db[:2], [0.5, -2.0])
    winner_is_a = [False, True] if op == "max" else [True, False]
    np.testing.assert_array_equal(da[2:], np.where(winner_is_a, 1.0, 0.0))
    np.testing.assert_array_equal(db[2:], np.where(winner_is_a, 0.0, 1.0))


def test_sqrt_has_an_infinite_derivative_at_zero():
    with np.errstate(divide="ignore"):
        assert float(OPS["sqrt"].grad[0](np.float64(1.0), np.float64(0.0), np.float64(0.0))) == np.inf


# -- the CUDA forms of the derivative rules -------------------------------------------------------------

def cuda_fields(text: str) -> set[str]:
    return {field for _, field, _, _ in string.Formatter().parse(text) if field is not None}


@pytest.mark.parametrize("op", ELEMENTWISE)
def test_each_cuda_rule_is_an_expression_over_dy_y_and_the_args(op):
    spec = OPS[op]
    for i, text in enumerate(spec.cuda_grad):
        fields = cuda_fields(text)
        assert fields <= {"dy", "y", *map(str, range(spec.arity))}, (op, i, fields)
        assert "dy" in fields, (op, i)  # a gradient is linear in the upstream gradient
        expr = text.format(*(f"ARG{j}" for j in range(spec.arity)), dy="DY", y="Y")
        assert expr.count("(") == expr.count(")"), expr
        # the tests below compile and run the rules on their own, without codegen's prelude
        assert "cf_" not in expr, (op, i)


def cuda_source(with_main: bool, points: dict[str, list[list[float]]] | None = None) -> str:
    """Every CUDA rule as a function of floats, callable from host and device; a kernel for each, and, for
    the host run, a main that prints each rule at the given points (dy, args..., y)."""
    parts = ["#include <cstdio>"]
    for op in ELEMENTWISE:
        spec = OPS[op]
        params = ", ".join(["float dy", *(f"float a{j}" for j in range(spec.arity)), "float y"])
        for i, text in enumerate(spec.cuda_grad):
            expr = text.format(*(f"a{j}" for j in range(spec.arity)), dy="dy", y="y")
            parts.append(f"__host__ __device__ __forceinline__ float grad_{op}_{i}({params}) {{\n"
                         f"    return {expr};\n}}")
            loads = ", ".join(["dy[k]", *(f"a{j}[k]" for j in range(spec.arity)), "y[k]"])
            ptrs = ", ".join(f"const float* __restrict__ {p}"
                             for p in ["dy", *(f"a{j}" for j in range(spec.arity)), "y"])
            parts.append(f"__global__ void kernel_{op}_{i}({ptrs}, float* __restrict__ out, int n) {{\n"
                         f"    int k = blockIdx.x * blockDim.x + threadIdx.x;\n"
                         f"    if (k < n) out[k] = grad_{op}_{i}({loads});\n}}")
    if with_main:
        calls = []
        for op in ELEMENTWISE:
            for i in range(OPS[op].arity):
                for point in points[op]:
                    values = ", ".join(f"{v!r}f" for v in point)
                    calls.append(f'    printf("%.9e\\n", (double)grad_{op}_{i}({values}));')
        parts.append("int main() {\n" + "\n".join(calls) + "\n    return 0;\n}")
    return "\n\n".join(parts) + "\n"


@pytest.mark.nvcc
@no_nvcc
def test_the_cuda_rules_compile_without_a_warning(tmp_path):
    nvcc_ptx(cuda_source(with_main=False), tmp_path)  # the front end's checks: each rule is a C expression


@pytest.mark.nvcc
@no_nvcc
def test_the_cuda_rules_mean_what_the_numpy_rules_mean(tmp_path):
    """In float on the host, against the numpy rules in float64 at the same float values, y rounded to
    float as the forward kernels give it."""
    rng = np.random.default_rng(3)
    points, expected = {}, []
    for op in ELEMENTWISE:
        spec = OPS[op]
        args = [a.astype(np.float32) for a in draw_args(spec, rng, 50)]
        dy = rng.standard_normal(50).astype(np.float32)
        y = spec.numpy(*(a.astype(np.float64) for a in args)).astype(np.float32)
        points[op] = [[float(v) for v in row] for row in zip(dy, *args, y, strict=True)]
        for rule in spec.grad:
            expected.extend(rule(*(v.astype(np.float64) for v in (dy, *args, y))))
    got = run_on_host(points, tmp_path)
    # float's rounding of y (6e-8) and of a few operations after it
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def run_on_host(points: dict[str, list[list[float]]], tmp_path) -> np.ndarray:
    """What each CUDA rule gives at the points, in the order of cuda_source's main."""
    cu, exe = tmp_path / "rules.cu", tmp_path / "rules"
    cu.write_text(cuda_source(with_main=True, points=points))
    build = subprocess.run(["nvcc", "-O2", "-o", str(exe), str(cu)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    return np.array([float(line) for line in run.stdout.split()])


# Args where an op has no derivative, or an infinite one, and its rule takes a convention: the CUDA rule
# must take the numpy rule's.
KINKS: dict[str, list[tuple[float, ...]]] = {
    "relu": [(0.0,), (-0.0,)],
    "abs": [(0.0,), (-0.0,)],
    "max": [(2.0, 2.0), (-0.0, 0.0), (0.0, -0.0)],
    "min": [(2.0, 2.0), (-0.0, 0.0), (0.0, -0.0)],
    "sqrt": [(0.0,)],
}


@pytest.mark.slow
@pytest.mark.nvcc
@no_nvcc
def test_the_cuda_rules_take_the_numpy_rules_conventions_at_kinks(tmp_path):
    points, expected = {}, []
    for op in ELEMENTWISE:
        spec = OPS[op]
        rows = [(dy, *args, float(spec.numpy(*args))) for args in KINKS.get(op, []) for dy in (1.0, -3.0)]
        points[op] = [list(row) for row in rows]
        with np.errstate(divide="ignore"):  # sqrt's derivative at 0
            expected.extend(float(rule(*map(np.float64, row))) for rule in spec.grad for row in rows)
    np.testing.assert_array_equal(run_on_host(points, tmp_path), expected)
