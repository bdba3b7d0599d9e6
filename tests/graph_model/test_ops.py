"""The op table: arity and kind of every op, and the numpy meaning of every elementwise op."""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest

from cellfuse.graph_model import OPS

SOURCE_OPS = {name for name, spec in OPS.items() if spec.is_source}
ELEMENTWISE_OPS = {name for name, spec in OPS.items() if spec.is_elementwise}

# op -> (args, expected), every expected value worked out by hand.
LN2, LN3 = math.log(2.0), math.log(3.0)
CASES: dict[str, tuple[tuple[list[float], ...], list[float]]] = {
    "add": (([1.0, 2.0, -3.5], [3.0, -4.0, 0.5]), [4.0, -2.0, -3.0]),
    "sub": (([1.0, 2.0, -3.5], [3.0, -4.0, 0.5]), [-2.0, 6.0, -4.0]),
    "mul": (([1.0, 2.0, -3.5], [3.0, -4.0, 0.5]), [3.0, -8.0, -1.75]),
    "div": (([1.0, 2.0, -3.5], [4.0, -4.0, 0.5]), [0.25, -0.5, -7.0]),
    "neg": (([1.0, -2.0, 0.0],), [-1.0, 2.0, 0.0]),
    "exp": (([0.0, 1.0, LN2, -LN2],), [1.0, math.e, 2.0, 0.5]),
    # 1 / (1 + e^-a): e^-ln3 = 1/3 -> 3/4; e^ln3 = 3 -> 1/4.
    "sigmoid": (([0.0, LN3, -LN3],), [0.5, 0.75, 0.25]),
    # (e^a - e^-a) / (e^a + e^-a): a = ln 2 -> (2 - 1/2) / (2 + 1/2) = 3/5; a = ln 3 -> 4/5.
    "tanh": (([0.0, LN2, -LN3],), [0.0, 0.6, -0.8]),
    "relu": (([-2.0, 0.0, 3.5],), [0.0, 0.0, 3.5]),
    "max": (([1.0, -2.0, -3.5], [3.0, -4.0, -3.5]), [3.0, -2.0, -3.5]),
    "min": (([1.0, -2.0, -3.5], [3.0, -4.0, -3.5]), [1.0, -4.0, -3.5]),
    "abs": (([-2.5, 0.0, 3.0],), [2.5, 0.0, 3.0]),
    "square": (([-3.0, 0.5, 0.0],), [9.0, 0.25, 0.0]),
    "log": (([1.0, math.e, 0.5],), [0.0, 1.0, -LN2]),
    "sqrt": (([0.0, 2.25, 16.0],), [0.0, 1.5, 4.0]),
    "rsqrt": (([0.25, 1.0, 16.0],), [2.0, 1.0, 0.25]),
    # ln(1 + e^a): a = 0 -> ln 2; a = ln 3 -> ln 4; a = -ln 3 -> ln(4/3).
    "softplus": (([0.0, LN3, -LN3],), [LN2, 2.0 * LN2, 2.0 * LN2 - LN3]),
}

CONTRACT_ARITY = {
    "input": 0, "state": 0, "weight": 0, "const": 0, "matmul": 2,
    "add": 2, "sub": 2, "mul": 2, "div": 2,
    "neg": 1, "exp": 1, "sigmoid": 1, "tanh": 1, "relu": 1,
    "max": 2, "min": 2, "abs": 1, "square": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "softplus": 1,
    "row_sum": 1, "row_mean": 1,
}
REDUCTION_OPS = {"row_sum", "row_mean"}


def test_the_table_holds_the_ops_of_version_1_with_their_arity():
    assert {name: spec.arity for name, spec in OPS.items()} == CONTRACT_ARITY
    assert all(spec.name == name for name, spec in OPS.items())


def test_kinds():
    assert SOURCE_OPS == {"input", "state", "weight", "const"}
    assert OPS["matmul"].kind == "matmul" and OPS["matmul"].is_matmul
    assert all(sum((s.is_source, s.is_matmul, s.is_elementwise, s.is_reduction)) == 1 for s in OPS.values())
    assert ELEMENTWISE_OPS == set(CASES)
    assert {name for name, spec in OPS.items() if spec.is_reduction} == REDUCTION_OPS
    assert {name for name, spec in OPS.items() if spec.in_kernel} == ELEMENTWISE_OPS | REDUCTION_OPS


def test_every_elementwise_op_has_a_test_case():
    # A new op must come with a hand-computed case above.
    assert set(CASES) == ELEMENTWISE_OPS


