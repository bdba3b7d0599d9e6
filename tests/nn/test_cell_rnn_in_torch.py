"""CellRNN on a GPU as a part of PyTorch: its kernels compute in torch's tensors on torch's current
stream, so that a CUDA graph captures them, torch.compile and torch.export see its custom ops, memory
shows in torch's allocator, and any device of the process runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from cellfuse.nn import CellRNN, ops

pytestmark = pytest.mark.gpu


def _lstm(cuda, schedule="persistent", layers=1, hidden=64, inputs=32, seed=3):
    return CellRNN("lstm", inputs, hidden, layers, schedule=schedule, seed=seed).to(cuda)


def test_no_grad_saves_no_steps_and_training_keeps_them_in_torchs_memory(cuda):
    rnn = _lstm(cuda)
    x = torch.randn(50, 8, 32, device=cuda)
    with torch.no_grad():
        zeros = [torch.zeros(1, 8, 64, device=cuda)] * 2
        out = torch.ops.cellfuse.rnn(x, zeros, [rnn.param(k) for k in rnn.keys], rnn._cell_text, 64, 1,
                                     "persistent", False, 0, "")
    assert out[-1].numel() == 0
    rnn(x.requires_grad_())  # made once: the next call's memory is its own
    torch.cuda.synchronize(cuda)
    before = torch.cuda.memory_allocated(cuda)
    pending = [rnn(x)[0] for _ in range(3)]  # three forward passes waiting for their backward passes
    held = torch.cuda.memory_allocated(cuda) - before
    assert held >= 3 * 50 * 8 * 4 * 64 * 4  # each keeps at least its gates
    sum(y.sum() for y in pending).backward()


def test_changed_parameters_are_seen_and_unchanged_ones_are_not_packed_again(cuda):
    rnn = _lstm(cuda)
    x = torch.randn(20, 4, 32, device=cuda)
    with torch.no_grad():
        y0, _ = rnn(x)
        runner = ops.runner(rnn._cell_text, x, 64, 1, "persistent")
        packings = dict(runner._packings)
        other = _lstm(cuda)  # a module of the same sizes: the same runner, packed weights of its own
        other(x)
        y1, _ = rnn(x)
        assert len(runner._packings) == len(packings) + 1
        assert all(runner._packings[k] is packing for k, packing in packings.items())
        for m in (rnn, other):  # neither call packed the other's away
            assert runner._packing(m._params())[1].matches(m._params())
        rnn.param("l0.W_i").mul_(0.5)
        y2, _ = rnn(x)
    torch.testing.assert_close(y1, y0, rtol=0, atol=0)
    assert (y2 - y0).abs().max() > 1e-4


@pytest.mark.parametrize("schedule", ["persistent", "graph", "tensor"])
def test_a_captured_forward_replays_on_new_inputs(cuda, schedule):
    rnn = _lstm(cuda, schedule, layers=2)
    static_x = torch.randn(30, 8, 32, device=cuda)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            rnn(static_x)
    torch.cuda.current_stream(cuda).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y, static_final = rnn(static_x)
    new_x = torch.randn_like(static_x)
    static_x.copy_(new_x)
    graph.replay()
    with torch.no_grad():
        want_y, want_final = rnn(new_x)
    torch.testing.assert_close(static_y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(static_final["c"], want_final["c"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_captured_forward_with_lengths_replays_on_new_inputs(cuda, batch_first):
    """A call with lengths (on the CPU) captured after calls that kept it: the graph holds the padding's
    zeroing with the lengths of its capture (as a capture holds whatever the host gave its launches), and
    its replays over new x, NaN in the padding, give what an eager call with those lengths gives."""
    rnn = CellRNN("lstm", 32, 64, 2, schedule="persistent", batch_first=batch_first, seed=3).to(cuda)
    T, B = 30, 8
    lengths = torch.tensor([30, 3, 17, 30, 1, 29, 12, 8])
    static_x = torch.randn((B, T, 32) if batch_first else (T, B, 32), device=cuda)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            rnn(static_x, lengths=lengths)
    torch.cuda.current_stream(cuda).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y, static_final = rnn(static_x, lengths=lengths)
    new_x = torch.randn_like(static_x)
    ended = (torch.arange(T).view(T, 1) >= lengths.view(1, B)).to(cuda)
    (new_x.transpose(0, 1) if batch_first else new_x)[ended] = float("nan")
    static_x.copy_(new_x)
    graph.replay()
    with torch.no_grad():
        want_y, want_final = rnn(new_x, lengths=lengths)
    assert not static_y.isnan().any()
    torch.testing.assert_close(static_y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(static_final["c"], want_final["c"], rtol=1e-5, atol=1e-5)


def test_a_call_that_takes_the_whole_path_under_a_capture_is_not_kept(cuda):
    """The zeros a call makes under a CUDA graph's capture are the graph's, filled by its replays only: a
    call that takes the whole path there keeps nothing (a call like it made eagerly after the capture,
    before any replay, would start from them), and an eager call after the capture gives what it gave
    before."""
    rnn = _lstm(cuda, "persistent", layers=1)
    static_x = torch.randn(30, 8, 32, device=cuda)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            want, _ = rnn(static_x)
    torch.cuda.current_stream(cuda).wait_stream(side)
    want = want.clone()
    rnn._quick = None  # (so that the captured call takes the whole path)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        rnn(static_x)
    assert rnn._quick is None
    with torch.no_grad():
        y, _ = rnn(static_x)
    torch.testing.assert_close(y, want, rtol=0, atol=0)


@pytest.mark.parametrize("schedule", ["tensor", "graph"])
def test_a_captured_forward_still_replays_after_the_first_training_step(cuda, schedule):
    """The first backward pass after inference calls makes the module's packed weights anew (its
    programs read W's images of their own): the memory that a captured forward packs and reads stays the
    graph's, not given back for other tensors that its replays would then write."""
    from cellfuse.nn import ops

    rnn = _lstm(cuda, schedule, layers=1)
    static_x = torch.randn(30, 8, 32, device=cuda)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            rnn(static_x)
    torch.cuda.current_stream(cuda).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y, _ = rnn(static_x)
    runner = ops.runner(rnn._cell_text, static_x, 64, 1, schedule, float32=rnn._float32)
    nbytes = next(iter(runner._packings.values()))[0].numel()
    y, _ = rnn(torch.randn_like(static_x).requires_grad_())  # the first training step
    y.pow(2).mean().backward()
    # tensors of the packing's size: where its memory had been given back, one of them would now hold it
    others = [torch.full((nbytes,), 255, dtype=torch.uint8, device=cuda) for _ in range(32)]
    new_x = torch.randn_like(static_x)
    static_x.copy_(new_x)
    graph.replay()
    with torch.no_grad():
        want_y, _ = rnn(new_x)
    torch.testing.assert_close(static_y, want_y, rtol=1e-5, atol=1e-5)
    assert all(bool((other == 255).all()) for other in others)


