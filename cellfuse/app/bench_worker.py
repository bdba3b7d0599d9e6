"""Runs a benchmark (or a sweep) off the GUI thread, reporting progress and honouring Cancel."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from PySide6 import QtCore

from ..graph_model import Cell, CellError

if TYPE_CHECKING:
    from ..gpu_runtime.bench import BenchConfig

log = logging.getLogger(__name__)


class BenchWorker(QtCore.QThread):
    progressed = QtCore.Signal(int, int, str)
    succeeded = QtCore.Signal(object)  # a BenchResult or a SweepResult
    failed = QtCore.Signal(str)

    def __init__(self, cell: Cell, config: BenchConfig, sweep: tuple[str, list[int]] | None = None,
                 parent: QtCore.QObject | None = None) -> None:
        super().__init__(parent)
        self.cell = cell.copy()  # the worker's own copy: the user goes on editing
        self.config = config
        self.sweep = sweep
        self._cancel = threading.Event()

    def cancel(self) -> None:
        self._cancel.set()

    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    def _progress(self, done: int, total: int, message: str) -> None:
        self.progressed.emit(done, total, message)

    def run(self) -> None:
        from ..gpu_runtime.bench import run_benchmark, run_sweep

        try:
            if self.sweep is not None:
                param, values = self.sweep
                result = run_sweep(self.cell, self.config, param, values, self._progress, self.is_cancelled)
            else:
                result = run_benchmark(self.cell, self.config, self._progress, self.is_cancelled)
        except CellError as e:
            self.failed.emit(str(e))
            return
        except Exception as e:  # the run must never take the editor down with it
            log.exception("the benchmark failed")
            self.failed.emit(f"{type(e).__name__}: {e}")
            return
        self.succeeded.emit(result)