@pytest.mark.parametrize("op", sorted(CASES))
def test_numpy_meaning(op):
    args, expected = CASES[op]
    spec = OPS[op]
    assert spec.numpy is not None and spec.arity == len(args) == len(spec.args)
    got = spec.numpy(*(np.array(a, dtype=np.float64) for a in args))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("op", sorted(CASES))
def test_numpy_meaning_broadcasts_a_row_against_a_batch(op):
    args, expected = CASES[op]
    batch = [np.array([a, a], dtype=np.float64) for a in args]  # [2, N]
    if len(args) == 2:
        batch[1] = np.array(args[1])  # [N] against [2, N]
    got = OPS[op].numpy(*batch)
    np.testing.assert_allclose(got, [expected, expected], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("op", sorted(CASES))
def test_cuda_expression_uses_every_argument(op):
    spec = OPS[op]
    assert spec.cuda is not None
    text = spec.cuda.format(*(f"ARG{i}" for i in range(spec.arity)))
    for i in range(spec.arity):
        assert f"ARG{i}" in text


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_does_not_overflow(dtype):
    a = np.array([-1000.0, -100.0, 0.0, 100.0, 1000.0], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is right
        got = OPS["sigmoid"].numpy(a)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, [0.0, 0.0, 0.5, 1.0, 1.0], atol=1e-30)
    assert got[0] >= 0.0 and got[-1] <= 1.0


def test_sigmoid_agrees_with_the_logistic_function_where_that_is_finite():
    a = np.linspace(-30.0, 30.0, 121)
    np.testing.assert_allclose(OPS["sigmoid"].numpy(a), 1.0 / (1.0 + np.exp(-a)), rtol=1e-12)


def test_sources_and_matmul_have_no_elementwise_meaning():
    for name in [*SOURCE_OPS, "matmul"]:
        assert OPS[name].numpy is None and OPS[name].cuda is None


@pytest.mark.parametrize("op", sorted(CASES))
def test_every_elementwise_op_has_every_meaning(op):
    """What the baselines, the builder and the random cells take from the table."""
    spec = OPS[op]
    assert spec.torch and all(part.isidentifier() for part in spec.torch.split("."))
    assert spec.symbol in (None, "+", "-", "*", "/")
    assert spec.random is not None and len(spec.random.args) == spec.arity
    assert spec.random.bound(*([1.0] * spec.arity)) >= 0.0


# -- row reductions ---------------------------------------------------------------------------------------

def test_row_reductions_reduce_the_last_axis_to_one_column():
    a = np.array([[1.0, 2.0, -6.0], [0.5, 0.25, 0.25]])
    np.testing.assert_array_equal(OPS["row_sum"].numpy(a), [[-3.0], [1.0]])
    np.testing.assert_array_equal(OPS["row_mean"].numpy(a), [[-1.0], [1.0 / 3.0]])
    # the [B, 1] result spreads over a row in an elementwise op: a layer norm's centring
    np.testing.assert_allclose(a - OPS["row_mean"].numpy(a), [[2.0, 3.0, -5.0], [1 / 6, -1 / 12, -1 / 12]],
                               rtol=1e-15)


@pytest.mark.parametrize("op", sorted(REDUCTION_OPS))
def test_a_row_reduction_has_every_meaning_but_random_use(op):
    """Random cells draw reductions themselves (their bound depends on the width)."""
    spec = OPS[op]
    assert spec.arity == 1 and spec.args == ("a",) and spec.symbol is None
    assert spec.torch in ("sum", "mean") and spec.random is None
    text = spec.cuda.format("SUM", width="W")
    assert "SUM" in text and (op == "row_sum" or "W" in text)
    assert spec.grad is not None and spec.cuda_grad is not None and len(spec.cuda_grad) == 1


@pytest.mark.parametrize("op", sorted(REDUCTION_OPS))
def test_the_gradient_of_a_row_reduction_broadcasts_over_the_row(op):
    rng = np.random.default_rng(0)
    a, dy = rng.standard_normal((3, 5)), rng.standard_normal((3, 1))
    spec = OPS[op]
    g = spec.grad[0](dy, a, spec.numpy(a))
    assert g.shape == a.shape
    step = 1e-6
    for j in range(a.shape[1]):  # central differences of sum(dy * op(a)) along each column
        e = np.zeros_like(a)
        e[:, j] = step
        fd = (np.sum(dy * spec.numpy(a + e), axis=1) - np.sum(dy * spec.numpy(a - e), axis=1)) / (2 * step)
        np.testing.assert_allclose(g[:, j], fd, rtol=1e-6)


# -- extreme values -------------------------------------------------------------------------------------

def two(k: int) -> float:
    return math.ldexp(1.0, k)  # 2^k, exact


TINY = two(-1074)  # the smallest float64 above 0
INF = math.inf

# op -> [(args, expected)] at zeros of both signs, infinities, subnormals and the ends of float64's range;
# each expected value worked out by hand.
EXTREME_CASES: dict[str, list[tuple[tuple[float, ...], float]]] = {
    "max": [((-0.0, 0.0), 0.0), ((0.0, -0.0), 0.0), ((1e308, -1e308), 1e308), ((-TINY, TINY), TINY)],
    "min": [((-0.0, 0.0), 0.0), ((0.0, -0.0), 0.0), ((1e308, -1e308), -1e308), ((-TINY, TINY), -TINY)],
    "abs": [((-0.0,), 0.0), ((-1e308,), 1e308), ((-TINY,), TINY)],
    "square": [((two(500),), two(1000)), ((two(600),), INF), ((-two(-600),), 0.0)],
    "log": [((0.0,), -INF), ((-0.0,), -INF), ((INF,), INF), ((TINY,), -1074 * math.log(2.0)),
            ((two(1000),), 1000 * math.log(2.0))],
    "sqrt": [((0.0,), 0.0), ((-0.0,), -0.0), ((INF,), INF), ((TINY,), two(-537)), ((two(1000),), two(500))],
    "rsqrt": [((0.0,), INF), ((INF,), 0.0), ((TINY,), two(537)), ((two(1000),), two(-500))],
    # ln(1 + e^a) = a + ln(1 + e^-a): a itself once e^-a is below half an ulp of a; e^a for a << 0.
    "softplus": [((1000.0,), 1000.0), ((-1000.0,), 0.0), ((710.0,), 710.0), ((-700.0,), math.exp(-700.0)),
                 ((-745.0,), TINY)],
}
# max and min of zeros of both signs give a zero whose sign is not promised: numpy gives the second arg,
# PyTorch the first, the host's C library +0 for max and -0 for min.
SIGN_OF_ZERO_OPEN = {"max", "min"}


@pytest.mark.parametrize("op", sorted(EXTREME_CASES))
def test_numpy_meaning_at_extreme_values(op):
    spec = OPS[op]
    for args, expected in EXTREME_CASES[op]:
        # log(0), 1/sqrt(0) and a square past float64's range are infinite
        with np.errstate(divide="ignore", over="ignore"):
            got = spec.numpy(*(np.float64(a) for a in args))
        assert got == pytest.approx(expected, rel=1e-15, abs=0.0), f"{op}{args}"
        if expected == 0.0 and op not in SIGN_OF_ZERO_OPEN:
            assert np.signbit(got) == np.signbit(expected), f"{op}{args}: {got!r}"


def test_log_of_zero_is_minus_infinity_as_numpy_has_it():
    with np.errstate(divide="ignore"):
        for dtype in (np.float32, np.float64):
            assert OPS["log"].numpy(np.zeros(2, dtype))[0] == -np.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softplus_does_not_overflow(dtype):
    a = np.array([-1000.0, -50.0, 0.0, 50.0, 1000.0], dtype=dtype)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is right
        got = OPS["softplus"].numpy(a)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, [0.0, math.exp(-50.0), math.log(2.0), 50.0, 1000.0], rtol=1e-6, atol=0.0)


