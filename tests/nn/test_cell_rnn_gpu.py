"""CellRNN on CUDA tensors, float32: outputs and gradients against the float64 reference and the cell in
eager PyTorch (relative error below 1e-4), on torch's current stream whichever it is, and a few
optimizer steps giving the losses they give on the CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cell_rnn_runs import eager_run, given_states, module_for, module_run
from gradient_runs import assert_gradients, make_run

from cellfuse.graph_model import CellError, Sizes, load_template, run_reference
from cellfuse.nn import CellRNN, ops
from cellfuse.nn.cuda_runner import BACKWARD_NO_DX

pytestmark = pytest.mark.gpu

SIZES = Sizes(seq=7, batch=5, input=24, hidden=40)
RTOL = 1e-4


def assert_outputs(y, final, want_y, want_final, what: str) -> None:
    scale = float(np.max(np.abs(want_y)))
    np.testing.assert_allclose(y, want_y, rtol=RTOL, atol=RTOL * scale, err_msg=f"{what} y")
    for s, v in want_final.items():
        np.testing.assert_allclose(final[s], v, rtol=RTOL, atol=RTOL * float(np.max(np.abs(v))),
                                   err_msg=f"{what} final {s}")


@pytest.mark.parametrize("schedule", ["hoisted", "graph", "persistent", "wavefront", "auto"])
@pytest.mark.parametrize("name", ["lstm", "gru", "gru_cho"])
@pytest.mark.parametrize("layers, initial", [(1, True), (2, True), (2, False)])
def test_outputs_and_gradients_on_the_gpu(cuda, name, schedule, layers, initial):
    run = make_run(load_template(name), layers, seed=layers, initial=initial, sizes=SIZES, scale=1.0)
    rnn = module_for(run, schedule, torch.float32, str(cuda))
    y, final, got = module_run(rnn, run)
    what = f"{name} {schedule} {layers} layer(s)"
    ref = run_reference(run.cell, run.params, {"x": run.x, **(run.initial or {})}, layers)
    assert_outputs(y, final, ref.y, ref.final, what)
    assert_gradients(got, given_states(run, run.reference()), RTOL, what)
    eager_y, eager_final, eager = eager_run(run)
    assert_outputs(y, final, eager_y, eager_final, f"{what} against eager PyTorch")
    assert_gradients(got, eager, RTOL, f"{what} against eager PyTorch")


def test_on_a_stream_of_torchs_own(cuda):
    """The kernels run on torch's current stream, whichever it is: the same results on a side stream,
    with the inputs made and the results read there without a synchronize."""
    run = make_run(load_template("lstm"), 2, seed=3, sizes=SIZES, scale=1.0)
    rnn = module_for(run, "graph", torch.float32, str(cuda))
    want_y, want_final, want = module_run(rnn, run)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.cuda.stream(side):
        y, final, got = module_run(rnn, run)
    torch.cuda.synchronize(cuda)
    np.testing.assert_array_equal(y, want_y)
    assert_gradients(got, want, 1e-6, "side stream")


def test_two_forward_passes_before_one_backward_on_the_gpu(cuda):
    rnn = CellRNN("gru_cho", 24, 40, 2, seed=1).to(cuda)
    xs = [torch.randn(7, 5, 24, device=cuda, requires_grad=True) for _ in range(2)]
    separate = [torch.autograd.grad(rnn(x)[0].square().sum(), x)[0] for x in xs]
    outs = [rnn(x)[0] for x in xs]
    together = torch.autograd.grad(sum(y.square().sum() for y in outs), xs)
    for a, b in zip(together, separate, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("schedule", ["naive", "graph", "persistent", "tensor"])
def test_an_input_that_needs_no_gradient_gets_none_and_the_same_parameter_gradients(cuda, schedule):
    """Where x needs no gradient, the backward pass leaves dx's GEMMs out (BackwardPlan.without_input_grad);
    the parameters' and the initial states' gradients are those of the whole pass, to the bit."""
    rnn = CellRNN("lstm", 24, 40, 2, schedule=schedule, seed=2).to(cuda)
    x = torch.randn(7, 5, 24, device=cuda)
    h0 = torch.randn(2, 5, 40, device=cuda, requires_grad=True)
    grads = {}
    for needs in (True, False):
        rnn.zero_grad(set_to_none=True)
        h0.grad = None
        given = x.clone().requires_grad_(needs)
        rnn(given, {"h": h0})[0].square().sum().backward()
        grads[needs] = {"h0": h0.grad, **{name: p.grad for name, p in rnn.named_parameters()}}
        assert (given.grad is not None) == needs
    for name, want in grads[True].items():
        torch.testing.assert_close(grads[False][name], want, rtol=0, atol=0, msg=name)
    runner = ops.runner(rnn._cell_text, x, 40, 2, schedule)  # (the one the calls ran)
    assert BACKWARD_NO_DX in runner._programs


@pytest.mark.parametrize("schedule", ["graph", "tensor"])
def test_each_parameters_gradient_comes_from_the_gathering_kernel(cuda, schedule, monkeypatch):
    """The gathering kernel writes each parameter's gradient in a tensor of its own: the grouped tensors
    and their views (TensorLayout.param_gradients) are not made, and the gradients are those of the
    reference."""
    from cellfuse.nn.tensor_layout import TensorLayout

    def grouped(*args):
        raise AssertionError("the gradients were made from grouped ones")

    monkeypatch.setattr(TensorLayout, "param_gradients", grouped)
    run = make_run(load_template("gru_cho"), 2, seed=4, sizes=SIZES, scale=1.0)
    rnn = module_for(run, schedule, torch.float32, str(cuda))
    for _ in range(2):  # (the second call's kernel is the one the first made)
        y, final, got = module_run(rnn, run)
        ref = run_reference(run.cell, run.params, {"x": run.x, **(run.initial or {})}, 2)
        assert_outputs(y, final, ref.y, ref.final, schedule)
        assert_gradients(got, given_states(run, run.reference()), RTOL, schedule)


def test_a_few_optimizer_steps_give_the_losses_of_the_cpu(cuda):
    losses = {}
    for device in ("cpu", cuda):
        torch.manual_seed(0)
        rnn = CellRNN("lstm", 24, 40, 2, seed=7).to(device)
        head = torch.nn.Linear(40, 3).to(device)
        optimizer = torch.optim.AdamW([*rnn.parameters(), *head.parameters()], lr=1e-2)
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(7, 5, 24, generator=gen).to(device)
        target = torch.randint(0, 3, (7 * 5,), generator=gen).to(device)
        losses[str(device)] = []
        for _ in range(5):
            optimizer.zero_grad()
            y, _ = rnn(x)
            loss = torch.nn.functional.cross_entropy(head(y).reshape(-1, 3), target)
            loss.backward()
            optimizer.step()
            losses[str(device)].append(loss.item())
    cpu, gpu = losses.pop("cpu"), losses.popitem()[1]
    np.testing.assert_allclose(gpu, cpu, rtol=1e-4)
    assert cpu[-1] < cpu[0]


def test_float64_and_a_module_on_another_device_are_refused_on_the_gpu(cuda):
    rnn = CellRNN("lstm", 4, 3)
    with pytest.raises(CellError, match=f"parameter 'l0.W_i' is torch.float32 on cpu, and x is torch.float32 "
                                        f"on {cuda}"):
        rnn(torch.randn(5, 2, 4, device=cuda))
    with pytest.raises(CellError, match="x has dtype torch.float64; on cuda CellRNN runs torch.float32, "
                                        "torch.bfloat16"):
        rnn.to(cuda, torch.float64)(torch.randn(5, 2, 4, device=cuda, dtype=torch.float64))


def test_the_backward_op_refuses_a_dy_unlike_its_forward_runs_y(cuda):
    """The backward run copies dy in as its bytes: a dy of another type or shape, which the op can be
    given directly, is refused, naming both."""
    rnn = CellRNN("lstm", 4, 3).to(cuda)
    x = torch.randn(5, 2, 4, device=cuda)
    params = [rnn.param(k) for k in rnn.keys]
    zeros = [torch.zeros(1, 2, 3, device=cuda)] * 2
    y, *finals, reserve = torch.ops.cellfuse.rnn(x, zeros, params, rnn._cell_text, 3, 1, "graph", True, 0, "")

    def backward(dy):
        return torch.ops.cellfuse.rnn_backward(dy, zeros, x, zeros, params, y, reserve, rnn._cell_text, 3, 1,
                                               "graph", 0, True)

    for dy in (torch.ones_like(y, dtype=torch.bfloat16), torch.ones(5, 2, 2, device=cuda)):
        with pytest.raises(CellError, match=r"given dy torch\.\w+ \[5, 2, \d\], and its forward run made y "
                                            r"torch\.float32 \[5, 2, 3\]"):
            backward(dy)
    assert torch.isfinite(backward(torch.ones_like(y))[0]).all()


@pytest.mark.parametrize("train", [False, True])
def test_threads_whose_runs_share_a_persistent_kernel_take_turns(cuda, train):
    """Modules at two sequence lengths share one loaded persistent kernel (its exchange arrays): threads
    that call them at once, each on a stream of its own, forward or forward and backward, get the results
    of the same calls made one at a time."""
    import threading

    rnn = CellRNN("lstm", 32, 48, 1, schedule="persistent", seed=2).to(cuda)
    xs = [torch.randn(seq, 4, 32, device=cuda) for seq in (20, 24, 20, 24)]

    def call(x):
        if not train:
            with torch.no_grad():
                return [rnn(x)[0]]
        x = x.clone().requires_grad_()
        y, _ = rnn(x)
        return [y.detach(), *torch.autograd.grad(y.pow(2).sum(), [x])]

    want = [call(x) for x in xs]
    torch.cuda.synchronize()
    wrong: list[int] = []
    failed: list[BaseException] = []

    def work(i: int) -> None:
        try:
            stream = torch.cuda.Stream(cuda)
            with torch.cuda.stream(stream):
                for _ in range(20):
                    # (close, not equal: cuBLAS may sum a GEMM's parts in another order on another stream)
                    if not all(torch.allclose(a, b, rtol=1e-5, atol=1e-6)
                               for a, b in zip(call(xs[i]), want[i], strict=True)):
                        wrong.append(i)
            stream.synchronize()
        except BaseException as e:  # (reported by the test's thread)
            failed.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    assert not wrong, f"{len(wrong)} calls of {20 * len(xs)} got another call's result"
