"""cellfuse.nn in bfloat16 and float16: inputs of those dtypes (or float32 ones under torch.autocast) run
the plans of that precision, within the bound stated against the float64 reference, and give their results
back in the inputs' dtype; float32 parameters are packed into 16-bit weights; a training pass runs in the
precision too, its gradients within their bound. On the CPU (the precision emulated) and on the GPU."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from gradient_runs import sixteen_bit_error

from cellfuse.codegen.precision import UNIT, forward_tolerance, gradient_tolerance
from cellfuse.graph_model import CellError, Gradients, load_template, run_reference, run_reference_backward
from cellfuse.nn import GRU, LSTM, CellRNN, ops

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
T, B, INPUT, H = 12, 3, 16, 24


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return torch.device("cpu") if request.param == "cpu" else request.getfixturevalue("cuda")


def _error(got: torch.Tensor, want: np.ndarray) -> float:
    return float(np.abs(got.float().cpu().numpy() - want).max() / np.abs(want).max())


def _reference(rnn: CellRNN, x: torch.Tensor, states: dict | None = None):
    params = {key: rnn.param(key).detach().float().cpu().numpy() for key in rnn.keys}
    inputs = {"x": x.float().cpu().numpy()}
    if states:
        inputs.update({s: v.float().cpu().numpy() for s, v in states.items()})
    return run_reference(load_template(rnn.cell.name.lower()), params, inputs, rnn.num_layers)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_16_bit_inputs_run_in_their_precision_within_the_bound(device, name, precision):
    dtype = DTYPES[precision]
    rnn = CellRNN(name, INPUT, H, 2, seed=1).to(device)  # float32 parameters, as under autocast
    x = torch.randn(T, B, INPUT, device=device).to(dtype)
    states = {"h": (0.5 * torch.randn(2, B, H, device=device)).to(dtype)}
    with torch.no_grad():
        y, finals = rnn(x, states)
        y32, _ = rnn(x.float(), {"h": states["h"].float()})
    ref = _reference(rnn, x, states)
    assert y.dtype == dtype and all(f.dtype == dtype for f in finals.values())
    assert _error(y, ref.y) < forward_tolerance(precision)
    for s, value in finals.items():
        assert _error(value, ref.final[s]) < forward_tolerance(precision), s
    assert (y.float() - y32).abs().max() > 1e-5  # not float32's result


def test_under_autocast_float32_inputs_run_in_its_dtype(device):
    rnn = CellRNN("lstm", INPUT, H, 1, seed=2).to(device)
    x = torch.randn(T, B, INPUT, device=device)
    with torch.no_grad():
        want, _ = rnn(x.bfloat16())
        with torch.autocast(device.type, dtype=torch.bfloat16):
            got, finals = rnn(x)
    assert got.dtype == torch.bfloat16 and finals["c"].dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    lstm = LSTM(INPUT, H, batch_first=True).to(device)
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16):
        out, (h, c) = lstm(x.transpose(0, 1))
    assert out.dtype == h.dtype == c.dtype == torch.float16


def test_modules_in_16_bits_and_the_drop_ins_match_torch_within_the_bound(device):
    for cls, torch_cls in ((LSTM, torch.nn.LSTM), (GRU, torch.nn.GRU)):
        ours = cls(INPUT, H, num_layers=2).to(device)
        ref = torch_cls(INPUT, H, num_layers=2).to(device).double()
        ref.load_state_dict(ours.state_dict())
        ours = ours.to(torch.bfloat16)  # parameters in bfloat16 too
        x = torch.randn(T, B, INPUT, device=device)
        with torch.no_grad():
            got, _ = ours(x.bfloat16())
            want, _ = ref(x.bfloat16().double())
        assert got.dtype == torch.bfloat16
        error = float((got.double() - want).abs().max() / want.abs().max())
        assert error < forward_tolerance("bf16"), f"{cls.__name__}: {error:.2e}"


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("name", ["lstm", "gru"])
def test_a_16_bit_training_pass_runs_in_its_precision_within_the_gradients_bound(device, name, precision):
    """x, y and the initial states' gradients in the 16-bit dtype, the parameters' float32 (as under
    torch.autocast), every gradient within the bound of 16-bit gradients against the float64 reference,
    and rounded (not a float32 pass's)."""
    dtype = DTYPES[precision]
    rnn = CellRNN(name, INPUT, H, 2, seed=3).to(device)
    x = torch.randn(T, B, INPUT, device=device).to(dtype).requires_grad_()
    initial = {s: torch.zeros(2, B, H, device=device, dtype=dtype, requires_grad=True) for s in rnn.state_ids}
    dy = torch.randn(T, B, H, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no pass in float32 instead)
        y, _ = rnn(x, initial)
    assert y.dtype == dtype
    (y.float() * dy).sum().backward()
    assert x.grad.dtype == dtype and all(v.grad.dtype == dtype for v in initial.values())
    assert all(rnn.param(key).grad.dtype == torch.float32 for key in rnn.keys)
    params = {key: rnn.param(key).detach().double().cpu().numpy() for key in rnn.keys}
    inputs = {"x": x.detach().double().cpu().numpy(),
              **{s: v.detach().double().cpu().numpy() for s, v in initial.items()}}
    want = run_reference_backward(load_template(name), params, inputs, 2, dy.double().cpu().numpy())
    got = Gradients(x.grad.double().cpu().numpy(),
                    {s: v.grad.double().cpu().numpy() for s, v in initial.items()},
                    {key: rnn.param(key).grad.double().cpu().numpy() for key in rnn.keys})
    error, where = sixteen_bit_error(got, want)
    assert 1e-2 * UNIT[precision] < error <= gradient_tolerance(precision), f"d{where}: {error:.2e}"


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["graph", "tensor"])
def test_a_16_bit_training_call_converts_the_states_and_y_in_its_run(cuda, schedule):
    """A training call whose plan keeps some of what the caller gives and takes in x's type in float32
    (the LSTM's c; on the tensor rung h and y's sequence too) converts them inside its run: the initial
    states given (not zeros) are read, y and the final states come back in x's type, dy goes in and dx
    and the states' gradients come back in it, each within its bound of the float64 reference, and a
    second call (a replay of the captured run) gives the same gradients."""
    rnn = CellRNN("lstm", INPUT, H, 1, seed=5, schedule=schedule).to(cuda)
    x = torch.randn(T, B, INPUT, device=cuda).bfloat16()
    states = {s: (0.5 * torch.randn(1, B, H, device=cuda)).bfloat16() for s in rnn.state_ids}
    dy = torch.randn(T, B, H, device=cuda)
    ref = _reference(rnn, x, states)
    params = {key: rnn.param(key).detach().double().cpu().numpy() for key in rnn.keys}
    inputs = {"x": x.double().cpu().numpy(), **{s: v.double().cpu().numpy() for s, v in states.items()}}
    want = run_reference_backward(load_template("lstm"), params, inputs, 1, dy.double().cpu().numpy())
    grads = []
    for _ in range(2):
        xg = x.clone().requires_grad_()
        given = {s: v.clone().requires_grad_() for s, v in states.items()}
        rnn.zero_grad(set_to_none=True)
        y, finals = rnn(xg, given)
        assert y.dtype == torch.bfloat16 and all(f.dtype == torch.bfloat16 for f in finals.values())
        assert _error(y.detach(), ref.y) < forward_tolerance("bf16")
        for s, value in finals.items():
            assert _error(value.detach(), ref.final[s]) < forward_tolerance("bf16"), s
        (y.float() * dy).sum().backward()
        assert xg.grad.dtype == torch.bfloat16 and all(v.grad.dtype == torch.bfloat16 for v in given.values())
        got = Gradients(xg.grad.double().cpu().numpy(),
                        {s: v.grad.double().cpu().numpy() for s, v in given.items()},
                        {key: rnn.param(key).grad.double().cpu().numpy() for key in rnn.keys})
        error, where = sixteen_bit_error(got, want)
        assert error <= gradient_tolerance("bf16"), f"d{where}: {error:.2e}"
        grads.append([xg.grad, *(v.grad for v in given.values())])
    for first, second in zip(*grads, strict=True):
        torch.testing.assert_close(first, second, rtol=0, atol=0)


