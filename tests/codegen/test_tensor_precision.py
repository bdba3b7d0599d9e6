"""The arithmetic of the `tensor` rung, emulated in numpy: each float32 product as three TF32 products
(a = a_hi + a_lo, with a_hi = a with its 13 low bits cleared, TF32's 10 bits of mantissa, and a_lo =
what it lost, exact in float32, of which the tensor cores read 10 bits of mantissa as well; then
a_lo b_hi + a_hi b_lo + a_hi b_hi, summed in float32), as the generated kernels do with `mma.sync`. It
is as accurate as float32's own products for the GEMMs of a step, where one TF32 product alone is not:
that is why the rung pays for three."""

from __future__ import annotations

import numpy as np
import pytest


def tf32(x: np.ndarray) -> np.ndarray:
    """float32 as the tensor cores read it as TF32: 10 explicit bits of mantissa, the 13 low bits left
    out (towards zero)."""
    return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def three_tf32(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    a_hi, w_hi = tf32(a), tf32(w)
    a_lo, w_lo = tf32(a - a_hi), tf32(w - w_hi)
    return (a_lo @ w_hi + a_hi @ w_lo) + a_hi @ w_hi  # float32 throughout: the small products first


def rel(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


def test_tf32_keeps_ten_bits_of_mantissa():
    x = np.float32([1.0, 1.0 + 2.0**-10, 1.0 + 2.0**-11 + 2.0**-12, -3.14159265, 1e-30, 3e38])
    got = tf32(x)
    assert got[0] == 1.0 and got[1] == 1.0 + 2.0**-10  # representable: kept
    assert got[2] == 1.0  # below a unit: towards zero
    assert got[3] == np.float32(-3.140625)  # towards zero for negative values too
    assert np.all(np.abs(got[3:] - x[3:]) <= np.abs(x[3:]) * 2.0**-10)
    assert np.all(got.view(np.uint32) & 0x1FFF == 0)
    split = np.float32([-3.14159265, 0.1, 7e-3])
    assert np.all(tf32(split) + (split - tf32(split)) == split)  # hi + lo is exact


@pytest.mark.parametrize("k", [512, 2048])
def test_three_tf32_products_are_as_accurate_as_float32_and_one_is_not(k):
    """The shapes of an LSTM step at hidden 512, forward (K = 512) and backward (K = 4H = 2048), with
    values like a step's: h in (-1, 1), weights of PyTorch's initial scale."""
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (64, k)).astype(np.float32)
    w = (rng.uniform(-1, 1, (k, 256)) / np.sqrt(512)).astype(np.float32)
    exact = a.astype(np.float64) @ w.astype(np.float64)
    fp32 = rel(a @ w, exact)
    assert rel(three_tf32(a, w), exact) < 4 * fp32 + 1e-7
    assert rel(three_tf32(a, w), exact) < 1e-5  # far inside the 1e-4 every schedule is checked at
    assert rel(tf32(a) @ tf32(w), exact) > 1e-4  # one TF32 product would fail that check
