"""The backward Plan of a 16-bit forward plan, emulated by the numpy executor (every 16-bit store and GEMM
operand rounded as on the GPU): the gradients of x, the initial states and every parameter against the
float64 reference, within the precision's bound (precision.gradient_tolerance), for every template under
the rungs whose plans differ most (`naive` stores every node's value, `graph` fuses, `tensor` runs one
persistent launch a layer and keeps its GEMM operands float32)."""

from __future__ import annotations

import pytest
from gradient_runs import make_run, sixteen_bit_error
from random_cells import random_cell
from tiers import slow_where

from cellfuse.codegen.precision import UNIT, gradient_tolerance
from cellfuse.graph_model import Sizes, load_template, template_names
from cellfuse.graph_model.builder import CellBuilder, apply

SIZES = Sizes(seq=20, batch=8, input=32, hidden=32, layers=1)
KINKS = 64  # IndRNN in bf16, units: see precision.GRADIENT_BOUND_UNITS


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("schedule", ["naive", "graph", "tensor"])
@pytest.mark.parametrize("name", template_names())
@pytest.mark.parametrize("layers", slow_where([1, 2], lambda layers: layers == 2))
def test_16_bit_gradients_of_every_template_are_within_the_precisions_bound(name, schedule, precision,
                                                                             layers):
    run = make_run(load_template(name), layers, scale=1.0, initial=False, sizes=SIZES)
    error, where = sixteen_bit_error(run.numpy(schedule, precision=precision), run.reference())
    kinks = (name, precision) == ("indrnn", "bf16")
    bound = KINKS * UNIT[precision] if kinks else gradient_tolerance(precision)
    units = error / UNIT[precision]
    assert error <= bound, f"{name} {schedule} {precision}: d{where} off by {units:.1f} units"
    # and not float32's: the run did round (a plan that stored nothing in 16 bits would be ~1e-7 off)
    assert error > 1e-2 * UNIT[precision]


@pytest.mark.parametrize("seed, schedule", [(28, "graph"), (59, "tensor")])
def test_a_weight_multiplied_in_both_types_gets_both_gemms_gradients(seed, schedule):
    """A random cell whose weight one GEMM multiplies by a float32 operand and another by a 16-bit one,
    the second through a 16-bit copy of it (precision._sixteen_bit_weight_copies): the parameter's
    gradient is the sum of both, within the bound like every other."""
    run = make_run(random_cell(seed), 1, scale=1.0, initial=False, sizes=SIZES)
    error, where = sixteen_bit_error(run.numpy(schedule, precision="bf16"), run.reference())
    assert error <= gradient_tolerance("bf16"), f"d{where} off by {error / UNIT['bf16']:.1f} units"



def _two_slices_cell():
    """x @ W0 and x @ W1 (one GEMM, one float32 output, of hidden and input columns), each multiplied again
    outside the loop: two GEMMs over two slices of one float32 buffer, each through a 16-bit copy of its
    own slice."""
    b = CellBuilder("two_slices")
    x, h = b.input("x"), b.state("h")
    a = (x @ b.weight("W0", "input", "hidden")).named("a")
    c = (x @ b.weight("W1", "input", "input")).named("c")
    total = a @ b.weight("W2", "hidden", "hidden") + c @ b.weight("W3", "input", "hidden")
    h_new = apply("tanh", total + h @ b.weight("U", "hidden", "hidden")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


@pytest.mark.parametrize("schedule", ["graph", "tensor"])
@pytest.mark.parametrize("inputs", [4, 8])
def test_gemms_over_two_slices_of_a_float32_output_multiply_copies_of_their_own(schedule, inputs):
    """Each slice's 16-bit copy is a buffer of its own (precision.sixteen_bit_copy names its columns), and
    each GEMM's gradient of its slice goes back into that slice's columns (slices of two widths, and of
    one)."""
    sizes = Sizes(seq=12, batch=3, input=inputs, hidden=8, layers=1)
    run = make_run(_two_slices_cell(), 1, scale=1.0, initial=False, sizes=sizes)
    error, where = sixteen_bit_error(run.numpy(schedule, precision="bf16"), run.reference())
    assert error <= gradient_tolerance("bf16"), f"d{where} off by {error / UNIT['bf16']:.1f} units"

def test_the_bound_fails_a_backward_pass_that_loses_a_gradients_term():
    """The check can fail: half of one parameter's gradient lost is far outside the bound."""
    run = make_run(load_template("lstm"), 1, scale=1.0, initial=False, sizes=SIZES)
    got = run.numpy("graph", precision="bf16")
    got.dparams["l0.U_i"][: SIZES.hidden // 2] = 0.0
    error, where = sixteen_bit_error(got, run.reference())
    assert error > gradient_tolerance("bf16") and where == "l0.U_i"