@pytest.mark.parametrize("schedule", ["tensor", "graph"])
def test_a_captured_forward_replays_after_calls_of_many_other_sizes(cuda, schedule):
    """Calls of other batch sizes after a capture (the module keeps zeros for a few shapes, the process
    runners for a few sizes) leave the graph's own memory alone: its initial zeros and the packed weights
    it reads stay its own, not given back for other tensors that its replays would then read or write."""
    from cellfuse.nn import ops

    rnn = _lstm(cuda, schedule, layers=1)
    static_x = torch.randn(30, 8, 32, device=cuda)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(2):
            rnn(static_x)
    torch.cuda.current_stream(cuda).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_y, _ = rnn(static_x)
    with torch.no_grad():
        for batch in range(1, ops.MAX_RUNNERS + 3):  # more sizes than the process keeps runners for
            if batch != 8:
                rnn(torch.randn(30, batch, 32, device=cuda))
    # tensors filled with NaN where the graph's memory would be, had it been given back
    others = [torch.full((1 << 20,), float("nan"), device=cuda) for _ in range(32)]
    new_x = torch.randn_like(static_x)
    static_x.copy_(new_x)
    graph.replay()
    with torch.no_grad():
        want_y, _ = rnn(new_x)
    torch.testing.assert_close(static_y, want_y, rtol=1e-5, atol=1e-5)
    assert not any(bool(other.isnan().logical_not().any()) for other in others)


