"""Autosaves of the open cell, so that a crash loses little.

While a document has unsaved changes the window writes it, on a timer, to the application's data
folder (`CellFuse` in the user's data folder, QStandardPaths), one file per document path. Saving or
closing cleanly removes the autosave; one that is still there at the next start, and newer than its
file, is offered back.

Qt's own application data folder names the organisation and then the application, both "CellFuse":
autosaves went to .../CellFuse/CellFuse/autosave. One left there is still found and offered back.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from PySide6 import QtCore

from ..graph_model import atomic_write
from .recent_files import APPLICATION, ORGANIZATION

log = logging.getLogger(__name__)

SUFFIX = ".autosave.cell.json"
UNTITLED = "untitled"


def autosave_dir() -> Path:
    base = QtCore.QStandardPaths.writableLocation(QtCore.QStandardPaths.StandardLocation.GenericDataLocation)
    return Path(base) / APPLICATION / "autosave"


def _earlier_dir() -> Path:
    """Where autosaves went before: Qt's application data folder, the name in it twice."""
    base = QtCore.QStandardPaths.writableLocation(QtCore.QStandardPaths.StandardLocation.GenericDataLocation)
    return Path(base) / ORGANIZATION / APPLICATION / "autosave"


def _key(path: Path | None) -> str:
    if path is None:
        return UNTITLED
    return hashlib.sha1(str(Path(path).resolve()).encode()).hexdigest()[:16]


def autosave_path(path: Path | None, folder: Path | None = None) -> Path:
    return (folder or autosave_dir()) / f"{_key(path)}{SUFFIX}"


@dataclass(frozen=True)
class Autosave:
    file: Path
    of: Path | None  # the document it is an autosave of (None: an untitled one)
    saved_at: dt.datetime

    def when(self) -> str:
        return self.saved_at.strftime("%Y-%m-%d %H:%M:%S")


def write_autosave(text: str, path: Path | None) -> Path:
    """Writes the document's text beside a note of which document it is."""
    target = autosave_path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(target, text.encode("utf-8"))
    note = {"of": str(Path(path).resolve()) if path else None}
    atomic_write(target.with_suffix(".note"), json.dumps(note).encode("utf-8"))
    log.debug("autosaved %s to %s", path or UNTITLED, target)
    return target


def find_autosave(path: Path | None) -> Autosave | None:
    """The autosave of a document, when there is one newer than the document's file."""
    file = next((f for f in (autosave_path(path), autosave_path(path, _earlier_dir())) if f.is_file()), None)
    if file is None:
        return None
    mtime = file.stat().st_mtime
    if path is not None and Path(path).is_file() and Path(path).stat().st_mtime >= mtime:
        return None
    return Autosave(file=file, of=Path(path) if path else None,
                    saved_at=dt.datetime.fromtimestamp(mtime))


def remove_autosave(path: Path | None) -> None:
    files = [autosave_path(path), autosave_path(path, _earlier_dir())]
    for f in [*files, *(f.with_suffix(".note") for f in files)]:
        try:
            f.unlink(missing_ok=True)
        except OSError as e:
            log.warning("could not remove the autosave %s: %s", f, e)