@pytest.mark.parametrize("float32_states", [None, ()])
def test_lengths_past_256_steps_stay_exact_in_16_bits(device, float32_states):
    """The steps left of each row are counted in float32 (bfloat16 holds whole numbers exactly only up to
    256), whichever states the module keeps in float32: rows of 299 and 300 steps stop at their own."""
    rnn = CellRNN("lstm", 4, 8, 1, seed=4, float32_states=float32_states).to(device)
    x = torch.randn(300, 2, 4, device=device).bfloat16()
    with torch.no_grad():
        y, finals = rnn(x, lengths=[299, 300])
        short, short_finals = rnn(x[:299, :1])
    assert float(y[299, 0].float().abs().max()) == 0.0 and float(y[299, 1].float().abs().max()) > 0.0
    torch.testing.assert_close(y[:299, :1], short, rtol=0, atol=0)
    torch.testing.assert_close(finals["c"][:, :1], short_finals["c"], rtol=0, atol=0)


def test_the_states_kept_float32_can_be_named(device):
    """By default a 16-bit plan keeps the states that accumulate in float32 (the LSTM's c); a module may
    name others, or none. Each result stays within the bound; keeping c in bfloat16 changes it. (On the
    rung 'graph': the persistent rungs keep their GEMMs' left operands, h here, in float32 besides.)"""
    x = torch.randn(T, B, INPUT, device=device).bfloat16()
    results, kept = {}, {}
    for states in (None, ("c", "h"), ()):
        rnn = CellRNN("lstm", INPUT, H, 2, seed=5, float32_states=states, schedule="graph").to(device)
        with torch.no_grad():
            y, _ = rnn(x)
        assert _error(y, _reference(rnn, x).y) < forward_tolerance("bf16"), states
        plans = ops.plans(rnn._cell_text, T, B, INPUT, H, 2, rnn.schedule, x.device, precision="bf16",
                          float32=rnn._float32)
        buffers = plans.forward.buffers
        kept[states] = {s for s in rnn.state_ids if buffers[f"init.{s}"].dtype.name == "float32"}
        results[states] = y
    assert kept[None] == {"c"} and kept["c", "h"] == {"c", "h"} and kept[()] == set()
    assert (results[None].float() - results[()].float()).abs().max() > 0
    with pytest.raises(CellError, match="float32_states: 'n' not a state of cell 'LSTM'"):
        CellRNN("lstm", INPUT, H, float32_states=["c", "n"])
    with pytest.raises(TypeError, match=r"write \['c'\] for one"):
        CellRNN("lstm", INPUT, H, float32_states="c")


