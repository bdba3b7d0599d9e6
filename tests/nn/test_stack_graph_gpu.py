"""On a GPU: a module's inference calls of its layers one at a time (two directions) are captured whole
into one CUDA graph at the second call like the first (nn.stack_graph) and replayed from then on, with
the whole path's results to the bit and torch's within float32 rounding, reading x, hx and the weights
as they are at each call; whatever is unlike the captured call (other lengths, another stream, a
parameter changed in place, a training call) takes the whole path."""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence

from cellfuse.nn import LSTM, CellRNN, stack_graph
from cellfuse.nn.cuda_runner import CudaRunner
from cellfuse.nn.stack_graph import KeptStack

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("settled_memory")]

T, INPUT, H = 20, 32, 48  # each test its own batch size: runners are the process's


def _whole_path(module, *args):
    """The module's call through the whole path (its captured call set aside for it)."""
    kept = module._kept_layers.stack
    module._kept_layers.stack = KeptStack()
    try:
        return module(*args)
    finally:
        module._kept_layers.stack = kept


def _exact(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("layers, batch_first, given, schedule, batch", [
    (1, False, False, "tensor", 9), (2, True, True, "tensor", 10), (2, False, False, "persistent", 11),
    (1, True, True, "auto", 12)])
def test_a_bidirectional_stacks_calls_replay_one_graph_with_the_whole_paths_results(
        cuda, monkeypatch, layers, batch_first, given, schedule, batch):
    lstm = LSTM(INPUT, H, layers, batch_first=batch_first, bidirectional=True, schedule=schedule).to(cuda)
    torchs = torch.nn.LSTM(INPUT, H, layers, batch_first=batch_first, bidirectional=True).to(cuda)
    torchs.load_state_dict(lstm.state_dict())
    shape = (batch, T, INPUT) if batch_first else (T, batch, INPUT)
    hx = tuple(torch.randn(2 * layers, batch, H, device=cuda) for _ in range(2)) if given else None
    packings = []
    whole = CudaRunner._packed_in_one_call

    def packing(runner, *a, **k):
        packings.append(torch.cuda.is_current_stream_capturing())
        return whole(runner, *a, **k)
    monkeypatch.setattr(CudaRunner, "_packed_in_one_call", packing)
    entered, inner = [], KeptStack.__call__

    def through_the_module(stack, *a, **k):
        entered.append(stack)
        return inner(stack, *a, **k)
    monkeypatch.setattr(KeptStack, "__call__", through_the_module)
    stack = lstm._kept_layers.stack
    with torch.no_grad():
        x = torch.randn(shape, device=cuda)
        lstm(x, hx)  # (the whole path: compiled, measured, its lanes made)
        assert stack.captures == 0 and stack.replays == 0
        outs = [lstm(x, hx) for _ in range(3)]  # captured, then replayed
        assert stack.captures == 1 and stack.replays == 2
        assert len(entered) == 2  # (the replays made straight from the module's arguments)
        assert True not in packings  # (the graph reads the weights packed where they are)
        if schedule != "auto":  # (side by side: each layer's persistent kernels made to start together)
            assert stack._graph.together > 0
        want, (want_h, want_c) = _whole_path(lstm, x, hx)
        for got, (h, c) in outs:
            for a, b in ((got, want), (h, want_h), (c, want_c)):
                _exact(a, b)
        # new values in x and hx where they are, and in a new x: read by the replays
        held = outs[-1][0].clone()
        x.copy_(torch.randn_like(x))
        if hx is not None:
            hx[0].mul_(0.5)
        other = torch.randn(shape, device=cuda)
        got, (h, c) = lstm(x, hx)
        got_other = lstm(other, hx)[0]
        assert stack.replays == 4
        _exact(outs[-1][0], held)  # (what a caller holds stays as it was)
        want, (want_h, want_c) = _whole_path(lstm, x, hx)
        for a, b in ((got, want), (h, want_h), (c, want_c)):
            _exact(a, b)
        _exact(got_other, _whole_path(lstm, other, hx)[0])
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            theirs, (their_h, their_c) = torchs(x, hx)
        for a, b in ((got, theirs), (h, their_h), (c, their_c)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_a_parameter_changed_in_place_is_seen_and_the_call_captured_again(cuda):
    lstm = LSTM(INPUT, H, 2, bidirectional=True, schedule="tensor").to(cuda)
    x = torch.randn(T, 13, INPUT, device=cuda)
    stack = lstm._kept_layers.stack
    with torch.no_grad():
        for _ in range(3):
            lstm(x)
        assert (stack.captures, stack.replays) == (1, 1)
        lstm.weight_hh_l1_reverse.mul_(0.5)  # (as an optimizer changes it)
        got = lstm(x)[0]  # the whole path, which packs it
        assert (stack.captures, stack.replays) == (1, 1)
        _exact(got, _whole_path(lstm, x)[0])
        again = [lstm(x)[0] for _ in range(2)]  # captured again, replayed
        assert (stack.captures, stack.replays) == (2, 2)
        for y in again:
            _exact(y, got)
        lstm.weight_ih_l0.data = lstm.weight_ih_l0.data * 2  # (another tensor: not the one captured)
        changed = lstm(x)[0]
        assert stack.replays == 2
        _exact(changed, _whole_path(lstm, x)[0])


def test_calls_unlike_the_captured_one_take_the_whole_path(cuda):
    """Another stream, a training call, another batch: each made by the whole path, with its results."""
    lstm = LSTM(INPUT, H, 1, bidirectional=True, schedule="tensor").to(cuda)
    x = torch.randn(T, 14, INPUT, device=cuda)
    stack = lstm._kept_layers.stack
    with torch.no_grad():
        for _ in range(3):
            want = lstm(x)[0]
    assert (stack.captures, stack.replays) == (1, 1)
    side = torch.cuda.Stream(cuda)
    side.wait_stream(torch.cuda.current_stream(cuda))
    with torch.no_grad(), torch.cuda.stream(side):
        on_side = lstm(x)[0]
    torch.cuda.current_stream(cuda).wait_stream(side)
    trained = lstm(x)[0]
    assert trained.requires_grad
    with torch.no_grad():
        smaller = lstm(x[:, :7])[0]
    assert (stack.captures, stack.replays) == (1, 1)
    _exact(on_side, want)
    torch.testing.assert_close(trained.detach(), want, rtol=1e-5, atol=1e-6)
    _exact(smaller, _whole_path(lstm, x[:, :7])[0])


def test_a_call_whose_graph_would_hold_too_much_memory_is_never_kept(cuda, monkeypatch):
    """Above the bound (here every call's), each call takes the whole path, its capture tried once."""
    monkeypatch.setattr(stack_graph, "MAX_GRAPH_BYTES", 0)
    lstm = LSTM(INPUT, H, 1, bidirectional=True, schedule="tensor").to(cuda)
    x = torch.randn(T, 16, INPUT, device=cuda)
    stack = lstm._kept_layers.stack
    tries, capture = [], KeptStack._capture

    def counted(*a, **k):
        tries.append(1)
        return capture(*a, **k)
    monkeypatch.setattr(KeptStack, "_capture", staticmethod(counted))
    with torch.no_grad():
        outs = [lstm(x)[0] for _ in range(4)]
    assert (stack.captures, stack.replays, len(tries)) == (0, 0, 1)
    assert stack._graph is None
    want = _whole_path(lstm, x)[0]
    for got in outs:
        _exact(got, want)


def test_packed_sequences_of_the_captured_lengths_replay_and_others_take_the_whole_path(cuda):
    lstm = LSTM(INPUT, H, 2, batch_first=True, bidirectional=True, schedule="tensor").to(cuda)
    torchs = torch.nn.LSTM(INPUT, H, 2, batch_first=True, bidirectional=True).to(cuda)
    torchs.load_state_dict(lstm.state_dict())
    batch = 15
    lengths = torch.randint(1, T + 1, (batch,))
    lengths[3] = T
    x = torch.randn(batch, T, INPUT, device=cuda)
    packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    stack = lstm._kept_layers.stack
    with torch.no_grad():
        outs = [lstm(packed) for _ in range(4)]
        assert (stack.captures, stack.replays) == (1, 2)
        want, (want_h, want_c) = _whole_path(lstm, packed)
        for got, (h, c) in outs:
            for a, b in ((got.data, want.data), (h, want_h), (c, want_c)):
                _exact(a, b)
        # the same lengths in another order: the same padded call (rows in the data's order), replayed;
        # other lengths: the whole path
        flipped = pack_padded_sequence(x, lengths.flip(0), batch_first=True, enforce_sorted=False)
        other = pack_padded_sequence(x, (lengths - 1).clamp(min=1), batch_first=True, enforce_sorted=False)
        for given, replays in ((flipped, 3), (other, 3)):
            got, (h, c) = lstm(given)
            assert stack.replays == replays
            with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
                theirs, (their_h, their_c) = torchs(given)
            for a, b in ((got.data, theirs.data), (h, their_h), (c, their_c)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_bidirectional_cellrnn_with_lengths_replays_the_whole_paths_results(cuda, dtype):
    rnn = CellRNN("gru", INPUT, H, 2, bidirectional=True, schedule="tensor", seed=5).to(cuda)
    batch = 16 if dtype == torch.bfloat16 else 17
    x = torch.randn(T, batch, INPUT, device=cuda, dtype=dtype)
    lengths = torch.randint(1, T + 1, (batch,))
    stack = rnn._kept_layers.stack
    with torch.no_grad():
        outs = [rnn(x, lengths=lengths) for _ in range(3)]
        assert (stack.captures, stack.replays) == (1, 1)
        want, want_finals = _whole_path(rnn, x, None, lengths)
    for y, finals in outs:
        assert y.dtype == dtype
        _exact(y, want)
        for s in want_finals:
            _exact(finals[s], want_finals[s])


def test_a_bidirectional_cellrnns_calls_with_every_state_replay_from_its_arguments(cuda, monkeypatch):
    rnn = CellRNN("lstm", INPUT, H, 2, bidirectional=True, batch_first=True, schedule="tensor",
                  seed=6).to(cuda)
    x = torch.randn(18, T, INPUT, device=cuda)
    states = {s: torch.randn(4, 18, H, device=cuda) for s in rnn.state_ids}
    entered, inner = [], KeptStack.__call__

    def through_the_module(stack, *a, **k):
        entered.append(stack)
        return inner(stack, *a, **k)
    monkeypatch.setattr(KeptStack, "__call__", through_the_module)
    stack = rnn._kept_layers.stack
    with torch.no_grad():
        outs = [rnn(x, states) for _ in range(4)]
        assert (stack.captures, stack.replays, len(entered)) == (1, 2, 2)
        want, want_finals = _whole_path(rnn, x, states)
    for y, finals in outs:
        _exact(y, want)
        for s in want_finals:
            _exact(finals[s], want_finals[s])
