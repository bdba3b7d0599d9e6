"""The list of recently opened cell files, kept in QSettings."""

from __future__ import annotations

from pathlib import Path

from PySide6 import QtCore

ORGANIZATION = "CellFuse"
APPLICATION = "CellFuse"
KEY = "recent_files"
LIMIT = 10


def settings() -> QtCore.QSettings:
    return QtCore.QSettings(ORGANIZATION, APPLICATION)


def recent_files() -> list[Path]:
    raw = settings().value(KEY, [])
    if isinstance(raw, str):
        raw = [raw]
    return [Path(p) for p in (raw or []) if isinstance(p, str) and p]


def add_recent_file(path: Path) -> list[Path]:
    path = Path(path).resolve()
    files = [path] + [p for p in recent_files() if p != path]
    files = files[:LIMIT]
    settings().setValue(KEY, [str(p) for p in files])
    return files


def clear_recent_files() -> None:
    settings().setValue(KEY, [])