def test_softplus_agrees_with_the_formula_where_that_is_finite():
    a = np.linspace(-30.0, 30.0, 121)
    np.testing.assert_allclose(OPS["softplus"].numpy(a), np.log1p(np.exp(a)), rtol=1e-14)


# -- the CUDA expressions, run on the host -------------------------------------------------------------

F32_MAX, F32_TINY = float(np.finfo(np.float32).max), float(np.finfo(np.float32).smallest_subnormal)

# op -> args at which the CUDA expression must compute what numpy computes, rounded to float: where
# float overflows, underflows to a subnormal or to 0, or meets a zero of either sign.
CUDA_EXTREMES: dict[str, list[tuple[float, ...]]] = {
    "add": [(F32_MAX, F32_MAX), (F32_TINY, -F32_TINY), (-0.0, -0.0)],
    "sub": [(F32_MAX, -F32_MAX), (F32_TINY, F32_TINY)],
    "mul": [(1e20, 1e20), (1e-30, 1e-30), (-0.0, 3.0)],
    "div": [(F32_MAX, 0.5), (F32_TINY, 4.0), (1.0, 0.0), (-0.0, 2.0)],
    "neg": [(0.0,), (-F32_MAX,)],
    "exp": [(88.0,), (89.0,), (-100.0,), (-104.0,), (-110.0,)],
    "sigmoid": [(100.0,), (-100.0,), (-104.0,), (-110.0,), (0.0,)],
    "tanh": [(10.0,), (-10.0,), (F32_TINY,), (-0.0,)],
    "relu": [(-0.0,), (F32_TINY,), (-F32_TINY,), (F32_MAX,)],
    "max": [(-0.0, 0.0), (0.0, -0.0), (F32_MAX, -F32_MAX), (-F32_TINY, F32_TINY), (2.0, 2.0)],
    "min": [(-0.0, 0.0), (0.0, -0.0), (F32_MAX, -F32_MAX), (-F32_TINY, F32_TINY), (2.0, 2.0)],
    "abs": [(-0.0,), (-F32_MAX,), (-F32_TINY,)],
    "square": [(1e20,), (-1e-30,), (F32_TINY,)],
    "log": [(0.0,), (-0.0,), (F32_TINY,), (F32_MAX,), (1.0,)],
    "sqrt": [(0.0,), (-0.0,), (F32_TINY,), (F32_MAX,)],
    "rsqrt": [(0.0,), (F32_TINY,), (F32_MAX,), (4.0,)],
    "softplus": [(1000.0,), (-1000.0,), (88.0,), (89.0,), (-100.0,), (-104.0,), (0.0,), (F32_TINY,)],
}


