"""Starts the editor: `cellfuse gui [CELL]` calls `run_app`."""

from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

from PySide6 import QtWidgets

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
    return app.exec()
