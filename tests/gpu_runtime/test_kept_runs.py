"""Which runs of a StreamProgram replay a captured CUDA graph (StreamProgram.run with `keep`): the second
run over the same bases captures, later ones replay, the last MAX_KEPT_RUNS are kept, and a capture or a
replay that fails, or captures that are seldom replayed, leave every run to launch. The capture itself is
a stand-in here; the GPU tests run the real one (tests/nn/test_kept_runs.py)."""

from __future__ import annotations

import logging
from collections import OrderedDict

import pytest

from cellfuse.gpu_runtime.stream_program import CAPTURES_ON_TRIAL, MAX_KEPT_RUNS, StreamProgram
from cellfuse.graph_model import CellError


class _Program(StreamProgram):
    """A program's bookkeeping of kept runs, with captures and releases counted instead of made."""

    def __init__(self, fail: bool = False):  # (none of StreamProgram's: it would load kernels)
        self.what, self.fail = "the test's program", fail
        self._kept, self._seen_once = OrderedDict(), OrderedDict()
        self._captures = self._replays = 0
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


def test_a_run_kept_at_first_is_captured_at_its_first_sighting():
    p = _Program()
    assert p._kept_run((1, 2)) is None  # seen once
    graph = p._kept_run((3, 4), at_first=True)
    assert graph == ("graph", (3, 4)) and p.captured == [(3, 4)]
    assert p._kept_run((3, 4)) is graph and p.captured == [(3, 4)]
    assert p._kept_run((1, 2), at_first=True) == ("graph", (1, 2)) and not p._seen_once


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


def _launching(p):
    """The program's launches and replays counted, not made."""
    launched, replayed = [], []
    p.order = lambda stream: None
    p.calls = type("Calls", (), {"run": lambda self, bases, stream: launched.append(tuple(bases))})()
    p.replay = lambda graph, stream: replayed.append(graph)
    return launched, replayed


def test_a_replay_that_fails_launches_instead_and_every_run_after_it(caplog):
    p = _Program()
    launched, _ = _launching(p)

    def failing(graph, stream):
        raise CellError("CUDA driver error CUDA_ERROR_OUT_OF_MEMORY while replaying")
    p.replay = failing
    p.run([1], 0, True), p.run([1], 0, True)  # launched, then captured and its replay failed: launched
    assert launched == [(1,), (1,)] and p._kept is None and p.released == [("graph", (1,))]
    assert "could not be replayed" in caplog.text
    p.run([1], 0, True)
    assert launched == [(1,)] * 3


def test_captures_that_are_seldom_replayed_stop(caplog):
    p = _Program()
    launched, replayed = _launching(p)
    turns = [[i] for i in range(2 * MAX_KEPT_RUNS)]  # twice as many sets of bases in turn as are kept
    with caplog.at_level(logging.WARNING):
        for _ in range(2 * CAPTURES_ON_TRIAL):
            for bases in turns:
                p.run(bases, 0, True)
    assert p._kept is None and len(p.captured) == CAPTURES_ON_TRIAL
    assert "were replayed" in caplog.text
    runs = len(launched) + len(replayed)
    before = len(launched)
    p.run([0], 0, True)
    assert len(launched) == before + 1 and runs == 2 * CAPTURES_ON_TRIAL * len(turns)


def test_a_program_whose_captures_pay_keeps_capturing():
    p = _Program()
    _launching(p)
    for round in range(CAPTURES_ON_TRIAL + 5):
        for i in range(MAX_KEPT_RUNS):
            for _ in range(3):
                p.run([round, i], 0, True)  # each set of bases three times: captured, replayed
    assert p._kept is not None and len(p.captured) == (CAPTURES_ON_TRIAL + 5) * MAX_KEPT_RUNS
