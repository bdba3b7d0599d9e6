"""CellRNN on the CPU: its outputs and gradients equal the float64 reference's and those of the cell in
eager PyTorch, for every template, 1 and 2 layers, with and without initial states, on every schedule;
torch.autograd.gradcheck passes on small float64 cases of every template the backward pass plans."""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from cell_rnn_runs import eager_run, given_states, module_for, module_run
from gradient_runs import assert_gradients, make_run
from tiers import slow_where

from cellfuse.codegen import SCHEDULES, make_plan
from cellfuse.codegen.backward_plan import backward_plan
from cellfuse.graph_model import CellError, Sizes, analyze, load_template, run_reference, template_names
from cellfuse.nn import CellRNN

SMALL = Sizes(seq=3, batch=2, input=3, hidden=3)


def backward_refusal(name: str) -> str | None:
    """Why the backward Plan refuses a template (a row reduction may have no plan), or None."""
    try:
        backward_plan(make_plan(load_template(name), replace(SMALL, input=SMALL.hidden), "graph",
                                save_steps=True))
    except CellError as e:
        return str(e)
    return None


TRAINABLE = [name for name in template_names() if backward_refusal(name) is None]


def test_the_templates_trained_below_include_the_classic_cells():
    assert {"lstm", "gru", "gru_cho", "elman", "peephole_lstm"} <= set(TRAINABLE)


@pytest.mark.parametrize("name", template_names())
def test_a_template_is_refused_at_construction_exactly_where_its_backward_pass_has_no_plan(name):
    why = backward_refusal(name)
    if why is None:
        assert CellRNN(name, 4, 4).keys
        return
    with pytest.raises(CellError, match=f"cell '.*' cannot be trained as a CellRNN: {re.escape(why)}"):
        CellRNN(name, 4, 4)


def test_a_cell_whose_backward_pass_has_no_plan_is_refused_with_the_node_at_fault(monkeypatch):
    def refuse(forward):
        raise CellError("node 'mean_xi' (kernel k0): op 'row_mean' has no derivative in the op table")

    monkeypatch.setattr("cellfuse.nn.cell_rnn.backward_plan", refuse)
    with pytest.raises(CellError, match="cell 'LSTM' cannot be trained as a CellRNN: node 'mean_xi'"):
        CellRNN("lstm", 4, 4)


