"""On a GPU: runs over memory seen before replay a captured CUDA graph of the program
(StreamProgram.run with `keep`), forward and backward, with the results of launches, reading x, the
initial states and the parameters as they are at each call; and a module's inference calls like the one
before go straight to its runner (quick_call), seeing a change of sizes, dtype or device, and once they
replay, through the C++ lane (quick_lane), seeing every change too; a training call like the one before
goes straight to the ops."""

from __future__ import annotations

import pytest
import torch

from cellfuse.graph_model import CellError
from cellfuse.nn import GRU, LSTM, CellRNN, ops, stacks
from cellfuse.nn.cuda_runner import BACKWARD_NO_DX

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("settled_memory")]

T, INPUT, H = 20, 32, 48  # each test its own batch size: runners, and their kept runs, are the process's


def _program(rnn, x, which):
    runner = ops.runner(rnn._cell_text, x, H, rnn.num_layers, rnn.schedule, float32=rnn._float32)
    return runner._programs[which]


def _trained_forward(rnn, x, states=None):
    """The training program's forward pass of the same rung, made at every call."""
    with torch.enable_grad():
        y, finals = rnn(x.clone().requires_grad_(), states)
    return y.detach(), {k: v.detach() for k, v in finals.items()}


@pytest.mark.parametrize("schedule, batch", [("persistent", 3), ("tensor", 5)])
def test_inference_calls_over_memory_seen_before_replay_and_match_the_launches(cuda, schedule, batch):
    rnn = CellRNN("lstm", INPUT, H, 1, schedule=schedule, seed=3).to(cuda)
    x = torch.randn(T, batch, INPUT, device=cuda)
    with torch.no_grad():
        first = rnn(x)[0].clone()  # launched
        for _ in range(5):  # (y's memory alternates between two blocks: each seen twice, then replayed)
            y = rnn(x)[0]
        torch.testing.assert_close(y, first, rtol=0, atol=0)
        program = _program(rnn, x, "forward")
        replays = program._replays
        assert program._kept and replays >= 2
        x.copy_(torch.randn_like(x))  # the same address, new values: read by the replays
        rnn.param("l0.W_i").mul_(0.5)  # in place: packed again, where the replays read it
        got = []
        for _ in range(4):
            y = rnn(x)[0]
            got.append(y.cpu())  # (no GPU memory: the calls' addresses as before)
        assert program._replays >= replays + 3
    want = _trained_forward(rnn, x)[0].cpu()
    for y in got:
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    assert (got[0] - first.cpu()).abs().max() > 1e-3


