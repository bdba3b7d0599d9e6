"""The backward Plan of a 16-bit forward plan on the GPU: the gradients of every template under the rungs
that run 16 bits (`naive` stores every value rounded, `graph` fuses, `persistent` and `tensor` run the
reverse loop as one launch a layer), in bf16 and fp16, against the float64 reference within the
precision's bound, as the numpy executor's emulation is (test_numpy_backward_16_bit.py); and the LSTM and
GRU at hidden 512 and B=64, where cuBLAS multiplies the 16-bit gradients on tensor cores."""

from __future__ import annotations

import pytest
from gradient_runs import make_run, sixteen_bit_error

from cellfuse.codegen.precision import UNIT, gradient_tolerance
from cellfuse.graph_model import Sizes, load_template, template_names

pytestmark = pytest.mark.gpu

SIZES = Sizes(seq=20, batch=8, input=32, hidden=32, layers=1)
KINKS = 64  # IndRNN in bf16, units: see precision.GRADIENT_BOUND_UNITS


def _check(run, schedule: str, precision: str, kinks: bool = False) -> None:
    error, where = sixteen_bit_error(run.cuda(schedule, precision), run.reference())
    bound = KINKS * UNIT[precision] if kinks else gradient_tolerance(precision)
    units = error / UNIT[precision]
    assert error <= bound, f"{run.cell.name} {schedule} {precision}: d{where} off by {units:.1f} units"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("schedule", ["naive", "graph", "persistent", "tensor"])
@pytest.mark.parametrize("name", template_names())
def test_16_bit_gradients_of_every_template_on_the_gpu(gpu, name, schedule, precision):
    run = make_run(load_template(name), 2, scale=1.0, initial=False, sizes=SIZES)
    _check(run, schedule, precision, kinks=(name, precision) == ("indrnn", "bf16"))


@pytest.mark.parametrize("schedule", ["graph", "tensor"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_16_bit_gradients_at_hidden_512_on_the_gpu(gpu, name, schedule):
    run = make_run(load_template(name), 1, scale=1.0, initial=False,
                   sizes=Sizes(seq=10, batch=64, input=512, hidden=512, layers=1))
    _check(run, schedule, "bf16")