def test_a_captured_training_step_replays(cuda):
    rnn = _lstm(cuda, "persistent")
    head = torch.nn.Linear(64, 5).to(cuda)
    params = [*rnn.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    static_x = torch.randn(20, 4, 32, device=cuda)
    static_t = torch.randint(0, 5, (80,), device=cuda)

    def step():
        y, _ = rnn(static_x)
        loss = torch.nn.functional.cross_entropy(head(y).reshape(-1, 5), static_t)
        loss.backward()
        optimizer.step()
        return loss

    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream(cuda).wait_stream(side)
    # the eager twin of what the replays will do, from the same parameters
    twin_rnn, twin_head = _lstm(cuda, "persistent"), torch.nn.Linear(64, 5).to(cuda)
    twin_rnn.load_state_dict(rnn.state_dict())
    twin_head.load_state_dict(head.state_dict())
    optimizer.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step()
    twin_opt = torch.optim.SGD([*twin_rnn.parameters(), *twin_head.parameters()], lr=0.1)
    for i in range(3):
        x, t = torch.randn_like(static_x), torch.randint(0, 5, (80,), device=cuda)
        static_x.copy_(x)
        static_t.copy_(t)
        graph.replay()
        twin_opt.zero_grad()
        y, _ = twin_rnn(x)
        loss = torch.nn.functional.cross_entropy(twin_head(y).reshape(-1, 5), t)
        loss.backward()
        twin_opt.step()
        torch.testing.assert_close(static_loss, loss, rtol=1e-4, atol=1e-5, msg=f"replay {i}")
    torch.testing.assert_close(rnn.param("l0.W_i"), twin_rnn.param("l0.W_i"), rtol=1e-4, atol=1e-5)


class _LanguageModel(torch.nn.Module):
    def __init__(self, schedule="persistent"):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.rnn = CellRNN("lstm", 32, 64, 1, schedule=schedule, seed=5)
        self.head = torch.nn.Linear(64, 50)

    def forward(self, tokens):
        y, _ = self.rnn(self.embed(tokens))
        return self.head(y)


@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_torch_compile_fullgraph_matches_eager(cuda, mode):
    torch._dynamo.reset()
    model = _LanguageModel().to(cuda)
    compiled = torch.compile(model, fullgraph=True, mode=mode)
    for _ in range(3):
        tokens = torch.randint(0, 50, (20, 4), device=cuda)
        want = model(tokens)
        got = compiled(tokens)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    loss = compiled(tokens).square().mean()
    loss.backward()
    grad = model.rnn.param("l0.W_i").grad.clone()
    model.zero_grad()
    model(tokens).square().mean().backward()
    torch.testing.assert_close(grad, model.rnn.param("l0.W_i").grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("lengths_on", ["cpu", "cuda"])
def test_torch_compile_fullgraph_runs_rows_of_their_own_lengths_as_eager(cuda, lengths_on):
    """Two directions of rows of their own lengths, compiled whole by inductor: each call's lengths are
    read by the graph (on the CPU, or copied there from the GPU), outputs, final states and x's gradient
    as eager's."""
    torch._dynamo.reset()
    rnn = CellRNN("lstm", 32, 64, 2, bidirectional=True, schedule="persistent", seed=4).to(cuda)

    def call(x, lengths):
        y, final = rnn(x, lengths=lengths)
        return y, final["h"], final["c"]
    compiled = torch.compile(call, fullgraph=True)
    for seed in range(3):
        torch.manual_seed(seed)
        x = torch.randn(20, 5, 32, device=cuda, requires_grad=True)
        lengths = torch.randint(1, 21, (5,), device=lengths_on)
        got, want = compiled(x, lengths), call(x, lengths)
        # (eager runs the two directions side by side, each planned for half of the SMs; the compiled
        # graph one after the other, each planned for all: other plans, other orders of summation)
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        (grad,) = torch.autograd.grad(got[0].square().sum(), x)
        (want_grad,) = torch.autograd.grad(want[0].square().sum(), x)
        torch.testing.assert_close(grad, want_grad, rtol=1e-3, atol=1e-4)


def test_torch_export_computes_on_new_inputs(cuda):
    model = _LanguageModel().to(cuda).eval()
    tokens = torch.randint(0, 50, (20, 4), device=cuda)
    exported = torch.export.export(model, (tokens,))
    assert "cellfuse.rnn" in str(exported.graph)
    new = torch.randint(0, 50, (20, 4), device=cuda)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(new), model(new), rtol=1e-5, atol=1e-5)


def test_torch_export_runs_rows_of_new_lengths(cuda):
    """An exported program of two directions over rows of their own lengths (given on the CPU) runs other
    lengths as eager does, and refuses lengths out of bounds."""

    class Tagger(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = CellRNN("gru", 32, 64, 1, bidirectional=True, schedule="persistent", seed=6)

        def forward(self, x, lengths):
            y, final = self.rnn(x, lengths=lengths)
            return y, final["h"]
    model = Tagger().to(cuda).eval()
    x = torch.randn(20, 5, 32, device=cuda)
    exported = torch.export.export(model, (x, torch.tensor([20, 3, 7, 1, 12])))
    with torch.no_grad():
        for lengths in (torch.tensor([5, 20, 1, 9, 20]), torch.full((5,), 20)):
            for a, b in zip(exported.module()(x, lengths), model(x, lengths), strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        with pytest.raises(RuntimeError, match="lengths must be from 1"):
            exported.module()(x, torch.tensor([21, 3, 7, 1, 12]))


def test_modules_on_two_devices_of_one_process():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.randn(10, 3, 32)
    want, _ = CellRNN("lstm", 32, 64, 1, schedule="graph", seed=1)(x)
    for index in (1, 0):
        rnn = CellRNN("lstm", 32, 64, 1, schedule="persistent", seed=1).to(f"cuda:{index}")
        with torch.no_grad():
            y, _ = rnn(x.to(f"cuda:{index}"))
        assert y.device == torch.device("cuda", index)
        torch.testing.assert_close(y.cpu(), want.detach(), rtol=1e-4, atol=1e-5)


def test_out_of_memory_raises_torchs_error_and_leaves_the_module_usable(cuda):
    """Out of the memory torch's allocator may take (2 GiB more than the process holds: filling the
    whole GPU instead makes other test processes' allocators that cannot allocate give their cached
    memory back, which moves the memory of the calls whose replays they count)."""
    rnn = _lstm(cuda, "graph", hidden=1024, inputs=32)
    room = 2 << 30
    total = torch.cuda.get_device_properties(cuda).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(cuda) + room) / total, cuda)
    try:
        batch = room // (200 * 4 * 1024 * 4) + 64  # x fits; the gates of its 200 steps do not
        x = torch.zeros(200, batch, 32, device=cuda)
        with pytest.raises(torch.cuda.OutOfMemoryError), torch.no_grad():
            rnn(x)
        del x
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, cuda)
    with torch.no_grad():
        y, _ = rnn(torch.randn(10, 4, 32, device=cuda))
    assert torch.isfinite(y).all()


