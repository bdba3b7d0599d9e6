"""The op table: arity and kind of every op, and the numpy meaning of every elementwise op."""

from __future__ import annotations

import math

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
}

CONTRACT_ARITY = {
    "input": 0, "state": 0, "weight": 0, "const": 0, "matmul": 2,
    "add": 2, "sub": 2, "mul": 2, "div": 2,
    "neg": 1, "exp": 1, "sigmoid": 1, "tanh": 1, "relu": 1,
}


def test_the_table_holds_the_ops_of_version_1_with_their_arity():
    assert {name: spec.arity for name, spec in OPS.items()} == CONTRACT_ARITY
    assert all(spec.name == name for name, spec in OPS.items())


def test_kinds():
    assert SOURCE_OPS == {"input", "state", "weight", "const"}
    assert OPS["matmul"].kind == "matmul" and OPS["matmul"].is_matmul
    assert all(sum((s.is_source, s.is_matmul, s.is_elementwise)) == 1 for s in OPS.values())
    assert ELEMENTWISE_OPS == set(CASES)


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
    assert spec.torch and spec.torch.isidentifier()
    assert spec.symbol in (None, "+", "-", "*", "/")
    assert spec.random is not None and len(spec.random.args) == spec.arity
    assert spec.random.bound(*([1.0] * spec.arity)) >= 0.0
