"""Which runs of a StreamProgram replay a captured CUDA graph (StreamProgram.run with `keep`): the second
run over the same bases captures, later ones replay, the last MAX_KEPT_RUNS are kept, and a capture that
fails leaves every run to launch. The capture itself is a stand-in here; the GPU tests run the real one
(tests/nn/test_kept_runs.py)."""

from __future__ import annotations

import logging
from collections import OrderedDict

import pytest

from cellfuse.gpu_runtime.stream_program import MAX_KEPT_RUNS, StreamProgram
from cellfuse.graph_model import CellError


class _Program(StreamProgram):
    """A program's bookkeeping of kept runs, with captures and releases counted instead of made."""

    def __init__(self, fail: bool = False):  # (none of StreamProgram's: it would load kernels)
        self.what, self.fail = "the test's program", fail
        self._kept, self._seen_once = OrderedDict(), OrderedDict()
        self.captured, self.released = [], []

    def capture(self, bases):
        if self.fail:
            raise CellError("cuStreamBeginCapture: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
        self.captured.append(bases)
        return ("graph", bases)

    def release(self, graph):
        self.released.append(graph)


def test_the_second_run_over_the_same_bases_captures_and_later_ones_replay_it():
    p = _Program()
    assert p._kept_run((1, 2)) is None  # seen once: launched
    assert p._kept_run((3, 4)) is None
    graph = p._kept_run((1, 2))
    assert graph == ("graph", (1, 2)) and p.captured == [(1, 2)]
    assert p._kept_run((1, 2)) is graph and p.captured == [(1, 2)]  # replayed, not captured again
    assert p._kept_run((3, 4)) == ("graph", (3, 4))


def test_only_the_last_runs_stay_captured():
    p = _Program()
    keys = [(i,) for i in range(MAX_KEPT_RUNS + 1)]
    for key in keys:
        p._kept_run(key)
        p._kept_run(key)
    assert p.released == [("graph", keys[0])]  # the least recently run
    assert list(p._kept) == keys[1:]
    p._kept_run(keys[1])  # run again: now the most recent
    p._kept_run((99,)), p._kept_run((99,))
    assert p.released[-1] == ("graph", keys[2])


def test_runs_seen_once_are_forgotten_past_a_bound():
    p = _Program()
    for i in range(2 * MAX_KEPT_RUNS + 1):
        p._kept_run((i,))
    assert (0,) not in p._seen_once and len(p._seen_once) == 2 * MAX_KEPT_RUNS
    assert p._kept_run((0,)) is None  # seen once again, not twice


def test_forgetting_releases_every_kept_run():
    p = _Program()
    for key in [(1,), (1,), (2,), (2,), (3,)]:
        p._kept_run(key)
    p._forget_kept()
    assert sorted(p.released) == [("graph", (1,)), ("graph", (2,))]
    assert not p._kept and not p._seen_once
    assert p._kept_run((3,)) is None  # (3,) was seen once before: forgotten too


def test_a_capture_that_fails_leaves_every_run_to_launch(caplog):
    p = _Program(fail=True)
    p._kept_run((1,))
    with caplog.at_level(logging.WARNING):
        assert p._kept_run((1,)) is None
    assert "could not be captured" in caplog.text and "the test's program" in caplog.text
    assert p._kept is None


@pytest.mark.parametrize("keep", [False, True])
def test_run_replays_only_where_the_caller_says_it_may(keep):
    p = _Program()
    launched, replayed = [], []
    p.order = lambda stream: None
    p.calls = type("Calls", (), {"run": lambda self, bases, stream: launched.append(tuple(bases))})()
    p.replay = lambda graph, stream: replayed.append(graph)
    for _ in range(3):
        p.run([5, 6], 7, keep)
    if keep:
        assert launched == [(5, 6)] and replayed == [("graph", (5, 6))] * 2
    else:
        assert launched == [(5, 6)] * 3 and not replayed and not p.captured