def test_every_elementwise_op_has_extreme_values_for_its_cuda_expression():
    assert set(CUDA_EXTREMES) == ELEMENTWISE_OPS


def ordinary_args(spec, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """n float values of each arg, inside the domain the op's RandomUse entry gives it."""
    span = {"any": (-8.0, 8.0), "bounded": (-3.0, 3.0), "unit": (-1.0, 1.0),
            "positive": (math.exp(-1.0), 6.0)}
    return [rng.uniform(*span[domain], n).astype(np.float32) for domain in spec.random.args]


def cuda_forward_source(points: dict[str, list[tuple[float, ...]]]) -> str:
    """Each op's CUDA expression as a function of floats, with codegen's prelude, both callable from the
    host; a main that prints each at the given points."""
    from cellfuse.codegen.cuda_kernels import PRELUDE

    # The prelude's helpers are device functions: made host functions too, the same code runs here.
    both = "__host__ __device__ __forceinline__"
    parts = ["#include <cstdio>", PRELUDE.replace("__device__ __forceinline__", both)]
    calls = []
    for op in sorted(points):
        spec = OPS[op]
        params = ", ".join(f"float a{j}" for j in range(spec.arity))
        expr = spec.cuda.format(*(f"a{j}" for j in range(spec.arity)))
        parts.append(f"{both} float op_{op}({params}) {{\n    return {expr};\n}}")
        for point in points[op]:
            values = ", ".join(f"{v!r}f" for v in point)
            calls.append(f'    printf("%.9e\\n", (double)op_{op}({values}));')
    parts.append("int main() {\n" + "\n".join(calls) + "\n    return 0;\n}")
    return "\n\n".join(parts) + "\n"


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_each_cuda_expression_means_what_numpy_means(tmp_path):
    """In float on the host, against numpy in float64 at the same float values, rounded to float: at
    ordinary values of each arg's domain and at the extremes above."""
    rng = np.random.default_rng(0)
    points, expected = {}, []
    for op in sorted(ELEMENTWISE_OPS):
        spec = OPS[op]
        drawn = [tuple(float(v) for v in row) for row in zip(*ordinary_args(spec, rng, 40), strict=True)]
        points[op] = drawn + [tuple(float(np.float32(v)) for v in p) for p in CUDA_EXTREMES[op]]
        for point in points[op]:
            with np.errstate(divide="ignore", over="ignore", under="ignore"):
                expected.append((op, point, np.float32(spec.numpy(*(np.float64(v) for v in point)))))
    cu, exe = tmp_path / "ops.cu", tmp_path / "ops"
    cu.write_text(cuda_forward_source(points))
    build = subprocess.run(["nvcc", "-O2", "-o", str(exe), str(cu)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    got = np.array([float(line) for line in run.stdout.split()], dtype=np.float32)
    assert len(got) == len(expected)
    for g, (op, point, e) in zip(got, expected, strict=True):
        # a few roundings of float (6e-8 each), and subnormals, whose spacing is F32_TINY
        assert g == pytest.approx(e, rel=5e-7, abs=2 * F32_TINY), f"{op}{point}: CUDA {g!r}, numpy {e!r}"
        if e == 0.0 and op not in SIGN_OF_ZERO_OPEN:
            assert np.signbit(g) == np.signbit(e), f"{op}{point}: CUDA {g!r}, numpy {e!r}"
