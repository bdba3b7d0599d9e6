"""When a module's calls of its layers one at a time are captured into one CUDA graph, replayed, or made by
the whole path (nn.stack_graph.KeptStack), on the CPU: the capture and the replays stand in for the
GPU's."""

from __future__ import annotations

import pytest
import torch

from cellfuse.nn import stack_graph
from cellfuse.nn.stack_graph import KeptStack


class _Replayed:
    def __init__(self, key, params):
        self.key, self.params = key, params

    def replay(self, x, initial, steps):
        return "replayed", []


@pytest.fixture
def on_a_gpu(monkeypatch):
    """Every call keepable, keyed by `what` and x's shape; a capture that works unless `fails` holds its
    key; the calls of the whole path and the captures listed."""
    made = {"runs": [], "captures": [], "fails": set()}
    monkeypatch.setattr(stack_graph, "_keepable", lambda x, lengths: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(stack_graph, "_key", lambda what, x, initial, lengths, steps: (what, x.shape))

    def capture(key, x, initial, steps, params, run):
        made["captures"].append(key)
        return None if key in made["fails"] else _Replayed(key, params)
    monkeypatch.setattr(KeptStack, "_capture", staticmethod(capture))
    return made


def _call(stack, made, x, params):
    def run(x, initial, steps, keep):
        made["runs"].append(keep)
        return "whole path", []
    return stack("lstm", x, [], None, None, params, run)[0]


def test_the_second_call_like_the_first_is_captured_and_the_next_replayed(on_a_gpu):
    stack, x, params = KeptStack(), torch.zeros(3, 2), [torch.nn.Parameter(torch.ones(4))]
    assert [_call(stack, on_a_gpu, x, params) for _ in range(4)] == [
        "whole path", "replayed", "replayed", "replayed"]
    assert (stack.captures, stack.replays) == (1, 2)
    assert on_a_gpu["runs"] == [True]  # (the whole path with its layers' kept calls)
    assert _call(stack, on_a_gpu, torch.zeros(5, 2), params) == "whole path"  # (unlike it)
    assert _call(stack, on_a_gpu, x, params) == "replayed"  # (the graph kept)


def test_a_parameter_changed_in_place_takes_the_whole_path_once_then_is_captured_again(on_a_gpu):
    stack, x, params = KeptStack(), torch.zeros(3, 2), [torch.nn.Parameter(torch.ones(4))]
    for _ in range(3):
        _call(stack, on_a_gpu, x, params)
    with torch.no_grad():
        params[0].mul_(2)
    assert [_call(stack, on_a_gpu, x, params) for _ in range(3)] == ["whole path", "replayed", "replayed"]
    assert stack.captures == 2
    other = [torch.nn.Parameter(torch.ones(4))]  # (other parameters: unlike it)
    assert _call(stack, on_a_gpu, x, other) == "whole path"


def test_tensors_that_are_no_parameters_are_never_captured(on_a_gpu):
    stack, x, params = KeptStack(), torch.zeros(3, 2), [torch.ones(4)]
    assert [_call(stack, on_a_gpu, x, params) for _ in range(3)] == ["whole path"] * 3
    assert on_a_gpu["captures"] == []


def test_a_capture_that_failed_is_not_tried_again(on_a_gpu):
    stack, x, params = KeptStack(), torch.zeros(3, 2), [torch.nn.Parameter(torch.ones(4))]
    on_a_gpu["fails"].add(("lstm", x.shape))
    assert [_call(stack, on_a_gpu, x, params) for _ in range(4)] == ["whole path"] * 4
    assert len(on_a_gpu["captures"]) == 1


def test_calls_on_the_cpu_are_made_by_the_whole_path():
    stack, made = KeptStack(), {"runs": []}
    params = [torch.nn.Parameter(torch.ones(4))]
    with torch.no_grad():
        assert [_call(stack, made, torch.zeros(3, 2), params) for _ in range(3)] == ["whole path"] * 3
    assert stack.captures == 0


def test_a_call_like_the_last_replayed_one_is_replayed_from_the_modules_own_key(on_a_gpu):
    """`took` keeps the module's key of a call that was replayed (not of one the whole path made), and
    `front` replays a call of that key while the module's parameters are as then."""
    stack, x, params = KeptStack(), torch.zeros(3, 2), [torch.nn.Parameter(torch.ones(4))]
    held = [torch.nn.Parameter(torch.ones(2))]  # (the module's parameters, as it holds them)
    with torch.no_grad():
        for _ in range(2):
            _call(stack, on_a_gpu, x, params)
            stack.took("its key", held)
        assert stack.front("its key", held, x, None) == ("replayed", [])
        assert stack.front("another key", held, x, None) is None
        assert (stack.captures, stack.replays) == (1, 1)
        held[0].mul_(2)  # (changed in place: the module's path, then a replay again)
        assert stack.front("its key", held, x, None) is None
    with torch.enable_grad():
        assert stack.front("its key", [torch.nn.Parameter(torch.ones(2))], x, None) is None


def test_a_call_the_whole_path_made_leaves_no_key_to_replay(on_a_gpu):
    stack, x, params = KeptStack(), torch.zeros(3, 2), [torch.nn.Parameter(torch.ones(4))]
    held = [torch.nn.Parameter(torch.ones(2))]
    with torch.no_grad():
        for _ in range(2):
            _call(stack, on_a_gpu, x, params)
            stack.took("its key", held)
        _call(stack, on_a_gpu, torch.zeros(5, 2), params)  # (unlike it: the whole path)
        stack.took("its key", held)
        assert stack.front("its key", held, x, None) is None
        stack.took("its key", held)  # (no call through it since: nothing replayed)
        assert stack.front("its key", held, x, None) is None