@pytest.mark.parametrize("name", TRAINABLE)
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("initial", [True, False])
def test_outputs_and_gradients_equal_the_reference_and_eager_pytorch(name, layers, initial):
    run = make_run(load_template(name), layers, seed=layers, initial=initial)
    y, final, got = module_run(module_for(run), run)
    ref = run_reference(run.cell, run.params, {"x": run.x, **(run.initial or {})}, layers)
    np.testing.assert_allclose(y, ref.y, rtol=1e-5, atol=1e-6)
    for s, v in ref.final.items():
        np.testing.assert_allclose(final[s], v, rtol=1e-5, atol=1e-6, err_msg=f"final {s}")
    assert_gradients(got, given_states(run, run.reference()), 1e-9, name)
    eager_y, eager_final, eager = eager_run(run)
    np.testing.assert_allclose(y, eager_y, rtol=1e-12, atol=1e-12)
    for s, v in eager_final.items():
        np.testing.assert_allclose(final[s], v, rtol=1e-12, atol=1e-12, err_msg=f"final {s}")
    assert_gradients(got, eager, 1e-9, f"{name} against eager PyTorch")


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("name", ["lstm", "gru_cho", "residual_lstm"])
def test_every_schedule_gives_the_reference_gradients(name, schedule):
    run = make_run(load_template(name), 2, seed=5)
    _, _, got = module_run(module_for(run, schedule), run)
    assert_gradients(got, run.reference(), 1e-9, f"{name} {schedule}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float32_and_float64_on_the_cpu(dtype):
    run = make_run(load_template("gru"), 2, seed=2, scale=1.0)
    _, _, got = module_run(module_for(run, dtype=dtype), run)
    assert got.dx.dtype == np.float64  # compared in float64, computed in the module's dtype
    assert_gradients(got, run.reference(), 1e-4 if dtype == torch.float32 else 1e-9, str(dtype))


def _gradcheck_case(name: str, layers: int):
    """A CellRNN in float64 and the inputs of a function of x, the initial states and every parameter
    (passed in by torch.func.functional_call, so that gradcheck can perturb them)."""
    cell = load_template(name)
    sizes = replace(SMALL, input=SMALL.hidden) if analyze(cell).ties else SMALL
    rnn = CellRNN(cell, sizes.input, sizes.hidden, layers, seed=layers).double()
    gen = torch.Generator().manual_seed(layers)
    x = torch.randn(sizes.seq, sizes.batch, sizes.input, dtype=torch.float64, generator=gen,
                    requires_grad=True)
    states = [torch.randn(layers, sizes.batch, sizes.hidden, dtype=torch.float64, generator=gen,
                          requires_grad=True) for _ in rnn.state_ids]
    params = [rnn.param(key).detach().clone().requires_grad_() for key in rnn.keys]
    names = [name for name, _ in rnn.named_parameters()]

    def f(x, *tensors):
        initial = dict(zip(rnn.state_ids, tensors[:len(states)], strict=True))
        swapped = dict(zip(names, tensors[len(states):], strict=True))
        y, final = torch.func.functional_call(rnn, swapped, (x, initial))
        return (y, *final.values())

    return f, (x, *states, *params)


# The default tier: one layer of four cells unlike each other (stacked gates, a GEMM on a value of the
# step, row reductions, no recurrent GEMM).
@pytest.mark.parametrize("name", slow_where(TRAINABLE, lambda name: name not in ("lstm", "gru_cho",
                                                                             "layernorm_lstm", "sru")))
@pytest.mark.parametrize("layers", slow_where([1, 2], lambda layers: layers == 2))
def test_gradcheck(name, layers):
    f, inputs = _gradcheck_case(name, layers)
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_sees_a_wrong_gradient(monkeypatch):
    """gradcheck above would fail on a backward pass that is off: a gradient of x scaled by 1.001."""
    from torch.autograd.gradcheck import GradcheckError

    from cellfuse.nn.tensor_layout import TensorLayout

    gradients = TensorLayout.gradients

    def off(self, views, input_grad=True):
        dx, dinitial, dparams = gradients(self, views, input_grad)
        return dx * 1.001, dinitial, dparams

    monkeypatch.setattr(TensorLayout, "gradients", off)
    f, inputs = _gradcheck_case("lstm", 1)
    with pytest.raises(GradcheckError):
        torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_two_forward_passes_before_one_backward():
    """The second forward run overwrites the first's saved steps in the runner's buffers: the backward
    pass of the first runs its forward again, and each gets its own gradients."""
    rnn = CellRNN("lstm", 4, 3, 2, seed=1).double()
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(5, 2, 4, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2)]
    w = rnn.param("l0.W_i")
    separate = []
    for x in xs:
        y, final = rnn(x)
        separate.append(torch.autograd.grad((y ** 2).sum() + final["c"].sum(), [x, w]))
    outs = [rnn(x) for x in xs]  # both forward runs first
    loss = sum((y ** 2).sum() + final["c"].sum() for y, final in outs)
    dx0, dx1, dw = torch.autograd.grad(loss, [*xs, w])
    torch.testing.assert_close(dx0, separate[0][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx1, separate[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dw, separate[0][1] + separate[1][1], rtol=1e-12, atol=1e-12)


def test_a_few_optimizer_steps_lower_the_loss_as_eager_pytorch_does():
    """Training: the same SGD steps on CellRNN and on the cell in eager PyTorch give the same losses."""
    run = make_run(load_template("gru_cho"), 2, seed=4, scale=1.0)
    target = torch.tensor(run.dy)
    rnn = module_for(run)
    optimizer = torch.optim.SGD(rnn.parameters(), lr=0.1)
    x = torch.tensor(run.x)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        y, _ = rnn(x)
        loss = ((y - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    eager_losses = _eager_sgd(run, x, target, steps=5)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-10)
    assert losses[-1] < losses[0]


def _eager_sgd(run, x, target, steps: int) -> list[float]:
    from cellfuse.gpu_runtime.torch_baselines import make_step
    from cellfuse.graph_model import param_key

    cell, s = run.cell, run.sizes
    params = {k: torch.tensor(v, requires_grad=True) for k, v in run.params.items()}
    optimizer = torch.optim.SGD(params.values(), lr=0.1)
    step = make_step(cell)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        seq = x
        for layer in range(s.layers):
            weights = {w.id: params[param_key(layer, w.id)] for w in cell.of_op("weight")}
            states = tuple(torch.zeros(s.batch, s.hidden, dtype=torch.float64) for _ in cell.updates)
            ys = []
            for t in range(s.seq):
                out, states = step(seq[t], states, weights)
                ys.append(out)
            seq = torch.stack(ys)
        loss = ((seq - target) ** 2).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_a_final_state_no_loss_reads_adds_no_seed(monkeypatch):
    """A loss of y alone hands the backward pass no seed for the final states (None, not zeros: no
    allocation, fill or addition for them), one of y and c a seed for c alone; the gradients are those
    of the same loss through y and through zeros added to the unread states."""
    from cellfuse.nn.runners import NumpyRunner

    seeds = []
    original = NumpyRunner.backward

    def recording(self, dy, dfinals, *args):
        seeds.append([None if d is None else tuple(d.shape) for d in dfinals])
        return original(self, dy, dfinals, *args)

    monkeypatch.setattr(NumpyRunner, "backward", recording)
    rnn = CellRNN("lstm", 4, 3, 2, seed=1).double()
    x = torch.randn(5, 2, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0),
                    requires_grad=True)
    y, final = rnn(x)
    (dx_y,) = torch.autograd.grad((y ** 2).sum(), [x])
    y, final = rnn(x)
    (dx_c,) = torch.autograd.grad((y ** 2).sum() + final["c"].sum(), [x])
    y, final = rnn(x)
    (dx_all,) = torch.autograd.grad((y ** 2).sum() + final["c"].sum() + 0 * final["h"].sum(), [x])
    assert seeds == [[None, None], [None, (2, 2, 3)], [(2, 2, 3), (2, 2, 3)]]
    torch.testing.assert_close(dx_c, dx_all, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(dx_y, dx_c)