def test_float32_states_change_nothing_in_float32():
    """A float32 pass keeps every state float32: naming float32 states makes no runner of its own (an
    inference call and a training step share one)."""
    rnn = CellRNN("lstm", INPUT, H, 1, seed=9, float32_states=())
    x = torch.randn(T, B, INPUT)
    with torch.no_grad():
        rnn(x)
    rnn(x)[0].sum().backward()
    # (cell, T, B, input, hidden, layers, schedule, dtype, device, direction, float32)
    ours = (rnn._cell_text, T, B, INPUT, H, 1, rnn.schedule, torch.float32)
    assert len([key for key in ops._runners if key[:8] == ours]) == 1


def test_16_bit_calls_run_under_inference_mode(device):
    """Inference tensors keep no version counter: a state kept float32 is converted without asking one."""
    rnn = CellRNN("lstm", INPUT, H, 1, seed=8).to(device)
    x = torch.randn(T, B, INPUT, device=device).bfloat16()
    with torch.no_grad():
        want, _ = rnn(x)
    with torch.inference_mode():
        got, finals = rnn(x, {"c": torch.zeros(1, B, H, device=device).bfloat16()})
        again, _ = rnn(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(again, want, rtol=0, atol=0)


def test_what_16_bit_inputs_refuse(device):
    rnn = CellRNN("lstm", INPUT, H, 1, seed=5).to(device).to(torch.bfloat16)
    with pytest.raises(CellError, match="parameter 'l0.W_i' is torch.bfloat16 .* and x is torch.float32"):
        rnn(torch.randn(T, B, INPUT, device=device))
    wide = CellRNN("lstm", INPUT, 2048, 1, seed=5, schedule="tensor").to(device)
    with torch.no_grad(), pytest.raises(CellError, match="the weights of gemm1 do not fit on chip"):
        wide(torch.randn(T, B, INPUT, device=device).half())


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["graph", "persistent"])
def test_a_captured_16_bit_forward_replays_on_new_inputs(cuda, schedule):
    """New x and a new initial c (a state the plan keeps float32, converted by the call) both reach the
    replay."""
    rnn = CellRNN("lstm", INPUT, H, 2, seed=6, schedule=schedule).to(cuda)
    static_x = torch.randn(T, B, INPUT, device=cuda).bfloat16()
    static_c = torch.zeros(2, B, H, device=cuda).bfloat16()
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            rnn(static_x, {"c": static_c})
    torch.cuda.current_stream(cuda).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y, static_final = rnn(static_x, {"c": static_c})
    new_x = torch.randn(T, B, INPUT, device=cuda).bfloat16()
    new_c = torch.randn(2, B, H, device=cuda).bfloat16()
    static_x.copy_(new_x)
    static_c.copy_(new_c)
    graph.replay()
    with torch.no_grad():
        want_y, want_final = rnn(new_x, {"c": new_c})
    torch.testing.assert_close(static_y, want_y, rtol=0, atol=0)
    torch.testing.assert_close(static_final["c"], want_final["c"], rtol=0, atol=0)


