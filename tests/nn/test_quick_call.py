"""A module's kept call (quick_call.QuickCall): made again only for a call like it (the same
shape, dtype and device of x, layout, parameters' addresses, grad mode, no autocast change, the device
current), with the runner and the zeros it kept: an inference call to the runner, a training call to the
ops with its steps saved. The runner is a stand-in here; the GPU tests run a
module through it (tests/nn/test_kept_runs.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from cellfuse.nn import LSTM, CellRNN, cell_rnn, ops, quick_call, stacks
from cellfuse.nn.quick_call import QuickCall
from cellfuse.nn.runners import FORWARD, REVERSE
from cellfuse.nn.zeros import made_here


class _Runner:
    def __init__(self):
        self.lock, self.calls, self.lanes = threading.Lock(), [], []
        self.next_lane = None  # what call_lane gives

    def forward(self, x, states, params, save, shared):
        self.calls.append((x, states, params, save, shared))
        return x[..., :2] * 2, [s + 1 for s in states], None

    def call_lane(self, lane, x, params, zeros, batch_first, rows=None):
        self.lanes.append((lane, x, params, zeros, batch_first, rows))
        return self.next_lane


class _Lane:
    """A stand-in for the C++ lane: answers as told, recording its calls."""

    def __init__(self, answer):
        self.answer, self.calls = answer, []

    def __call__(self, x, params, states, stream):
        self.calls.append((x, params, states, stream))
        return self.answer

    def packed(self, data, batch_sizes, params, stream):
        self.calls.append((data, batch_sizes, params, stream))
        return self.answer


@pytest.fixture
def kept(monkeypatch):
    monkeypatch.setattr(ops, "on_device", lambda index: True)
    x = torch.randn(5, 3, 4)
    params = [torch.randn(4, 2), torch.randn(2)]
    zeros = [torch.zeros(1, 3, 2)]
    runner = _Runner()
    return QuickCall(x, ("persistent", False), params, runner, zeros), x, params, zeros, runner


def test_a_call_like_the_kept_one_goes_to_its_runner_with_its_zeros(kept):
    quick, x, params, zeros, runner = kept
    with torch.no_grad():
        y, finals = quick(torch.ones(5, 3, 4), ("persistent", False), params)
    (given, states, given_params, save, shared), = runner.calls
    assert states == zeros and given_params is params and (save, shared) == (False, True)
    assert torch.equal(y, torch.full((5, 3, 2), 2.0)) and torch.equal(finals[0], torch.ones(1, 3, 2))


def test_batch_first_x_goes_to_the_runner_time_first_and_y_comes_back_batch_first(monkeypatch):
    monkeypatch.setattr(ops, "on_device", lambda index: True)
    runner, params = _Runner(), [torch.randn(2)]
    quick = QuickCall(torch.randn(3, 5, 4), ("graph", True), params, runner, [torch.zeros(1, 3, 2)])
    x = torch.randn(3, 5, 4)
    with torch.no_grad():
        y, _ = quick(x, ("graph", True), params)
    assert runner.calls[0][0].shape == (5, 3, 4) and y.shape == (3, 5, 2)
    torch.testing.assert_close(y, x[..., :2] * 2)


@pytest.mark.parametrize("unlike", ["shape", "dtype", "schedule", "batch_first", "grad", "parameter",
                                    "parameter dtype", "autocast", "device"])
def test_a_call_unlike_the_kept_one_is_left_to_the_whole_path(kept, monkeypatch, unlike):
    quick, x, params, _, runner = kept
    layout = ("persistent", False)
    if unlike == "shape":
        x = torch.randn(5, 2, 4)
    elif unlike == "dtype":
        x = x.double()
    elif unlike == "schedule":
        layout = ("graph", False)
    elif unlike == "batch_first":
        layout = ("persistent", True)
    elif unlike == "parameter":  # another tensor: moved, or of another dtype
        params = [params[0].clone(), params[1]]
    elif unlike == "parameter dtype":  # at the same address (a tensor made for the call may be)
        params = [params[0].view(torch.int32), params[1]]
    elif unlike == "device":
        monkeypatch.setattr(ops, "on_device", lambda index: False)
    elif unlike == "autocast":  # (torch.autocast("cuda") is off without a GPU)
        monkeypatch.setattr(torch, "is_autocast_enabled", lambda device: device == "cuda")
    with torch.set_grad_enabled(unlike == "grad"):
        assert quick(x, layout, params) is None
    assert not runner.calls


class _Unpacked:
    """A stand-in for nn.packed_sequences.Unpacked: pads to x when asked, its steps-left state given."""

    def __init__(self, x, steps):
        self.padded_x, self.steps, self.x, self.pads = x, steps, None, []

    def pad(self, hidden, layers):
        self.pads.append((hidden, layers))
        self.x = self.padded_x

    def sorted(self, states):
        return list(states)

    def unsorted(self, states):
        return list(states)

    def pack(self, y):
        return ("packed", y)


def test_a_packed_sequences_call_goes_to_the_lane_made_with_its_padding(kept, monkeypatch):
    """A kept call made with `rows` (a PackedSequence's padding) hands them to the runner's lane; its
    `packed` goes to that lane with the data and batch sizes where no states are given, time first;
    otherwise (no lane yet, states given, a kept call without rows) the sequence is padded and the call
    made as any kept call, the steps-left state after the states."""
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 77, raising=False)
    _, x, params, zeros, runner = kept
    steps = torch.full((1, 3, 2), 5.0)
    rows = (0xF00, 64, 3)
    quick = QuickCall(x, ("persistent", False), params, runner, [*zeros, steps], rows=rows)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(5, 3, 4), torch.tensor([5, 3, 2]))
    module_layout = ("persistent", True)  # (a batch_first module's: a packed call runs time first)
    with torch.no_grad():
        unpacked = _Unpacked(x, steps)
        quick.packed(unpacked, packed, module_layout, params, None, 2, 1)  # (no lane yet: padded here)
        assert unpacked.pads == [(2, 1)] and runner.calls[-1][1] == [*zeros, steps]
        lane = runner.next_lane = _Lane(("y", ["h", "steps left"]))
        quick(x, ("persistent", False), params, [*zeros, steps])
        assert runner.lanes[-1][-1] == rows
        unpacked = _Unpacked(x, steps)
        assert quick.packed(unpacked, packed, module_layout, params, None, 2, 1) == (("packed", "y"), ["h"])
        assert lane.calls[-1] == (packed.data, packed.batch_sizes, params, 77) and not unpacked.pads
        given = [torch.ones(1, 3, 2)]
        quick.packed(_Unpacked(x, steps), packed, module_layout, params, given, 2, 1)
        assert lane.calls[-1][2] == [*given, steps]  # (states given: padded here, the lane's call)
        assert quick.packed(_Unpacked(x, steps), packed, module_layout, params, [torch.ones(1, 4, 2)],
                            2, 1) is None  # (a state of another shape)
    plain = QuickCall(x, ("persistent", False), params, runner, [*zeros, steps])
    plain._lane = lane
    calls = len(lane.calls)
    with torch.no_grad():
        plain.packed(_Unpacked(x, steps), packed, module_layout, params, None, 2, 1)
    assert lane.calls[-1][0] is x and len(lane.calls) == calls + 1  # (kept without rows: padded here)


def test_a_module_keeps_no_call_on_the_cpu():
    rnn = CellRNN("gru", 6, 8, 1, seed=1)
    with torch.no_grad():
        rnn(torch.randn(4, 2, 6))
    assert rnn._quick is None


def test_a_drop_in_keeps_no_call_on_the_cpu():
    lstm = LSTM(6, 8)
    with torch.no_grad():
        lstm(torch.randn(4, 2, 6))
    assert lstm._quick is None


def test_a_call_that_gives_every_state_goes_to_the_runner_with_them(kept):
    quick, x, params, zeros, runner = kept
    states = [torch.randn(1, 3, 2)]
    with torch.no_grad():
        quick(x, ("persistent", False), params, states)
    assert runner.calls[0][1] is states


@pytest.mark.parametrize("unlike", ["count", "shape", "dtype", "type"])
def test_states_unlike_the_modules_are_left_to_the_whole_path(kept, unlike):
    quick, x, params, _, runner = kept
    state = {"count": torch.randn(1, 3, 2), "shape": torch.randn(2, 3, 2),
             "dtype": torch.randn(1, 3, 2).double(), "type": torch.nn.Parameter(torch.randn(1, 3, 2))}[unlike]
    states = [state, state] if unlike == "count" else [state]
    with torch.no_grad():
        assert quick(x, ("persistent", False), params, states) is None
    assert not runner.calls


def _autocast(monkeypatch, dtype):
    """torch.autocast("cuda") as on, to `dtype` (it is off without a GPU)."""
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device: device == "cuda")
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device: dtype)


def test_a_call_kept_under_autocast_casts_x_and_the_states_again(monkeypatch):
    """A float32 x that torch.autocast cast: a call like it under the same autocast goes to the runner
    with x and the states cast to its dtype, as the whole path casts them."""
    monkeypatch.setattr(ops, "on_device", lambda index: True)
    runner, params = _Runner(), [torch.randn(2)]
    zeros = [torch.zeros(1, 3, 2, dtype=torch.bfloat16)]
    quick = QuickCall(torch.randn(5, 3, 4), ("tensor", False), params, runner, zeros, cast=torch.bfloat16)
    _autocast(monkeypatch, torch.bfloat16)
    x, states = torch.randn(5, 3, 4), [torch.randn(1, 3, 2)]
    with torch.no_grad():
        y, finals = quick(x, ("tensor", False), params)
        quick(x, ("tensor", False), params, states)
    (given, kept_states, *_), (_, given_states, *_) = runner.calls
    assert given.dtype == torch.bfloat16 and torch.equal(given, x.to(torch.bfloat16))
    assert kept_states == zeros and y.dtype == torch.bfloat16
    assert given_states[0].dtype == torch.bfloat16 and torch.equal(given_states[0], states[0].bfloat16())


@pytest.mark.parametrize("unlike", ["autocast off", "another dtype", "x already 16-bit", "a state's type"])
def test_a_call_kept_under_autocast_is_left_to_the_whole_path_unlike_it(monkeypatch, unlike):
    monkeypatch.setattr(ops, "on_device", lambda index: True)
    runner, params = _Runner(), [torch.randn(2)]
    quick = QuickCall(torch.randn(5, 3, 4), ("tensor", False), params, runner,
                      [torch.zeros(1, 3, 2, dtype=torch.float16)], cast=torch.float16)
    x, states = torch.randn(5, 3, 4), None
    if unlike != "autocast off":
        _autocast(monkeypatch, torch.bfloat16 if unlike == "another dtype" else torch.float16)
    if unlike == "x already 16-bit":
        x = x.half()
    elif unlike == "a state's type":
        states = [torch.nn.Parameter(torch.randn(1, 3, 2))]
    with torch.no_grad():
        assert quick(x, ("tensor", False), params, states) is None
    assert not runner.calls


def test_a_kept_call_whose_runner_is_gone_is_left_to_the_whole_path(monkeypatch):
    monkeypatch.setattr(ops, "on_device", lambda index: True)
    x, params = torch.randn(5, 3, 4), [torch.randn(2)]
    quick = QuickCall(x, ("graph", False), params, _Runner(), [torch.zeros(1, 3, 2)])  # (held by none)
    with torch.no_grad():
        assert quick(x, ("graph", False), params) is None


def test_a_modules_kept_call_is_not_made_again_once_dropout_applies(monkeypatch):
    """Between layers, dropout applies only while training: after train(), or a new dropout, the call
    takes the whole path (a kept call made on the CPU here, where modules keep none)."""
    monkeypatch.setattr(ops, "on_device", lambda index: True)
    runners = []

    def keep_on_the_cpu(x, time_first, layout, params, zeros, *rest, **options):
        runners.append(_Runner())
        return QuickCall(x, layout, params, runners[-1], zeros)
    monkeypatch.setattr(cell_rnn, "kept_call", keep_on_the_cpu)
    rnn = CellRNN("lstm", 6, 8, 2, dropout=0.5, seed=1).eval()
    x = torch.randn(4, 2, 6)
    with torch.no_grad():
        rnn(x)
        rnn(x)
        assert len(runners[0].calls) == 1  # eval: no dropout, a call like the one before
        rnn.train()
        y, _ = rnn(x)
        rnn.eval()
        rnn.dropout = 0.25
        rnn(x)
    assert len(runners[0].calls) == 1 and all(not r.calls for r in runners[1:])
    rnn._quick = None  # (its runner a stand-in)
    with torch.no_grad():
        want = rnn(x)[0]  # in eval, the whole path
    assert y.shape == want.shape and (y - want).abs().max() > 1e-3  # dropout applied while training


def test_the_runners_lane_makes_the_next_calls_and_leaves_to_python_what_it_cannot(kept, monkeypatch):
    quick, x, params, zeros, runner = kept
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0x51, raising=False)
    refusing, answered = _Lane(None), _Lane(("y", ["final"]))
    with torch.no_grad():
        runner.next_lane = refusing
        quick(x, ("persistent", False), params)  # (no lane yet: Python's call, which asks for one)
        (lane, given, given_params, given_zeros, batch_first, _), = runner.lanes
        assert lane is None and given is x and given_params is params and given_zeros == zeros
        assert not batch_first
        states = [torch.ones(1, 3, 2)]
        quick(x, ("persistent", False), params, states)  # refused by the lane: Python's call again
        assert refusing.calls == [(x, params, states, 0x51)] and len(runner.calls) == 2
        assert runner.lanes[-1][0] is refusing  # (given back to the runner to teach or replace)
        runner.next_lane = answered
        quick(x, ("persistent", False), params)
        assert quick(x, ("persistent", False), params) == ("y", ["final"])  # the lane's answer
        assert len(runner.calls) == 3 and len(answered.calls) == 1
        assert quick(x, ("tensor", False), params) is None  # another layout: neither
        assert len(answered.calls) == 1


def test_a_kept_training_call_goes_to_the_ops_with_its_steps_saved(kept, monkeypatch):
    """A training call kept (train: the ops' cell, hidden size, layers, float32 states) goes to ops.run with
    save, x time first, the forward direction, the float32 states, and the states or the kept zeros; an
    inference call, or parameters that require gradients otherwise than then, are left to the whole path."""
    _, x, params, zeros, runner = kept
    params = [p.requires_grad_() for p in params]
    calls = []

    def run(x, states, params, cell, hidden, layers, schedule, save, direction, float32):
        calls.append((x, states, params, cell, hidden, layers, schedule, save, direction, float32))
        return [x[..., :2] * 2, *(s + 1 for s in states), torch.empty(0)]
    monkeypatch.setattr(ops, "run", run)
    layout = ("persistent", True)
    quick = QuickCall(x, layout, params, runner, zeros, ("cell text", 2, 1, "float32:c"))
    given = torch.randn(5, 3, 4)
    y, finals = quick(given, layout, params)
    (time_first, states, given_params, *rest), = calls
    assert time_first.shape == (3, 5, 4) and torch.equal(time_first, given.transpose(0, 1))
    assert states == zeros and given_params is params
    assert rest == ["cell text", 2, 1, "persistent", True, ops.FORWARD, "float32:c"]
    assert torch.equal(y, given[..., :2] * 2) and torch.equal(finals[0], torch.ones(1, 3, 2))
    with torch.no_grad():
        assert quick(given, layout, params) is None
    params[1].requires_grad_(False)
    assert quick(given, layout, params) is None
    assert len(calls) == 1 and not runner.calls


class _Delegate:
    """A CPU runner (the numpy executor's, the real one) standing in for a GPU runner: forward as it does,
    and no C++ lane; its forward calls recorded."""

    def __init__(self, runner):
        self.runner, self.lock, self.calls = runner, threading.Lock(), []

    def forward(self, x, states, params, save, shared):
        self.calls.append((x, states))
        return self.runner.forward(x, states, params, save, shared)

    def call_lane(self, lane, x, params, zeros, batch_first, rows=None):
        return None


@pytest.fixture
def kept_on_the_cpu(monkeypatch):
    """quick_call.kept_call as on a GPU, over the CPU's runners (each wrapped in a _Delegate): returns the
    delegates made, by the ops' direction, x's width and the count of states (a call of rows of their
    own lengths has one more: the steps-left state)."""
    monkeypatch.setattr(ops, "on_device", lambda index: True)
    made = {}

    def keep(x, time_first, layout, params, zeros, cell, hidden, layers, float32, rows=None, cast=None,
             direction=FORWARD):
        if torch.is_grad_enabled():
            return None
        runner = made.setdefault((direction, time_first.shape[2], len(zeros)), _Delegate(
            ops.runner(cell, time_first, hidden, layers, layout[0], direction, float32)))
        return QuickCall(x, layout, params, runner, zeros, None, rows, cast, direction)
    monkeypatch.setattr(quick_call, "kept_call", keep)
    monkeypatch.setattr(quick_call, "layer_call_keepable", lambda x: not torch.is_grad_enabled())
    return made


@pytest.mark.parametrize("make", ["cellrnn", "drop-in"])
def test_a_bidirectional_layers_directions_are_kept_each_and_give_the_whole_paths_results(
        kept_on_the_cpu, monkeypatch, make):
    """Each direction of each layer of a bidirectional stack keeps its inference call: the next call like
    it goes to its runner (the reverse direction with x reversed in time) without the whole path, over
    zeros of its own or the states given, with the whole path's results; a call with gradients to follow
    takes the whole path (one of rows of their own lengths is kept apart: the test below)."""
    torch.manual_seed(0)
    rnn = (CellRNN("lstm", 6, 5, 2, bidirectional=True, seed=2) if make == "cellrnn"
           else LSTM(6, 5, 2, bidirectional=True)).double()
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    entered, whole = [], stacks.run
    monkeypatch.setattr(stacks, "run", lambda *a, **k: entered.append(1) or whole(*a, **k))

    def call(states=None, lengths=None):
        if make == "cellrnn":
            y, finals = rnn(x, states, lengths)
            return y, [finals[s] for s in rnn.state_ids]
        y, (h, c) = rnn(x, None if states is None else (states["h"], states["c"]))
        return y, [h, c]
    with torch.no_grad():
        want = call()
        assert len(entered) == 4  # two layers, two directions: the whole path
        got = call()
        assert len(entered) == 4  # every direction of every layer kept
        states = {s: torch.randn(4, 3, 5, dtype=torch.float64) for s in ("h", "c")}
        want_given = call(states)  # (kept too: every state given, slices of them)
        assert len(entered) == 4
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # on the CPU the directions run one after the other; each layer's and direction's runner made
    # two calls: over the kept zeros, then over the states given (slices of them)
    assert sorted(kept_on_the_cpu) == [(FORWARD, 6, 2), (FORWARD, 10, 2), (REVERSE, 6, 2), (REVERSE, 10, 2)]
    for runner in kept_on_the_cpu.values():
        (_, zeros), (_, given) = runner.calls
        assert all(made_here(z) and not z.any() for z in zeros)
        assert [s.shape for s in given] == [(1, 3, 5)] * 2 and not any(made_here(s) for s in given)
    (reverse_x, _), _ = kept_on_the_cpu[REVERSE, 6, 2].calls
    torch.testing.assert_close(reverse_x, x.flip(0), rtol=0, atol=0)  # the first layer's, reversed
    rnn._kept_layers._calls.clear()
    with torch.no_grad():
        for a, b in zip(call(states), want_given, strict=True):  # the whole path's, with the states given
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    entered.clear()
    call()[0].sum().backward()  # gradients to follow: the whole path, and nothing kept
    assert len(entered) == 4 and not rnn._kept_layers._calls


@pytest.mark.parametrize("make", ["cellrnn", "cellrnn packed", "drop-in packed"])
def test_a_bidirectional_layers_calls_of_rows_of_their_own_lengths_are_kept_apart(
        kept_on_the_cpu, monkeypatch, make):
    """A bidirectional stack's inference call of rows of their own lengths (CellRNN's `lengths=`, or a
    PackedSequence) keeps each layer's and direction's call apart from its plain one: the next call like
    it, of other lengths, goes to the kept runners (the cell that runs each row to its own length) with
    its own steps-left state after the zeros or the states given, without the whole path, with the whole
    path's results; a plain call keeps its own, and neither drops the other."""
    from torch.nn.utils.rnn import pack_padded_sequence

    torch.manual_seed(0)
    rnn = (LSTM(6, 5, 2, bidirectional=True) if make == "drop-in packed"
           else CellRNN("lstm", 6, 5, 2, bidirectional=True, seed=2)).double()
    x = torch.randn(5, 3, 6, dtype=torch.float64)
    entered, whole = [], stacks.run
    monkeypatch.setattr(stacks, "run", lambda *a, **k: entered.append(1) or whole(*a, **k))

    def call(lengths=None, states=None):
        given = x if lengths is None or make == "cellrnn" else pack_padded_sequence(
            x, torch.tensor(lengths), enforce_sorted=False)
        if make == "drop-in packed":
            y, (h, c) = rnn(given, None if states is None else (states["h"], states["c"]))
            finals = [h, c]
        else:
            y, by_id = rnn(given, states, lengths) if make == "cellrnn" else rnn(given, states)
            finals = [by_id[s] for s in ("h", "c")]
        return [y if lengths is None or make == "cellrnn" else y.data, *finals]
    states = {s: torch.randn(4, 3, 5, dtype=torch.float64) for s in ("h", "c")}
    with torch.no_grad():
        call([4, 2, 5])
        assert len(entered) == 4  # two layers, two directions: the whole path
        got = call([3, 5, 1])
        got_given = call([2, 2, 5], states)
        assert len(entered) == 4  # of other lengths, with and without states: kept
        call()
        assert len(entered) == 8  # a plain call: the whole path, then kept beside the others
        call()
        again = call([3, 5, 1])
        assert len(entered) == 8
        assert sorted(k for k in kept_on_the_cpu if k[2] == 3) == [(FORWARD, 6, 3), (FORWARD, 10, 3),
                                                                   (REVERSE, 6, 3), (REVERSE, 10, 3)]
        wants = []
        for lengths, given in (([3, 5, 1], None), ([2, 2, 5], states)):  # the whole path's
            rnn._kept_layers._calls.clear()
            wants.append(call(lengths, given))
        want, want_given = wants
        assert len(entered) == 16
    for a, b in zip([*got, *got_given, *again], [*want, *want_given, *want], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_layers_call_kept_one_way_drops_the_same_direction_kept_the_other_way(kept_on_the_cpu):
    """`auto` may run a layer's directions side by side at one size and one after the other at another:
    a call kept one way drops the layer's call of the same direction kept the other way (no call like
    the new one would make it), and only that one."""
    from cellfuse.nn.runners import FORWARD_BESIDE, REVERSE_BESIDE
    from cellfuse.nn.zeros import Zeros

    kept = quick_call.KeptLayers(Zeros())
    rnn = CellRNN("gru", 4, 3, 1, seed=1)
    x, params, cell = torch.randn(5, 2, 4), rnn._params(), rnn._cell_text
    with torch.no_grad():
        for direction in (FORWARD, REVERSE, REVERSE_BESIDE):
            kept.keep(0, direction, x, params, 1, cell, 3, "graph", "")
        assert sorted(kept._calls) == [(0, FORWARD, False), (0, REVERSE_BESIDE, False)]
        kept.keep(1, FORWARD_BESIDE, x, params, 1, cell, 3, "graph", "")
        assert sorted(kept._calls) == [(0, FORWARD, False), (0, REVERSE_BESIDE, False),
                                       (1, FORWARD_BESIDE, False)]
    kept.keep(0, FORWARD, x, params, 1, cell, 3, "graph", "")  # with gradients: not kept, and dropped
    assert sorted(kept._calls) == [(0, REVERSE_BESIDE, False), (1, FORWARD_BESIDE, False)]


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_call_of_rows_of_their_own_lengths_is_kept_and_gives_the_whole_paths_results(
        kept_on_the_cpu, monkeypatch, batch_first):
    """A module called over rows of their own lengths keeps that call apart from its plain one: the next
    call like it, of any lengths, goes to the kept runner (the cell that runs each row to its own length)
    with its padding zeroed and its own steps-left state after the zeros or the states given, without the
    whole path, with the whole path's results; lengths out of bounds are refused there too; a plain call
    keeps its own kept call; a call it turns down gets the whole path's errors and results, its lengths
    (an iterator of them too) read once."""
    monkeypatch.setattr(cell_rnn, "kept_call", quick_call.kept_call)  # (the fixture's, for the plain call)
    torch.manual_seed(1)
    rnn = CellRNN("lstm", 6, 5, 2, seed=3, batch_first=batch_first).double()
    entered, whole = [], stacks.run
    monkeypatch.setattr(stacks, "run", lambda *a, **k: entered.append(1) or whole(*a, **k))

    def x_of(seed):
        x = torch.randn(7, 4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        return x.transpose(0, 1).contiguous() if batch_first else x

    def whole_path(x, lengths, states=None):
        kept = rnn._quick_lengths
        rnn._quick_lengths = None
        try:
            return rnn(x, states, lengths)
        finally:
            rnn._quick_lengths = kept
    with torch.no_grad():
        rnn(x_of(0), lengths=[7, 2, 5, 1])
        assert len(entered) == 1 and rnn._quick_lengths is not None
        plain = rnn(x_of(0))[0]
        assert len(entered) == 2 and rnn._quick_lengths is not None and rnn._quick is not None
        for seed, lengths in enumerate(([3, 7, 7, 1], torch.tensor([1, 1, 2, 6]))):
            x = x_of(seed + 1)
            time_x = x.transpose(0, 1) if batch_first else x
            time_x[6:, 3] = float("nan")  # (padding past a row's length may hold anything)
            got = rnn(x, lengths=lengths)
            assert len(entered) == 2  # kept
            want = whole_path(x, lengths)
            assert len(entered) == 3
            entered.pop()
            torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
            for s in rnn.state_ids:
                torch.testing.assert_close(got[1][s], want[1][s], rtol=0, atol=0)
        states = {s: torch.randn(2, 4, 5, dtype=torch.float64) for s in rnn.state_ids}
        got, want = rnn(x, states, [2, 3, 4, 5]), whole_path(x, [2, 3, 4, 5], states)
        assert len(entered) == 3  # (the states given: kept too; the whole path's once)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        with pytest.raises(cell_rnn.CellError, match="from 1 to the sequence's length 7"):
            rnn(x, lengths=[8, 1, 1, 1])
        torch.testing.assert_close(rnn(x_of(0))[0], plain, rtol=0, atol=0)
        assert len(entered) == 3  # the plain call still kept
        # calls the kept one turns down get the whole path's errors and results, their lengths read once
        with pytest.raises(cell_rnn.CellError, match="and x is torch.float32"):
            rnn(x.float(), lengths=iter([2, 3, 4, 5]))
        with pytest.raises(cell_rnn.CellError, match="T and B at least 1"):
            rnn(x[:0] if batch_first else x[:, :0], lengths=[])
        shorter = x[:, :5] if batch_first else x[:5]
        got = rnn(shorter, lengths=iter([2, 5, 4, 1]))[0]
        torch.testing.assert_close(got, whole_path(shorter, [2, 5, 4, 1])[0], rtol=0, atol=0)
    assert sorted(kept_on_the_cpu) == [(FORWARD, 6, 2), (FORWARD, 6, 3)]  # (h, c; and the steps left)
    assert len(kept_on_the_cpu[FORWARD, 6, 3].calls) == 3 and len(kept_on_the_cpu[FORWARD, 6, 2].calls) == 1