def test_a_faulting_kernel_is_named_not_hung(cuda, tmp_path):
    """With CELLFUSE_CHECK_LAUNCHES=1 each launch is waited for: a fault (x at an address no memory is
    at) raises an error naming the launch. In a process of its own: a fault ends its CUDA context."""
    script = tmp_path / "fault.py"
    script.write_text(
        "import torch\n"
        "from cellfuse.nn import CellRNN, ops\n"
        "rnn = CellRNN('lstm', 32, 64, 1, schedule='fused', seed=1).cuda()\n"
        "x = torch.randn(5, 2, 32, device='cuda')\n"
        "with torch.no_grad():\n"
        "    rnn(x)\n"
        "    runner = ops.runner(rnn._cell_text, x, 64, 1, 'fused')\n"
        "    program = runner._programs['forward']\n"
        "    program.bind([(k, at + (1 << 44) * (k == runner.X))\n"
        "                  for k, at in runner._binder('forward', program)], 16)\n"
        "    try:\n"
        "        y, _ = rnn(x)\n"
        "        torch.cuda.synchronize()\n"
        "        print('NO ERROR', float(y.abs().sum()))\n"
        "    except Exception as e:\n"
        "        print('RAISED', type(e).__name__, e)\n")
    env = {**os.environ, "CELLFUSE_CHECK_LAUNCHES": "1"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert "RAISED" in done.stdout, done.stdout + done.stderr
    assert "while running" in done.stdout and "ILLEGAL_ADDRESS" in done.stdout, done.stdout


def test_parameters_computed_for_each_call_are_packed_each_time(cuda):
    """torch.func.functional_call's tensors may come back at the same address and version: their values
    still count."""
    rnn = _lstm(cuda)
    x = torch.randn(10, 2, 32, device=cuda)
    with torch.no_grad():
        want = [rnn(x)[0]]
        for scale in (0.5, 0.25):
            swapped = {name: p * scale for name, p in rnn.named_parameters()}
            y, _ = torch.func.functional_call(rnn, swapped, (x,))
            twin = _lstm(cuda)
            twin.load_state_dict(swapped)
            torch.testing.assert_close(y, twin(x)[0], rtol=1e-5, atol=1e-6)
            want.append(y)
    assert (want[1] - want[2]).abs().max() > 1e-4


@pytest.mark.parametrize("schedule", ["persistent", "tensor", "graph"])
def test_modules_of_the_same_sizes_on_two_streams_at_once_each_give_their_own(cuda, schedule):
    """Two modules of one cell and sizes share kernels (and a persistent kernel's exchanges): called at once
    on two streams, each run waits for the other's, and each gives what it gives alone."""
    first, second = _lstm(cuda, schedule, seed=3), _lstm(cuda, schedule, seed=4)
    xs = [torch.randn(40, 2, 32, device=cuda) for _ in range(2)]
    with torch.no_grad():
        want = [first(xs[0])[0], second(xs[1])[0]]
        streams = [torch.cuda.Stream(cuda) for _ in range(2)]
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream(cuda))
        got = [[], []]
        for _ in range(20):  # queued back to back, without waiting in between
            for i, (rnn, stream) in enumerate(zip((first, second), streams, strict=True)):
                with torch.cuda.stream(stream):
                    got[i].append(rnn(xs[i])[0])
        torch.cuda.synchronize(cuda)
    for i in range(2):
        for y in got[i]:
            torch.testing.assert_close(y, want[i], rtol=0, atol=0)