@pytest.mark.gpu
def test_an_initial_state_kept_float32_is_read_as_it_is_at_each_call(cuda):
    """The call converts a state the plan keeps float32 once per tensor and version: a state changed in
    place between calls is converted again."""
    rnn = CellRNN("lstm", INPUT, H, 1, seed=7, schedule="persistent").to(cuda)
    x = torch.randn(T, B, INPUT, device=cuda).bfloat16()
    c = torch.zeros(1, B, H, device=cuda).bfloat16()
    with torch.no_grad():
        first = rnn(x, {"c": c})[0]
        c.add_(0.5)  # the same tensor, at a new version
        second = rnn(x, {"c": c})[0]
        fresh = rnn(x, {"c": c.clone()})[0]
        zeros = rnn(x)[0]
    torch.testing.assert_close(second, fresh, rtol=0, atol=0)
    torch.testing.assert_close(first, zeros, rtol=0, atol=0)
    assert (first.float() - second.float()).abs().max() > 0


@pytest.mark.parametrize("float32_states", [None, ()])
def test_compiled_with_fullgraph_in_16_bits_matches_eager(device, float32_states):
    rnn = CellRNN("gru", INPUT, H, 1, seed=7, float32_states=float32_states).to(device)
    compiled = torch.compile(rnn, fullgraph=True, backend="aot_eager")
    x = torch.randn(T, B, INPUT, device=device).half()
    with torch.no_grad():
        want, _ = rnn(x)
        got, finals = compiled(x)
    assert got.dtype == finals["h"].dtype == torch.float16
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_training_pass_compiled_with_fullgraph_matches_eager(device, dtype):
    """torch.compile(fullgraph=True) of a 16-bit training pass: the ops' fake implementations give the
    dtypes the real ones do (x's gradient in x's dtype, the float32 parameters' in float32), and the
    compiled pass's gradients are eager's."""
    torch._dynamo.reset()
    rnn = CellRNN("lstm", INPUT, H, 1, seed=7).to(device)
    compiled = torch.compile(rnn, fullgraph=True, backend="aot_eager")
    x = torch.randn(T, B, INPUT, device=device).to(dtype)

    def gradients(module):
        given = x.clone().requires_grad_()
        y, _ = module(given)
        return torch.autograd.grad(y.float().square().mean(), [given, *rnn.parameters()])

    want, got = gradients(rnn), gradients(compiled)
    assert got[0].dtype == dtype and all(g.dtype == torch.float32 for g in got[1:])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
def test_a_captured_16_bit_training_step_replays(cuda):
    """A training step of bf16 x (the parameters float32, an optimizer's step in it) captured with
    torch.cuda.graph: each replay on new x gives the loss and the weights of the same steps run eagerly
    from the same start."""
    def model():
        torch.manual_seed(3)
        return CellRNN("lstm", INPUT, H, 1, seed=7, schedule="tensor").to(cuda)

    rnn, twin = model(), model()
    optimizer = torch.optim.SGD(rnn.parameters(), lr=0.1)
    static_x = torch.randn(T, B, INPUT, device=cuda).bfloat16()

    def step(module, x, opt):
        loss = module(x)[0].float().square().mean()
        loss.backward()
        opt.step()
        return loss

    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            step(rnn, static_x, optimizer)
    torch.cuda.current_stream(cuda).wait_stream(side)
    twin.load_state_dict(rnn.state_dict())
    twin_optimizer = torch.optim.SGD(twin.parameters(), lr=0.1)
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(rnn, static_x, optimizer)
    bound = 8 * UNIT["bf16"]
    for i in range(3):
        x = torch.randn(T, B, INPUT, device=cuda).bfloat16()
        static_x.copy_(x)
        graph.replay()
        twin_optimizer.zero_grad()
        loss = step(twin, x, twin_optimizer)
        torch.testing.assert_close(static_loss, loss, rtol=bound, atol=bound, msg=f"replay {i}")
    torch.testing.assert_close(rnn.param("l0.W_i"), twin.param("l0.W_i"), rtol=bound, atol=bound)
