"""A run that passes within rounding of a kink, for the tests of `graph_model.kinks` and of the
benchmark's gradient check."""

from __future__ import annotations

import numpy as np

from cellfuse.graph_model import Sizes, init_params, load_template, record_forward

SIZES = Sizes(5, 3, 4, 6)
ROW, COL = 1, 2


def indrnn_at_a_kink(offset: float):
    """IndRNN with relu's argument `offset` from its kink at step 0, row ROW, column COL (h starts at 0,
    so there it is x W + b: b's column COL is set to make it so)."""
    cell = load_template("indrnn")
    params = init_params(cell, 1, SIZES.input, SIZES.hidden, 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((SIZES.seq, SIZES.batch, SIZES.input)).astype(np.float32)
    xw = x[0].astype(np.float64) @ params["l0.W"].astype(np.float64)
    params["l0.b"] = params["l0.b"].copy()
    params["l0.b"][COL] = np.float32(-xw[ROW, COL])
    inputs = {"x": x, "h": np.zeros((1, SIZES.batch, SIZES.hidden), np.float32)}
    tape = record_forward(cell, params, inputs, 1)
    # the argument as float64 computes it, moved to `offset` exactly
    tape.values[0][0]["a_b"][ROW, COL] = offset
    dy = rng.standard_normal((SIZES.seq, SIZES.batch, SIZES.hidden))
    return cell, params, x, inputs, tape, dy
