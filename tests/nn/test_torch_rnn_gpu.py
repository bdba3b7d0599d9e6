"""cellfuse.nn.LSTM and GRU on a GPU, float32, against torch.nn.LSTM and GRU (cuDNN) from the same state
dict: outputs, final states and gradients under the rungs that run them."""

from __future__ import annotations

import pytest
import torch
from weight_drop import WeightDropout

from cellfuse.codegen.scheduler import SCHEDULES
from cellfuse.nn import GRU, LSTM

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("schedule", [*SCHEDULES, "auto"])
@pytest.mark.parametrize("cls, torch_cls", [(LSTM, torch.nn.LSTM), (GRU, torch.nn.GRU)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_matches_cudnn(cuda, schedule, cls, torch_cls, bidirectional):
    """Two layers, batch first, one or two directions, under every rung: outputs, final states and every
    gradient as cuDNN's."""
    options = {"num_layers": 2, "batch_first": True, "bidirectional": bidirectional}
    ours = cls(24, 40, **options, schedule=schedule).to(cuda)
    ref = torch_cls(24, 40, **options).to(cuda)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(5, 7, 24, device=cuda, requires_grad=True)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # cuDNN's RNNs take TF32 by default
        (y, states), (want_y, want_states) = ours(x), ref(x)
    torch.testing.assert_close(y, want_y, rtol=1e-4, atol=1e-5)
    finals = (states, want_states) if cls is GRU else (states[1], want_states[1])
    torch.testing.assert_close(*finals, rtol=1e-4, atol=1e-5)
    got = torch.autograd.grad(y.square().sum(), [x, *ours.parameters()])
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        want = torch.autograd.grad(want_y.square().sum(), [x, *ref.parameters()])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("schedule", ["graph", "tensor"])
def test_a_weight_drop_wrapper_matches_cudnn(cuda, schedule):
    """fastai's WeightDropout around the drop-in (its recurrent weight a new tensor at every call, at an
    address the caching allocator may give again): training steps' outputs and gradients, then inference
    calls in a row (which the module keeps), all as cuDNN's under the same wrapper."""
    ours = LSTM(24, 40, num_layers=2, schedule=schedule).to(cuda)
    ref = torch.nn.LSTM(24, 40, num_layers=2).to(cuda)
    ref.load_state_dict(ours.state_dict())
    wrapped = [WeightDropout(module, 0.3) for module in (ours, ref)]
    x = torch.randn(7, 5, 24, device=cuda)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for training in (True, False):
            for step in range(3):
                outs = []
                for wrapper in wrapped:
                    wrapper.train(training)
                    torch.manual_seed(step)  # (the same dropout for both)
                    with torch.set_grad_enabled(training):
                        y = wrapper(x)[0]
                    params = list(wrapper.parameters())
                    grads = torch.autograd.grad(y.square().sum(), params) if training else []
                    outs.append((y.detach(), grads))
                (y_ours, g_ours), (y_ref, g_ref) = outs
                torch.testing.assert_close(y_ours, y_ref, rtol=1e-4, atol=1e-5)
                for a, b in zip(g_ours, g_ref, strict=True):
                    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_batch_of_no_rows_after_kept_calls(cuda, bidirectional):
    """A batch of no rows, after inference calls of rows that the module keeps (and a lane makes), gives
    cuDNN's empty outputs; the next call of rows is made as before it."""
    ours = LSTM(24, 40, num_layers=2, bidirectional=bidirectional, schedule="tensor").to(cuda)
    ref = torch.nn.LSTM(24, 40, num_layers=2, bidirectional=bidirectional).to(cuda)
    ref.load_state_dict(ours.state_dict())
    x, empty = torch.randn(7, 5, 24, device=cuda), torch.randn(7, 0, 24, device=cuda)
    with torch.no_grad():
        for _ in range(3):
            ours(x)
        y, (h, c) = ours(empty)
        want_y, (want_h, want_c) = ref(empty)
        assert (y.shape, h.shape, c.shape) == (want_y.shape, want_h.shape, want_c.shape)
        assert y.device == want_y.device
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("schedule", ["persistent", "tensor"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_dropout_between_layers_drops_what_torchs_dropout_drops(cuda, schedule, bidirectional):
    """Training with dropout between layers on the GPU drops the units torch's own dropout drops from the
    same seed (the layer's outputs go through torch.nn.functional.dropout, on torch's CUDA generator):
    the stack equals cuDNN's layers one at a time with that dropout between them, outputs and every
    gradient. (cuDNN's own dropout draws from generators of its own: nothing to compare by seed.)"""
    import torch.nn.functional as F

    torch.manual_seed(0)
    ours = LSTM(24, 40, num_layers=2, dropout=0.5, bidirectional=bidirectional, schedule=schedule).to(cuda)
    width = 80 if bidirectional else 40
    first = torch.nn.LSTM(24, 40, bidirectional=bidirectional).to(cuda)
    second = torch.nn.LSTM(width, 40, bidirectional=bidirectional).to(cuda)
    state = ours.state_dict()
    first.load_state_dict({k: v for k, v in state.items() if "_l0" in k})
    second.load_state_dict({k.replace("_l1", "_l0"): v for k, v in state.items() if "_l1" in k})
    x = torch.randn(9, 6, 24, device=cuda, requires_grad=True)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        second(first(x)[0])  # (cuDNN's first call makes its dropout state, drawing a seed, before the seed)
    torch.manual_seed(5)
    y = ours(x)[0]
    torch.manual_seed(5)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        want = second(F.dropout(first(x)[0], 0.5, training=True))[0]
        torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)
        got = torch.autograd.grad(y.square().sum(), [x, *ours.parameters()])
        expected = torch.autograd.grad(want.square().sum(), [x, *first.parameters(), *second.parameters()])
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def _gradient_errors(cuda, schedule: str, seq: int, batch: int) -> list[float]:
    """Each parameter's gradient of a training step of the LSTM at input = hidden = 512: its largest
    difference from a float64 torch.nn.LSTM's, relative to that gradient's largest (or 1e-3 of the
    largest of all)."""
    torch.manual_seed(0)
    ours = LSTM(512, 512, schedule=schedule).to(cuda)
    ref = torch.nn.LSTM(512, 512).to(cuda).double()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(seq, batch, 512, device=cuda)
    got = torch.autograd.grad(ours(x)[0].pow(2).mean(), list(ours.parameters()))
    want = torch.autograd.grad(ref(x.double())[0].pow(2).mean(), list(ref.parameters()))
    largest = max(float(w.abs().max()) for w in want)
    return [float((g.double() - w).abs().max()) / max(float(w.abs().max()), 1e-3 * largest)
            for g, w in zip(got, want, strict=True)]


def test_long_sequence_gradients_stay_near_float64(cuda):
    """T=1000: the gradients of a training step within 5e-5 of a float64 torch.nn.LSTM's. (cuBLAS given a
    workspace of 8 MiB chose algorithms that ended 8e-5 away; in its own workspace 2.5e-5.)"""
    assert max(_gradient_errors(cuda, "persistent", 1000, 8)) < 5e-5


def test_a_long_sequences_weight_gradients_are_float32s(cuda):
    """T=1000, B=64: the weights' gradients sum over K = 64,000 rows, beyond gemm_routes.F16X3_MAX_K, in
    cuBLAS's float32 GEMM: within 1e-5 of a float64 torch.nn.LSTM's (as 3xTF32 they were 1.8e-4 away on an
    H200, cuDNN's float32 ones 2.7e-6)."""
    weight_ih, weight_hh, *_ = _gradient_errors(cuda, "tensor", 1000, 64)
    assert max(weight_ih, weight_hh) < 1e-5


@pytest.mark.parametrize("schedule", ["graph", "wavefront", "persistent", "tensor"])
@pytest.mark.parametrize("cls, torch_cls", [(LSTM, torch.nn.LSTM), (GRU, torch.nn.GRU)])
def test_packed_sequences_match_cudnn(cuda, schedule, cls, torch_cls):
    """Each row to its own length in the kernels of every rung, two layers, both directions, the lengths
    unsorted: outputs, final states and gradients against cuDNN's packed run."""
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    ours = cls(24, 40, num_layers=2, bidirectional=True, schedule=schedule).to(cuda)
    ref = torch_cls(24, 40, num_layers=2, bidirectional=True).to(cuda)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(9, 6, 24, device=cuda, requires_grad=True)
    packed = pack_padded_sequence(x, torch.tensor([4, 9, 1, 7, 9, 3]), enforce_sorted=False)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        (y, states), (want_y, want_states) = ours(packed), ref(packed)
        states, want_states = ((s if isinstance(s, tuple) else (s,)) for s in (states, want_states))
        torch.testing.assert_close(y.data, want_y.data, rtol=1e-4, atol=1e-5)
        for got, want in zip(states, want_states, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        losses = [out.data.square().sum() + sum(s.sum() for s in ss)
                  for out, ss in ((y, states), (want_y, want_states))]
        got = torch.autograd.grad(losses[0], [x, *ours.parameters()], retain_graph=True)
        want = torch.autograd.grad(losses[1], [x, *ref.parameters()])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("route", ["wgmma", "copies"])
def test_packed_sequences_match_cudnn_whichever_route_the_input_gemm_takes(cuda, monkeypatch, route):
    """Sizes at which each layer's input GEMM runs on tensor cores (the warpgroup GEMM skipping the rows
    that have ended, or the split copies and cuBLAS), two layers, both directions, lengths unsorted:
    outputs, final states and gradients against cuDNN's packed run."""
    from torch.nn.utils.rnn import pack_padded_sequence

    import cellfuse.gpu_runtime.stream_program as stream_program
    from cellfuse.nn import ops

    if torch.cuda.get_device_capability(cuda) != (9, 0):
        pytest.skip("the warpgroup GEMM needs an sm_90 GPU (H100, H200)")
    monkeypatch.setattr(stream_program, "route_choice", lambda *args: route)
    monkeypatch.setattr(ops, "_runners", type(ops._runners)())  # (runners of this route alone, dropped after)
    torch.manual_seed(0)
    ours = LSTM(512, 512, num_layers=2, bidirectional=True, schedule="tensor").to(cuda)
    ref = torch.nn.LSTM(512, 512, num_layers=2, bidirectional=True).to(cuda)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(24, 64, 512, device=cuda, requires_grad=True)
    lengths = torch.randint(4, 25, (64,), generator=torch.Generator().manual_seed(1))
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        (y, (h, c)), (want_y, (want_h, want_c)) = ours(packed), ref(packed)
        for got, want in ((y.data, want_y.data), (h, want_h), (c, want_c)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        got = torch.autograd.grad(y.data.square().sum() + c.sum(), [x, *ours.parameters()], retain_graph=True)
        want = torch.autograd.grad(want_y.data.square().sum() + want_c.sum(), [x, *ref.parameters()])
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_both_directions_capture_and_replay(cuda):
    """The reverse direction runs on a side stream, a branch of the graph under a CUDA graph capture: the
    capture of the bidirectional forward pass replays on new inputs to eager's results (the two
    directions' persistent kernels at once, each from a module of its own)."""
    torch.manual_seed(0)
    lstm = LSTM(24, 40, num_layers=2, bidirectional=True, schedule="persistent").to(cuda)
    x = torch.randn(9, 6, 24, device=cuda)
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            lstm(x)  # warm-up (plans, programs) before the capture, on a side stream as torch asks
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, (h, c) = lstm(x)
        fresh = torch.randn_like(x)
        x.copy_(fresh)
        graph.replay()
        want_y, (want_h, want_c) = lstm(fresh)
    torch.cuda.synchronize()
    for got, want in ((y, want_y), (h, want_h), (c, want_c)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_training_after_calls_under_inference_mode_matches_cudnn(cuda, bidirectional):
    """Evaluations under torch.inference_mode() (kept calls, lanes, packed weights and zeros made in
    them) between training steps: the steps after them give cuDNN's gradients."""
    torch.manual_seed(0)
    lstm = LSTM(32, 48, 2, bidirectional=bidirectional, schedule="auto").to(cuda)
    ref = torch.nn.LSTM(32, 48, 2, bidirectional=bidirectional).to(cuda)
    ref.load_state_dict(lstm.state_dict())
    x = torch.randn(12, 5, 32, device=cuda)
    for _ in range(2):
        with torch.inference_mode():
            for _ in range(3):
                lstm(x)
        got = torch.autograd.grad(lstm(x)[0].square().sum(), list(lstm.parameters()))
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            want = torch.autograd.grad(ref(x)[0].square().sum(), list(ref.parameters()))
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
@pytest.mark.parametrize("packed", [False, True])
def test_the_backward_pass_writes_torchs_parameters_gradients_itself(cuda, kind, packed, monkeypatch):
    """The gathering kernel of a drop-in's backward pass writes the gradients of torch's parameters (the
    gates' rows joined, W's transposed) itself: the module's join of its views' gradients with torch's
    ops is never called, and every gradient is cuDNN's."""
    from torch.nn.utils.rnn import pack_padded_sequence

    from cellfuse.nn import torch_rnn

    def joined_by_torch(*args):
        raise AssertionError("the views' gradients were joined by torch's ops")

    monkeypatch.setattr(torch_rnn, "_source_gradients", joined_by_torch)
    torch.manual_seed(0)
    mine = {"LSTM": LSTM, "GRU": GRU}[kind](32, 48, 2, bidirectional=True, schedule="auto").to(cuda)
    ref = getattr(torch.nn, kind)(32, 48, 2, bidirectional=True).to(cuda)
    ref.load_state_dict(mine.state_dict())
    x = torch.randn(12, 5, 32, device=cuda)
    if packed:
        x = pack_padded_sequence(x, torch.tensor([12, 3, 9, 12, 5]), enforce_sorted=False)

    def grads(module):
        y = module(x)[0]
        return torch.autograd.grad((y.data if packed else y).square().sum(), list(module.parameters()))

    for _ in range(2):  # (the second step's kernels are those made at the first)
        got = grads(mine)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            want = grads(ref)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_a_module_made_under_inference_mode_runs_as_cudnn(cuda):
    """Parameters that are inference tensors (no version counter) are packed at every call; a change made
    to them in place between calls is seen."""
    with torch.inference_mode():
        torch.manual_seed(0)
        lstm = LSTM(32, 48, 2, schedule="auto").to(cuda)
        ref = torch.nn.LSTM(32, 48, 2).to(cuda)
        ref.load_state_dict(lstm.state_dict())
        x = torch.randn(12, 5, 32, device=cuda)
        for _ in range(2):
            lstm(x)
            lstm.weight_hh_l1.mul_(0.5)
            ref.weight_hh_l1.mul_(0.5)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                want = ref(x)[0]
            torch.testing.assert_close(lstm(x)[0], want, rtol=1e-4, atol=1e-5)


def test_a_jit_trace_runs_other_sizes_as_cudnn(cuda):
    """A drop-in traced by torch.jit.trace after eager calls (kept calls and lanes made) runs through the
    op at other sizes, as cuDNN computes."""
    torch.manual_seed(0)
    lstm = LSTM(32, 48, 2, bidirectional=True, schedule="persistent").to(cuda)
    ref = torch.nn.LSTM(32, 48, 2, bidirectional=True).to(cuda)
    ref.load_state_dict(lstm.state_dict())
    x = torch.randn(12, 5, 32, device=cuda)
    with torch.no_grad():
        for _ in range(3):
            lstm(x)
        traced = torch.jit.trace(lstm, (x,))
        other = torch.randn(20, 7, 32, device=cuda)
        (y, (h, c)) = traced(other)
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # (cuDNN takes TF32 by default)
            want_y, (want_h, want_c) = ref(other)
    for got, want in ((y, want_y), (h, want_h), (c, want_c)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, True)])
def test_a_training_step_is_captured_after_eager_steps(cuda, layers, bidirectional):
    """A training step captured into a CUDA graph after eager steps on the default stream (a loop that
    captures its step once it runs) replays to eager's gradients. The views of the parameters made on
    the default stream go before the capture's are made: while they lived, their parameters'
    AccumulateGrad nodes did, with the default stream, on which the captured backward pass then
    accumulated (the capture failed: the default stream may not wait for a capturing one)."""
    torch.manual_seed(0)
    lstm = LSTM(32, 48, layers, bidirectional=bidirectional, schedule="persistent").to(cuda)
    x = torch.randn(12, 5, 32, device=cuda)

    def step():
        y, _ = lstm(x)
        y.square().sum().backward()

    for _ in range(2):
        lstm.zero_grad(set_to_none=True)
        step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # (warm-up before a capture, as torch asks)
        for _ in range(2):
            lstm.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    lstm.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    fresh = torch.randn_like(x)
    x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    got = [p.grad.clone() for p in lstm.parameters()]
    y, _ = lstm(fresh)
    want = torch.autograd.grad(y.square().sum(), list(lstm.parameters()))
    for name, g, w in zip(dict(lstm.named_parameters()), got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)


def test_directions_side_by_side_take_half_of_the_sms_each(cuda):
    """Eagerly each direction of a bidirectional layer runs a persistent kernel planned for half of the
    SMs, so that the two are resident at once, from a module of its own (the kernels' exchanges are
    arrays of their module); a direction alone is planned for all of them."""
    from cellfuse.nn import ops
    from cellfuse.nn.runners import FORWARD, FORWARD_BESIDE, REVERSE_BESIDE

    lstm = LSTM(24, 40, bidirectional=True, schedule="persistent").to(cuda)
    x = torch.randn(9, 6, 24, device=cuda)
    with torch.no_grad():
        lstm(x)
    sms = torch.cuda.get_device_properties(cuda).multi_processor_count
    cell = lstm._cell_text
    for direction, share in ((FORWARD_BESIDE, 2), (REVERSE_BESIDE, 2), (FORWARD, 1)):
        plan = ops.runner(cell, x, 40, 1, "persistent", direction).plans.forward
        assert plan.target.sm_count == sms // share
    modules = [ops.runner(cell, x, 40, 1, "persistent", d)._program("forward").res.module.handle
               for d in (FORWARD_BESIDE, REVERSE_BESIDE)]
    assert modules[0] != modules[1]


def test_each_main_stream_has_a_side_stream_of_its_own(cuda):
    """A bidirectional layer's reverse direction runs on a side stream that serves one main stream alone
    (its outputs' memory goes back to its pool without record_stream: stacks._side_stream): two streams
    of one thread calling a module in turn, neither waiting for the other, each get a side stream of
    their own, and torch's results, call after call."""
    from cellfuse.nn import stacks

    torch.manual_seed(0)
    lstm = LSTM(32, 48, 2, bidirectional=True, schedule="persistent").to(cuda)
    ref = torch.nn.LSTM(32, 48, 2, bidirectional=True).to(cuda)
    ref.load_state_dict(lstm.state_dict())
    xs = [torch.randn(30, 5, 32, device=cuda) for _ in range(2)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    got: list[list[torch.Tensor]] = [[], []]
    with torch.no_grad():
        for _ in range(6):
            for i, stream in enumerate(streams):
                with torch.cuda.stream(stream):
                    got[i].append(lstm(xs[i])[0])
        torch.cuda.synchronize()
        sides = [stacks._side_stream(xs[0], stream).cuda_stream for stream in streams]
        assert sides[0] != sides[1] and not set(sides) & {s.cuda_stream for s in streams}
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            for i, x in enumerate(xs):
                want = ref(x)[0]
                for y in got[i]:
                    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("beside", [True, False])
def test_training_side_by_side_feeds_each_gradient_from_its_own_stream(cuda, tmp_path, beside):
    """Training a bidirectional stack whose reverse directions run on a side stream, `beside` the forward
    ones (or one after the other, as `auto` may choose, where a training call's run on the current
    stream), step after step, with an input that is a leaf requiring a gradient: torch's engine meets no
    AccumulateGrad node on another stream than the gradient it is given (it warns of that once a
    process, so a process of its own), and the gradients are cuDNN's."""
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from cellfuse.gpu_runtime.auto_schedule import Choice\n"
        "from cellfuse.nn import LSTM, ops\n"
        f"ops.choose = lambda *args, **kwargs: Choice('persistent', 'as if measured', {beside})\n"
        "torch.manual_seed(0)\n"
        "ours = LSTM(24, 40, 2, bidirectional=True, schedule='auto').cuda()\n"
        "ref = torch.nn.LSTM(24, 40, 2, bidirectional=True).cuda()\n"
        "ref.load_state_dict(ours.state_dict())\n"
        "for module in (ours, ref):\n"
        "    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)\n"
        "    torch.manual_seed(1)\n"
        "    for _ in range(4):\n"
        "        x = torch.randn(9, 6, 24, device='cuda', requires_grad=True)\n"
        "        optimizer.zero_grad()\n"
        "        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):\n"
        "            module(x)[0].square().sum().backward()\n"
        "        optimizer.step()\n"
        "    module.x_grad = x.grad\n"
        "for (name, a), b in zip(ours.named_parameters(), ref.parameters()):\n"
        "    torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4, msg=name)\n"
        "torch.testing.assert_close(ours.x_grad, ref.x_grad, rtol=1e-3, atol=1e-4)\n"
        "print('TRAINED')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert "TRAINED" in done.stdout, done.stdout + done.stderr
    assert "AccumulateGrad" not in done.stderr, done.stderr


@pytest.mark.parametrize("schedule", ["graph", "tensor"])
def test_modules_of_the_same_sizes_each_run_on_their_own_weights(cuda, schedule):
    """Two modules of one cell and sizes share a runner (each with packed weights of its own in it):
    called in turn, each gets its own results; and a module made after another was freed, likely in its
    memory and at the same versions, runs on its own weights, not on the freed module's still packed."""
    torch.manual_seed(0)
    x = torch.randn(20, 16, 32, device=cuda)

    def pair():
        ours, ref = LSTM(32, 48, schedule=schedule).to(cuda), torch.nn.LSTM(32, 48).to(cuda)
        ref.load_state_dict(ours.state_dict())
        return ours, ref

    (a, ref_a), (b, ref_b) = pair(), pair()
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for ours, ref in ((a, ref_a), (b, ref_b), (a, ref_a)):
            torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-4, atol=1e-5)
        del a, b, ref_a
        torch.cuda.synchronize()
        c, ref_c = pair()  # the freed modules' memory is there for the taking
        torch.testing.assert_close(c(x)[0], ref_c(x)[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("schedule", ["graph", "wavefront"])
def test_a_stacks_first_call_and_a_call_after_its_weights_change_read_the_new_weights(cuda, schedule):
    """Two layers at B=256, where the hoisted input GEMMs may run on the warpgroup GEMM, which reads an image
    of W: a module's first call, a second module's first call (new packed weights in the runner the first
    made), and a call after a weight of the second layer changed in place each match cuDNN with the weights
    of then (the images were once made inside the run, unordered against the GEMMs on the side streams
    that read them: docs/results/2026-11-30-widest-chunks-and-a-first-call-bug.md)."""
    torch.manual_seed(0)
    x = torch.randn(20, 256, 512, device=cuda)

    def pair():
        ours = LSTM(512, 512, num_layers=2, schedule=schedule).to(cuda)
        ref = torch.nn.LSTM(512, 512, num_layers=2).to(cuda)
        ref.load_state_dict(ours.state_dict())
        return ours, ref

    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for ours, ref in (pair(), pair()):
            torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-4, atol=1e-5)
        ours.weight_ih_l1.mul_(1.5)
        ref.load_state_dict(ours.state_dict())
        torch.testing.assert_close(ours(x)[0], ref(x)[0], rtol=1e-4, atol=1e-5)