def test_training_steps_over_memory_seen_before_replay_and_read_x_and_the_weights_as_they_are(cuda):
    rnn = CellRNN("lstm", INPUT, H, 1, schedule="persistent", seed=4).to(cuda)
    reference = CellRNN("lstm", INPUT, H, 1, seed=4).double()  # the numpy executor, in float64
    x = torch.randn(T, 6, INPUT, device=cuda)
    for _ in range(6):  # each step frees all it made before the next: the same memory again
        x.copy_(torch.randn_like(x))  # the same address, new values
        y, finals = rnn(x)
        (y.square().sum() + finals["c"].sum()).backward()
        want_y, want_finals = reference(x.double().cpu())
        (want_y.square().sum() + want_finals["c"].sum()).backward()
        torch.testing.assert_close(y.double().cpu(), want_y.detach(), rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            for p, q in zip(rnn.parameters(), reference.parameters(), strict=True):
                scale = float(q.grad.abs().max())
                torch.testing.assert_close(p.grad.double().cpu(), q.grad, rtol=0, atol=1e-4 * scale)
                p -= 0.05 * p.grad  # in place: the packed weights made again, where the replays read them
                q -= 0.05 * q.grad
        rnn.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        del y, finals
    train, backward = _program(rnn, x, "train"), _program(rnn, x, BACKWARD_NO_DX)  # (x needs no gradient)
    assert train._kept and backward._kept and train._replays >= 2 and backward._replays >= 2


def test_an_inference_call_like_the_last_goes_straight_to_the_runner(cuda, monkeypatch):
    rnn = CellRNN("gru", INPUT, H, 1, schedule="persistent", seed=5).to(cuda)
    x = torch.randn(T, 7, INPUT, device=cuda)
    with torch.no_grad():
        want = rnn(x)[0]
    entered = []
    whole = ops._forward
    monkeypatch.setattr(ops, "_forward", lambda *a, **k: entered.append(1) or whole(*a, **k))
    with torch.no_grad():
        got = rnn(x)[0]
        assert not entered
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        other = torch.randn(T, 2, INPUT, device=cuda)
        torch.testing.assert_close(rnn(other)[0], _trained_forward(rnn, other)[0], rtol=1e-5, atol=1e-5)
        assert entered  # another batch: the whole path
    rnn.half()  # the parameters elsewhere: checked again, and refused for float32 x
    with torch.no_grad(), pytest.raises(CellError, match="parameter 'l0.W_.*' is torch.float16"):
        rnn(other)


@pytest.mark.parametrize("make,dtype,autocast", [
    ("cellrnn", torch.float32, None), ("drop-in", torch.float32, None), ("cellrnn", torch.bfloat16, None),
    ("drop-in", torch.float16, None), ("cellrnn", torch.float32, torch.bfloat16),
    ("drop-in", torch.float32, torch.float16)])
def test_a_training_step_like_the_last_skips_the_modules_checks_and_trains_the_same(cuda, monkeypatch, make,
                                                                                   dtype, autocast):
    """A training call like the one before goes from the module's kept call to the ops (stacks.run is not
    entered), with its steps saved; its gradients and an optimizer's steps are the whole path's, in 16
    bits too (the plans of x's precision, their float32 states as the module's), and under torch.autocast
    (float32 x cast to its dtype at every call)."""
    def module():
        torch.manual_seed(3)
        if make == "cellrnn":
            return CellRNN("lstm", INPUT, H, 2, schedule="tensor", batch_first=True, seed=4).to(cuda, dtype)
        return LSTM(INPUT, H, 2, batch_first=True, schedule="tensor").to(cuda, dtype)
    x = torch.randn(11, T, INPUT, device=cuda, dtype=dtype)
    runs, entered, whole = {}, [], stacks.run
    monkeypatch.setattr(stacks, "run", lambda *a, **k: entered.append(1) or whole(*a, **k))
    for kept in (False, True):
        rnn = module()
        optimizer = torch.optim.SGD(rnn.parameters(), lr=0.1)
        entered.clear()
        losses = []
        for _ in range(3):
            if not kept:
                rnn._quick = None
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
                y = rnn(x)[0]
            assert y.dtype == (autocast or dtype)
            loss = y.float().square().mean()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert len(entered) == (1 if kept else 3)
        runs[kept] = losses, [p.detach().clone() for p in rnn.parameters()]
    torch.testing.assert_close(runs[True][0], runs[False][0], rtol=0, atol=0)
    for a, b in zip(runs[True][1], runs[False][1], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.no_grad():  # an inference call after: the whole path, then kept as one
        rnn(x)
        assert rnn._quick is not None and rnn._quick._train is None


def test_the_drop_in_lstm_keeps_its_inference_call(cuda, monkeypatch):
    lstm = LSTM(INPUT, H, 2, batch_first=True, schedule="persistent").to(cuda)
    torchs = torch.nn.LSTM(INPUT, H, 2, batch_first=True).to(cuda)
    torchs.load_state_dict(lstm.state_dict())
    x = torch.randn(3, T, INPUT, device=cuda)
    with torch.no_grad():
        first, (h, c) = lstm(x)
    entered = []
    whole = ops._forward
    monkeypatch.setattr(ops, "_forward", lambda *a, **k: entered.append(1) or whole(*a, **k))
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        got, (got_h, got_c) = lstm(x)
        carried, (carried_h, carried_c) = lstm(x, (h, c))  # every state given: kept too
        assert not entered
        want, (want_h, want_c) = torchs(x)
        want_carried, (want_carried_h, want_carried_c) = torchs(x, (h, c))
        lstm(x[:, :5])  # another length: the whole path
        assert entered
    for a, b, z in ((got, first, want), (got_h, h, want_h), (got_c, c, want_c)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, z, rtol=1e-4, atol=1e-5)
    for a, z in ((carried, want_carried), (carried_h, want_carried_h), (carried_c, want_carried_c)):
        torch.testing.assert_close(a, z, rtol=1e-4, atol=1e-5)


def test_calls_that_carry_their_states_go_straight_to_the_runner(cuda, monkeypatch):
    rnn = CellRNN("lstm", INPUT, H, 1, schedule="tensor", seed=6).to(cuda)
    xs = [torch.randn(T, 9, INPUT, device=cuda) for _ in range(4)]
    entered = []
    whole = ops._forward
    monkeypatch.setattr(ops, "_forward", lambda *a, **k: entered.append(1) or whole(*a, **k))
    states, got = None, []
    with torch.no_grad():
        for x in xs:  # the first takes the whole path; the others give every state, like it otherwise
            y, states = rnn(x, states)
            got.append((y, states))
    assert len(entered) == 1
    states = None
    for x, (y, finals) in zip(xs, got, strict=True):
        want, states = _trained_forward(rnn, x, states)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
        for s in rnn.state_ids:
            torch.testing.assert_close(finals[s], states[s], rtol=1e-5, atol=1e-5)


def _allocator_retries(cuda) -> int:
    """How often torch's caching allocator gave its free blocks back to the driver to retry an allocation
    that failed (other processes filling the GPU): the memory of the calls after it moves."""
    return torch.cuda.memory_stats(cuda).get("num_alloc_retries", 0)


def _lanes(module) -> dict:
    """For a failure's message: each kept layer call's (layer, ops direction) -> its runner's rung, how
    many captured runs its lane knows, the bases (addresses) of the last call it left to Python and
    those of the runs its forward program keeps captured."""
    out = {}
    for key, quick in module._kept_layers._calls.items():
        runner, lane = quick._runner(), quick._lane
        program = None if runner is None else runner._programs.get("forward")
        out[key] = (None if runner is None else runner.plans.forward.schedule,
                    None if lane is None else (lane.known(), [hex(b) for b in lane.missed()]),
                    None if program is None or program._kept is None else
                    [[hex(b) for b in bases] for bases in program._kept])
    return out


def _program_runs(monkeypatch) -> list:
    """Runs of a program that the whole path made (those the C++ lanes made do not reach it), each as
    (a program's mark, its bases), which an assertion's message shows: which memory moved."""
    from cellfuse.gpu_runtime.stream_program import StreamProgram

    runs, whole = [], StreamProgram.run

    def run(program, bases, stream, keep=False, at_first=False):
        runs.append((id(program) % 1000, [hex(b) for b in bases]))
        return whole(program, bases, stream, keep, at_first)
    monkeypatch.setattr(StreamProgram, "run", run)
    return runs


def _runner_entries(monkeypatch) -> list:
    """Calls that reached the runner's forward (those the C++ lane made do not), each as (the runner's
    rung, its lane, the count of changes a lane stands aside at, stream_program.CHANGES, and whether its
    inference calls are replays of CUDA graphs of the runner's own: a rung of launches every step, whose
    calls no C++ lane makes), which an assertion's message shows."""
    from cellfuse.gpu_runtime.stream_program import CHANGES
    from cellfuse.nn.cuda_runner import CudaRunner

    entered = []
    whole = CudaRunner.forward

    def forward(runner, *a, **k):
        program = runner._programs.get("forward")
        entered.append((runner.plans.forward.schedule, runner.lane, CHANGES.value,
                        program is not None and program.capture_pays))
        return whole(runner, *a, **k)
    monkeypatch.setattr(CudaRunner, "forward", forward)
    return entered


@pytest.mark.parametrize("schedule, batch_first", [("persistent", False), ("tensor", True)])
def test_calls_like_a_replayed_one_are_made_by_the_lane_and_see_every_change(cuda, monkeypatch, schedule,
                                                                              batch_first):
    from cellfuse.nn import quick_lane

    assert quick_lane.module() is not None, "the lane's C++ could not be built here"
    rnn = CellRNN("lstm", INPUT, H, 1, schedule=schedule, batch_first=batch_first, seed=7).to(cuda)
    batch = 10 if batch_first else 11
    x = torch.randn(*((batch, T) if batch_first else (T, batch)), INPUT, device=cuda)
    entered = _runner_entries(monkeypatch)
    with torch.no_grad():
        for _ in range(8):  # (the whole path, the kept call's Python, then the lane once it knows the runs)
            y, finals = rnn(x)
        program = _program(rnn, x.transpose(0, 1) if batch_first else x, "forward")
        assert rnn._quick._lane is not None and rnn._quick._lane.known() >= 1
        warm, replays = len(entered), program._replays
        for _ in range(6):  # (y's memory alternates between two blocks, as in the warm-up)
            y, finals = rnn(x)
        assert len(entered) == warm and program._replays == replays + 6  # all made by the lane
        want = _trained_forward(rnn, x)
        torch.testing.assert_close(y, want[0], rtol=1e-5, atol=1e-5)
        for s in rnn.state_ids:
            torch.testing.assert_close(finals[s], want[1][s], rtol=1e-5, atol=1e-5)
        held = [rnn(x) for _ in range(3)]  # (memory of their own: Python's calls, then the lane's)
        for y, _ in held:
            torch.testing.assert_close(y, want[0], rtol=1e-5, atol=1e-5)
        # x changed where it is, the weights changed in place, the states given: each seen
        x.copy_(torch.randn_like(x))
        rnn.param("l0.U_f").mul_(0.5)
        states = {s: torch.randn(1, batch, H, device=cuda) for s in rnn.state_ids}
        for _ in range(6):
            y, finals = rnn(x, states)
        want = _trained_forward(rnn, x, states)
        torch.testing.assert_close(y, want[0], rtol=1e-5, atol=1e-5)
        # on another stream (ordered after the first), and under autocast (float32 x made bfloat16)
        side = torch.cuda.Stream(cuda)
        side.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(side):
            for _ in range(5):
                y_side = rnn(x, states)[0]
        torch.cuda.current_stream(cuda).wait_stream(side)
        torch.testing.assert_close(y_side, want[0], rtol=1e-5, atol=1e-5)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert rnn(x)[0].dtype == torch.bfloat16
        torch.testing.assert_close(rnn(x, states)[0], want[0], rtol=1e-5, atol=1e-5)
    y, _ = rnn(x, states)  # a gradient to follow: the training path
    assert y.requires_grad


@pytest.mark.parametrize("dtype, batch", [(torch.bfloat16, 14), (torch.float16, 15)])
def test_a_16_bit_call_whose_plan_keeps_y_float32_is_made_by_the_lane(cuda, monkeypatch, dtype, batch):
    """The tensor rung keeps a 16-bit plan's y and states float32 (its GEMM's operand): the lane makes the
    calls over float32 memory and gives y and the final states back in x's type, as the runner's Python
    does (the parameters float32, as under autocast)."""
    from cellfuse.nn import quick_lane

    assert quick_lane.module() is not None, "the lane's C++ could not be built here"
    rnn = CellRNN("lstm", INPUT, H, 1, schedule="tensor", seed=7).to(cuda)
    x = torch.randn(T, batch, INPUT, device=cuda, dtype=dtype)
    assert ops.runner(rnn._cell_text, x, H, 1, "tensor", float32=rnn._float32)._y_dtype == torch.float32
    entered = _runner_entries(monkeypatch)
    with torch.no_grad():
        for _ in range(8):
            y, finals = rnn(x)
        program = _program(rnn, x, "forward")
        assert rnn._quick._lane is not None and rnn._quick._lane.known() >= 1
        warm, replays = len(entered), program._replays
        for _ in range(6):
            y, finals = rnn(x)
        assert len(entered) == warm and program._replays == replays + 6  # all made by the lane
        rnn._quick = None
        want_y, want_finals = rnn(x)  # (the whole path, the runner's Python)
        assert len(entered) == warm + 1
    assert y.dtype == dtype and all(f.dtype == dtype for f in finals.values())
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    for s in rnn.state_ids:
        torch.testing.assert_close(finals[s], want_finals[s], rtol=0, atol=0)


@pytest.mark.parametrize("make, autocast", [("cellrnn", torch.bfloat16), ("drop-in", torch.float16)])
def test_inference_calls_under_autocast_are_kept_and_made_by_the_lane(cuda, monkeypatch, make, autocast):
    """Under torch.autocast a float32 x is cast at every call, and the kept call makes it again: the lane
    makes the calls over the cast x, with the results of the whole path; out of autocast the same x
    runs in float32 again."""
    from cellfuse.nn import quick_lane

    assert quick_lane.module() is not None, "the lane's C++ could not be built here"
    rnn = (CellRNN("lstm", INPUT, H, 1, schedule="tensor", seed=8) if make == "cellrnn"
           else LSTM(INPUT, H, 1, schedule="tensor")).to(cuda)
    x = torch.randn(T, 17, INPUT, device=cuda)
    entered = _runner_entries(monkeypatch)

    def call():
        out = rnn(x)
        return out[0], out[1] if make == "cellrnn" else dict(zip(("h", "c"), out[1], strict=True))
    with torch.no_grad(), torch.autocast("cuda", dtype=autocast):
        for _ in range(8):
            y, finals = call()
        warm = len(entered)
        for _ in range(4):
            y, finals = call()
        assert len(entered) == warm  # all made by the lane
        rnn._quick = None
        want_y, want_finals = call()  # (the whole path)
        assert len(entered) == warm + 1
    assert y.dtype == autocast and all(f.dtype == autocast for f in finals.values())
    torch.testing.assert_close(y, want_y, rtol=0, atol=0)
    for s in finals:
        torch.testing.assert_close(finals[s], want_finals[s], rtol=0, atol=0)
    with torch.no_grad():
        assert call()[0].dtype == torch.float32


# calls in a row that every layer's lanes make, within so many calls of a stack (see below)
SETTLED_CALLS, CALLS_TO_SETTLE = 8, 40
T_BESIDE, T_IN_ORDER, P_BESIDE, P_IN_ORDER = ("tensor", True), ("tensor", False), ("persistent", True), \
    ("persistent", False)


@pytest.mark.parametrize("schedule, chosen, batch", [
    ("tensor", None, 19), ("auto", None, 21), ("auto", (T_BESIDE, P_BESIDE), 23),
    ("auto", (T_IN_ORDER, P_IN_ORDER), 25), ("auto", (T_IN_ORDER, P_BESIDE), 27),
    ("auto", (T_BESIDE, P_IN_ORDER), 29), ("auto", (P_IN_ORDER, P_BESIDE), 31),
    ("auto", (P_BESIDE, P_IN_ORDER), 33), ("auto", (T_IN_ORDER, T_BESIDE), 35),
    ("auto", (T_BESIDE, T_IN_ORDER), 37)])
def test_a_bidirectional_stacks_directions_are_made_by_their_lanes(cuda, monkeypatch, schedule, chosen,
                                                                   batch):
    """Each layer's and direction's inference call is kept (quick_call.KeptLayers): once the calls' memory
    settles at addresses whose runs were captured, within CALLS_TO_SETTLE calls, the calls like it are
    made by each direction's lane, side by side on their streams or one after the other, with the whole
    path's results to the bit, with and without hx, and torch's LSTM's within float32 rounding.
    `chosen`: what `auto` chooses for each layer, its rung and whether its directions run side by side
    (where None, as measured: the layers may choose differently, and a layer may get a rung of launches
    every step, whose calls replay a CUDA graph from the runner instead)."""
    from cellfuse.gpu_runtime.auto_schedule import Choice
    from cellfuse.nn import quick_lane

    assert quick_lane.module() is not None, "the lane's C++ could not be built here"
    if chosen is not None:
        def choose(cell, sizes, device, bidirectional=False, precision="fp32", train=False):
            rung, beside = chosen[0 if sizes.input == INPUT else 1]
            return Choice(rung, "as if measured", beside)
        monkeypatch.setattr(ops, "choose", choose)
    lstm = LSTM(INPUT, H, 2, bidirectional=True, schedule=schedule).to(cuda)
    torchs = torch.nn.LSTM(INPUT, H, 2, bidirectional=True).to(cuda)
    torchs.load_state_dict(lstm.state_dict())
    x = torch.randn(T, batch, INPUT, device=cuda)
    hx = tuple(torch.randn(4, batch, H, device=cuda) for _ in range(2))
    entered = _runner_entries(monkeypatch)
    retries = _allocator_retries(cuda)
    runs = _program_runs(monkeypatch)
    with torch.no_grad():
        for given in (None, hx):
            # (the lanes settle: a call's memory comes from the caching allocator, at addresses that
            # depend on what the calls before it freed, and a lane learns a run's addresses once its
            # program captured a run over them (at their first sighting); a call the whole path makes
            # allocates otherwise than a lane, which moves the addresses of the calls after it. In a stack
            # of (tensor beside, tensor in order) the upper layer's forward call, with hx, took more than a
            # dozen calls to find only addresses its lane knew, when runs were captured at their second)
            calls, settled = 0, 0
            while settled < SETTLED_CALLS:
                assert calls < CALLS_TO_SETTLE, (
                    f"{entered[-8:]}; the caching allocator's retries during the test: "
                    f"{_allocator_retries(cuda) - retries}; the kept calls: {_lanes(lstm)}; the runs: {runs}")
                before = len(entered)
                got, (h, c) = lstm(x, given)
                # (a layer whose rung `auto` measured fastest is one of launches every step enters the
                # runner at every call, to replay its CUDA graph: no lane makes its calls)
                missed = [e for e in entered[before:] if not e[3]]
                calls, settled = calls + 1, 0 if missed else settled + 1
            warm = len(entered)
            lstm._kept_layers._calls.clear()
            want, (want_h, want_c) = lstm(x, given)  # (the whole path)
            assert len(entered) == warm + 4
            for a, b in ((got, want), (h, want_h), (c, want_c)):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                theirs, (their_h, their_c) = torchs(x, given)
            for a, b in ((got, theirs), (h, their_h), (c, their_c)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def _until_settled(call, entered: list, describe):
    """call(count) made until SETTLED_CALLS calls in a row reach no runner (`entered`: _runner_entries'),
    within CALLS_TO_SETTLE calls (else the assertion says describe()); the last call's result."""
    calls, settled = 0, 0
    while settled < SETTLED_CALLS:
        assert calls < CALLS_TO_SETTLE, describe()
        before = len(entered)
        out = call(calls)
        calls, settled = calls + 1, 0 if len(entered) > before else settled + 1
    return out


def test_calls_of_rows_of_their_own_lengths_are_made_by_the_lane(cuda, monkeypatch):
    """A CellRNN call of rows of their own lengths is kept (quick_call.kept_lengths_call): once the calls'
    memory settles at addresses whose runs were captured, within CALLS_TO_SETTLE calls, the calls like it,
    each of other lengths, are made by the lane (none reaches the runner), with the whole path's results
    to the bit."""
    from cellfuse.nn import quick_lane

    assert quick_lane.module() is not None, "the lane's C++ could not be built here"
    batch = 40
    rnn = CellRNN("lstm", INPUT, H, 1, schedule="persistent", seed=5).to(cuda)
    x = torch.randn(T, batch, INPUT, device=cuda)
    g = torch.Generator().manual_seed(0)
    entered = _runner_entries(monkeypatch)
    with torch.no_grad():
        def call(_):
            lengths = torch.randint(1, T + 1, (batch,), generator=g)
            return lengths, rnn(x, lengths=lengths)
        lengths, (got, finals) = _until_settled(
            call, entered, lambda: f"{entered[-8:]}; the kept call: {rnn._quick_lengths}")
        assert rnn._quick_lengths._lane is not None
        kept, rnn._quick_lengths = rnn._quick_lengths, None
        want, want_finals = rnn(x, lengths=lengths)  # (the whole path)
        rnn._quick_lengths = kept
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for s in rnn.state_ids:
        torch.testing.assert_close(finals[s], want_finals[s], rtol=0, atol=0)


@pytest.mark.parametrize("schedule", ["tensor", "persistent"])
def test_a_bidirectional_stacks_packed_calls_are_made_by_their_lanes(cuda, monkeypatch, schedule):
    """A bidirectional stack's call of a PackedSequence keeps each layer's and direction's call of rows of
    their own lengths (quick_call.KeptLayers): once the calls' memory settles at addresses whose runs were
    captured, within CALLS_TO_SETTLE calls of one PackedSequence, its calls are made by the lanes (none
    reaches the runner), with the whole path's results to the bit, and torch's LSTM's within float32
    rounding; so are calls of other lengths after them, whichever way each is made. (Not that those
    settle: a PackedSequence of other lengths is data of another size, and the caching allocator then
    gives the calls' tensors addresses that seldom repeat: seen in 40 calls, each of lengths of its own.)"""
    from torch.nn.utils.rnn import pack_padded_sequence

    from cellfuse.nn import quick_lane

    assert quick_lane.module() is not None, "the lane's C++ could not be built here"
    batch = 24
    lstm = LSTM(INPUT, H, 2, bidirectional=True, schedule=schedule).to(cuda)
    torchs = torch.nn.LSTM(INPUT, H, 2, bidirectional=True).to(cuda)
    torchs.load_state_dict(lstm.state_dict())
    x = torch.randn(T, batch, INPUT, device=cuda)
    g = torch.Generator().manual_seed(0)

    def packing():
        lengths = torch.randint(1, T + 1, (batch,), generator=g)
        lengths[0] = T
        return pack_padded_sequence(x, lengths, enforce_sorted=False)

    packed = packing()
    entered = _runner_entries(monkeypatch)
    with torch.no_grad():
        got, (h, c) = _until_settled(lambda _: lstm(packed), entered,
                                     lambda: f"{entered[-8:]}; the kept calls: {_lanes(lstm)}")
        assert sorted(key for key in lstm._kept_layers._calls if key[2]) == [
            (layer, direction, True) for layer in (0, 1) for direction in
            sorted({key[1] for key in lstm._kept_layers._calls})]
        kept = dict(lstm._kept_layers._calls)
        lstm._kept_layers._calls.clear()
        want, (want_h, want_c) = lstm(packed)  # (the whole path)
        lstm._kept_layers._calls.update(kept)
        for a, b in ((got.data, want.data), (h, want_h), (c, want_c)):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        for given in [packed] + [packing() for _ in range(3)]:
            got, (h, c) = lstm(given)
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                theirs, (their_h, their_c) = torchs(given)
            for a, b in ((got.data, theirs.data), (h, their_h), (c, their_c)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_drop_in_gru_calls_through_the_lane(cuda, monkeypatch):
    from cellfuse.nn import GRU

    gru = GRU(INPUT, H, 1, batch_first=True, schedule="persistent").to(cuda)
    torchs = torch.nn.GRU(INPUT, H, 1, batch_first=True).to(cuda)
    torchs.load_state_dict(gru.state_dict())
    x = torch.randn(12, T, INPUT, device=cuda)
    entered = _runner_entries(monkeypatch)
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for _ in range(8):
            got, h = gru(x)
        warm = len(entered)
        for _ in range(4):
            got, h = gru(x)
        assert len(entered) == warm
        want, want_h = torchs(x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(h, want_h, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("make, schedule", [("lstm", "tensor"), ("gru", "persistent"), ("lstm", "graph"),
                                            ("drop-in lstm", "tensor"), ("drop-in gru", "persistent")])
def test_the_weights_packed_in_one_call_are_what_torchs_ops_pack(cuda, make, schedule):
    """The packing kernel puts every parameter where torch's ops do, byte for byte: a CellRNN's
    contiguous parameters, and the drop-ins' transposed views of torch's weights."""
    from cellfuse.nn.cuda_runner import _views

    if make.startswith("drop-in"):
        rnn = (LSTM if make.endswith("lstm") else GRU)(INPUT, H, schedule=schedule).to(cuda)
        params = rnn._fused_params()
    else:
        rnn = CellRNN(make, INPUT, H, 1, schedule=schedule, seed=8).to(cuda)
        params = rnn._params()
    x = torch.randn(T, 13, INPUT, device=cuda)
    rnn(x)[0].sum().backward()  # (the forward and backward programs made)
    runner = ops.runner(rnn._cell_text, x, H, 1, schedule)
    calls = runner._pack_call(params)
    assert calls is not None
    ours, theirs = (torch.full((runner.weight_bytes,), 0x7F, dtype=torch.uint8, device=cuda) for _ in "ab")
    calls.run([ours.data_ptr(), *(p.data_ptr() for p in params)], torch.cuda.current_stream(cuda).cuda_stream)
    for layout, buffers in runner.packing:
        layout.pack(_views(theirs, runner._weight_extents, buffers), params, buffers)
    assert torch.equal(ours, theirs)


def _gru_without_an_input_bias():
    """A GRU whose update gate has no input bias: the input GEMM's bias row has a column no parameter
    gives (zeros)."""
    from cellfuse.graph_model import CellBuilder, sigmoid, tanh

    b = CellBuilder("GRU without b_iz", "a GRU whose update gate has no input bias")
    x, h = b.input("x"), b.state("h")
    gates = {}
    for g in "rz":
        xg = (x @ b.weight(f"W_i{g}", "input", "hidden")).named(f"x{g}")
        if g == "r":
            xg = (xg + b.weight("b_ir", "hidden")).named("xr_b")
        hg = ((h @ b.weight(f"W_h{g}", "hidden", "hidden")).named(f"h{g}") + b.weight(f"b_h{g}", "hidden"))
        gates[g] = sigmoid((xg + hg.named(f"h{g}_b")).named(f"a{g}")).named(g)
    xn = ((x @ b.weight("W_in", "input", "hidden")).named("xn") + b.weight("b_in", "hidden")).named("xn_b")
    hn = ((h @ b.weight("W_hn", "hidden", "hidden")).named("hn") + b.weight("b_hn", "hidden")).named("hn_b")
    n = tanh((xn + (gates["r"] * hn).named("rhn")).named("an")).named("n")
    one_minus_z = (b.const(1.0, "one") - gates["z"]).named("one_minus_z")
    h_new = ((one_minus_z * n).named("zn") + (gates["z"] * h).named("zh")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


@pytest.mark.parametrize("schedule", ["graph", "persistent"])
def test_a_bias_row_with_a_column_no_parameter_gives_packs_zeros_there(cuda, schedule):
    cell = _gru_without_an_input_bias()
    # (small blocks of NaN freed, which torch's allocator may give the packing next: its weights are small)
    junk = [torch.full((1 << 14,), float("nan"), device=cuda) for _ in range(64)]
    del junk
    rnn = CellRNN(cell, INPUT, H, 1, schedule=schedule, seed=9).to(cuda)
    reference = CellRNN(cell, INPUT, H, 1, seed=9)  # the numpy executor
    x = torch.randn(T, 5, INPUT)
    with torch.no_grad():
        got, want = rnn(x.to(cuda))[0].cpu(), reference(x)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def _cell_with_an_unused_last_weight():
    from cellfuse.graph_model import CellBuilder, tanh

    b = CellBuilder("RNN with an unused weight", "an Elman RNN that declares a weight it never reads")
    x, h = b.input("x"), b.state("h")
    W, U = b.weight("W", "input", "hidden"), b.weight("U", "hidden", "hidden")
    b.weight("Z", "hidden", "hidden")  # (declared last, read by no node)
    h_new = tanh(((x @ W).named("xw") + (h @ U).named("hu")).named("a")).named("h_new")
    b.update(h, h_new)
    b.output(h_new)
    return b.build()


@pytest.mark.parametrize("schedule", ["graph", "persistent"])
def test_a_weight_no_node_reads_is_given_to_the_packing_and_gets_zero_gradients(cuda, schedule):
    """The packing kernel's run is given every parameter, also the last one that no launch reads."""
    cell = _cell_with_an_unused_last_weight()
    rnn = CellRNN(cell, INPUT, H, 1, schedule=schedule, seed=10).to(cuda)
    assert rnn.keys[-1] == "l0.Z"
    reference = CellRNN(cell, INPUT, H, 1, seed=10)  # the numpy executor
    x = torch.randn(T, 5, INPUT)
    for module, given in ((rnn, x.to(cuda)), (reference, x)):
        module(given)[0].square().sum().backward()
    with torch.no_grad():
        torch.testing.assert_close(rnn(x.to(cuda))[0].cpu(), reference(x)[0], rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(rnn.named_parameters(), reference.parameters(), strict=True):
        scale = float(q.grad.abs().max())
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-4 * scale + 1e-7, msg=name)
    assert not rnn.param("l0.Z").grad.any()
