"""Starts the editor: `cellfuse gui [CELL]` calls `run_app`."""

from __future__ import annotations

import logging
import signal
import sys
import traceback
from pathlib import Path

from PySide6 import QtCore, QtWidgets

from . import platform_check, recent_files, theme

log = logging.getLogger(__name__)


def configure_application(app: QtWidgets.QApplication) -> None:
    """Names (for QSettings and the data folder) and the look of the application."""
    app.setOrganizationName(recent_files.ORGANIZATION)
    app.setApplicationName(recent_files.APPLICATION)
    app.setApplicationDisplayName("CellFuse")
    theme.apply_theme(app)


def _log_unexpected(kind, value, tb) -> None:
    """An exception that escaped a slot is logged and said in the status bar, not fatal."""
    log.error("unexpected error:\n%s", "".join(traceback.format_exception(kind, value, tb)))
    app = QtWidgets.QApplication.instance()
    for w in app.topLevelWidgets() if app else []:
        if isinstance(w, QtWidgets.QMainWindow):
            w.statusBar().showMessage(f"Unexpected error: {kind.__name__}: {value}", 10_000)


def run_app(cell_path: str | Path | None = None) -> int:
    """Opens the editor on `cell_path` (or a new LSTM) and runs it; returns the exit code (1, with what
    to install, where Qt's platform plugin could not load)."""
    app = QtWidgets.QApplication.instance()
    if app is None:
        hint = platform_check.platform_hint()
        if hint is not None:
            print(hint, file=sys.stderr)
            return 1
        app = QtWidgets.QApplication(sys.argv[:1])
    configure_application(app)
    from .main_window import MainWindow  # after the application exists

    sys.excepthook = _log_unexpected
    window = MainWindow()
    window.show()
    window.start(cell_path)
    return _exec_ending_on_signals(app, window)


# The exit statuses of the command line (docs/cell-format.md): Ctrl+C 130, SIGTERM 143.
SIGNALS = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (128 + signal.SIGTERM, "terminated")}


def _exec_ending_on_signals(app: QtWidgets.QApplication, window) -> int:
    """Runs the event loop; Ctrl+C and SIGTERM end it as the command line's other commands end, after
    the window keeps its unsaved work in the autosave (offered back at the next start)."""
    def on_signal(signum, frame) -> None:
        status, word = SIGNALS[signum]
        QtCore.QTimer.singleShot(0, lambda: _end(window, status, word))

    previous = {signum: signal.signal(signum, on_signal) for signum in SIGNALS}
    # Python runs a signal handler only between bytecodes: while Qt waits for events, none run. A timer
    # that calls into Python a few times a second lets the handler run.
    ticks = QtCore.QTimer()
    ticks.timeout.connect(lambda: None)
    ticks.start(200)
    try:
        return app.exec()
    finally:
        ticks.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _end(window, status: int, word: str) -> None:
    window.end_by_signal()
    print(f"cellfuse: {word}", file=sys.stderr)
    QtWidgets.QApplication.instance().exit(status)
