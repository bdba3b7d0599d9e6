"""Kinks that a run passes within rounding of: found in the reference's tape, and the gradients along
their other branch, which a float32 run may rightly give."""

from __future__ import annotations

import numpy as np
from kink_cases import COL, ROW, SIZES, indrnn_at_a_kink

from cellfuse.graph_model import backward
from cellfuse.graph_model.kinks import KINK_ROUNDING, near_kinks, other_branch
from cellfuse.graph_model.ops import OPS


def test_every_op_whose_derivative_jumps_says_where():
    assert {name for name, op in OPS.items() if op.kink is not None} == {"relu", "abs", "max", "min"}
    assert OPS["max"].kink(np.array(2.0), np.array(3.5)) == -1.5
    assert OPS["relu"].kink(np.array(-1e-9)) == -1e-9


def test_a_kink_within_rounding_is_found_and_its_other_branch_changes_the_unit_s_gradients():
    _, _, _, _, tape, dy = indrnn_at_a_kink(3e-9)
    (kink,) = near_kinks(tape, 3)[:1]
    assert (kink.node, kink.op, kink.layer, kink.step, kink.index) == ("h_new", "relu", 0, 0, (ROW, COL))
    assert "relu 'h_new' at layer 0, step 0, row 1, column 2" in kink.text()
    ref, other = backward(tape, dy), backward(other_branch(tape, [kink]), dy)
    changed = np.abs(other.dparams["l0.b"] - ref.dparams["l0.b"]) > 1e-6
    assert changed[COL] and not changed[[c for c in range(SIZES.hidden) if c != COL]].any()
    assert np.array_equal(backward(tape, dy).dparams["l0.b"], ref.dparams["l0.b"])  # the tape is untouched


def test_a_kink_beyond_rounding_is_not_near():
    _, _, _, _, tape, _ = indrnn_at_a_kink(1e-3)
    assert all(k.index != (ROW, COL) or k.step != 0 for k in near_kinks(tape, 3))
    assert KINK_ROUNDING < 1e-5
