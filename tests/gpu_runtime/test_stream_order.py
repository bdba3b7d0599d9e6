"""The order a StreamProgram keeps between runs of one loaded module's kernels on two streams (see
StreamProgram.run), on a stand-in for the driver: which stream waits for which, and that nothing is
recorded or waited for under a CUDA graph capture. The GPU test that two modules called at once give
their own results is tests/nn/test_cell_rnn_in_torch.py's."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cellfuse.gpu_runtime import driver, stream_program
from cellfuse.gpu_runtime.stream_program import StreamProgram


class Driver:
    """cuda.bindings' calls that the order makes, on streams named by numbers; `capturing` the streams
    that capture now."""

    CUstreamCaptureStatus = SimpleNamespace(CU_STREAM_CAPTURE_STATUS_NONE=0,
                                            CU_STREAM_CAPTURE_STATUS_ACTIVE=1)

    def __init__(self):
        self.capturing: set[int] = set()
        self.calls: list[tuple[str, int]] = []

    def cuStreamIsCapturing(self, stream):
        return 0, int(stream in self.capturing)

    def cuEventRecord(self, event, stream):
        self.calls.append(("record on", stream))
        return (0,)

    def cuStreamWaitEvent(self, stream, event, flags):
        self.calls.append(("wait on", stream))
        return (0,)


@pytest.fixture
def programs(monkeypatch):
    """Two programs of one loaded module and one of another, on the stand-in; returns it and them."""
    cu = Driver()
    monkeypatch.setattr(driver, "as_stream", lambda handle: handle)
    monkeypatch.setattr(stream_program, "_last_stream", {})
    made = []
    for module in (1, 1, 2):
        program = object.__new__(StreamProgram)
        program.res, program._module_key, program._handover = SimpleNamespace(cu=cu), module, object()
        program.calls = SimpleNamespace(run=lambda bases, stream: None)
        made.append(program)
    return cu, made


def test_a_run_on_another_stream_waits_for_the_last_ones_work(programs):
    cu, (first, second, other) = programs
    first.run([], 10)
    first.run([], 10)
    assert cu.calls == []  # one stream: in order already
    second.run([], 20)  # the same module on another stream
    assert cu.calls == [("record on", 10), ("wait on", 20)]
    other.run([], 30)  # another module: nothing to wait for
    first.run([], 20)
    assert cu.calls == [("record on", 10), ("wait on", 20)]
    first.run([], 10)
    assert cu.calls[2:] == [("record on", 20), ("wait on", 10)]


def test_nothing_is_recorded_or_waited_for_under_a_capture(programs):
    cu, (first, second, _) = programs
    first.run([], 10)
    cu.capturing.add(40)
    second.run([], 40)  # captured: no wait on work outside the capture, and the last stream stays 10
    assert cu.calls == []
    first.run([], 10)
    assert cu.calls == []
    cu.capturing = {10}  # the last stream captures since: nothing recorded on it from outside
    second.run([], 20)
    assert cu.calls == []
    cu.capturing = set()
    first.run([], 10)  # 20 was the last
    assert cu.calls == [("record on", 20), ("wait on", 10)]
