"""The plan of the cell and its CUDA, made off the editor's thread.

Scheduling a cell of a thousand nodes and writing its CUDA takes long enough to be felt between two
edits; the editor asks this worker instead, and goes on showing the last plan until the new one comes
back. One request runs at a time; one made meanwhile waits, and a newer one takes its place (only the
plan of the cell as it is now is worth making). A result that comes back after a newer request was made
is dropped: what it shows is already out of date.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from PySide6 import QtCore

from ..codegen import CudaSource, emit, make_plan
from ..codegen.plan_text import summary
from ..graph_model import Cell, CellError, Sizes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PlanOutcome:
    """A plan's summary (see plan_text.summary) and its CUDA, or why the cell has none."""

    summary: dict | None = None
    source: CudaSource | None = None
    error: str | None = None


def plan_outcome(cell: Cell, sizes: Sizes, schedule: str) -> PlanOutcome:
    """The plan of `cell` at `sizes` under `schedule`, summarised, and its CUDA. Reads the cell only: the
    editor replaces its cell on each edit rather than changing it, so a worker may read one meanwhile."""
    try:
        plan = make_plan(cell, sizes, schedule)
        return PlanOutcome(summary=summary(plan), source=emit(plan))
    except CellError as e:
        return PlanOutcome(error=str(e))
    except Exception as e:  # the compiler's failure must not take the editor down
        log.exception("the scheduler failed on cell '%s'", cell.name)
        return PlanOutcome(error=f"The scheduler failed: {type(e).__name__}: {e}")


class PlanWorker(QtCore.QObject):
    """Makes plans in a thread of its own, newest request first; `ready` brings back the outcome of the
    newest request only."""

    ready = QtCore.Signal(object)  # the PlanOutcome of the newest request
    _done = QtCore.Signal(int, object)  # from the thread: a request's number, its outcome

    def __init__(self, parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = QtCore.QThreadPool(self)
        self._pool.setMaxThreadCount(1)
        self._newest = 0  # the number of the newest request; older outcomes are dropped
        self._waiting: tuple[int, Cell, Sizes, str] | None = None
        self._running = False
        self._done.connect(self._finished, QtCore.Qt.ConnectionType.QueuedConnection)

    def request(self, cell: Cell, sizes: Sizes, schedule: str) -> None:
        """Asks for the plan of `cell`; it replaces any request still waiting."""
        self._newest += 1
        self._waiting = (self._newest, cell, sizes, schedule)
        if not self._running:
            self._start_waiting()

    def drop(self) -> None:
        """Forgets the requests made so far: the outcome of one still running is dropped."""
        self._newest += 1
        self._waiting = None

    @property
    def busy(self) -> bool:
        """Whether a plan is being made or waits to be."""
        return self._running or self._waiting is not None

    def stop(self) -> None:
        """Drops what waits and waits for what runs (before the window goes)."""
        self.drop()
        self._pool.waitForDone()

    def _start_waiting(self) -> None:
        assert self._waiting is not None
        number, cell, sizes, schedule = self._waiting
        self._waiting = None
        self._running = True
        done = self._done
        self._pool.start(lambda: done.emit(number, plan_outcome(cell, sizes, schedule)))

    def _finished(self, number: int, outcome: PlanOutcome) -> None:
        self._running = False
        if self._waiting is not None:
            self._start_waiting()
        if number == self._newest:
            self.ready.emit(outcome)
