"""Every question the editor asks the user, in one module, so that tests can answer them.

The window always calls these through the module (`dialogs.ask_save_changes(...)`), so a test
replaces one with `monkeypatch.setattr(dialogs, "ask_save_changes", lambda *a: "discard")`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from PySide6 import QtWidgets

CELL_FILTER = "Cell files (*.cell.json);;JSON files (*.json);;All files (*)"
SaveAnswer = Literal["save", "discard", "cancel"]


def ask_save_changes(parent: QtWidgets.QWidget | None, name: str) -> SaveAnswer:
    """Save, discard or cancel, for a document with unsaved changes."""
    box = QtWidgets.QMessageBox(parent)
    box.setIcon(QtWidgets.QMessageBox.Icon.Warning)
    box.setWindowTitle("Unsaved changes")
    box.setText(f"“{name}” has changes that are not saved.")
    box.setInformativeText("Save them before going on?")
    buttons = QtWidgets.QMessageBox.StandardButton
    box.setStandardButtons(buttons.Save | buttons.Discard | buttons.Cancel)
    box.setDefaultButton(buttons.Save)
    answer = box.exec()
    if answer == buttons.Save:
        return "save"
    if answer == buttons.Discard:
        return "discard"
    return "cancel"


def ask_restore_autosave(parent: QtWidgets.QWidget | None, name: str, when: str) -> bool:
    """Whether to restore the changes autosaved at `when` that were never saved."""
    buttons = QtWidgets.QMessageBox.StandardButton
    answer = QtWidgets.QMessageBox.question(
        parent, "Restore unsaved changes?",
        f"CellFuse closed without saving changes to “{name}”.\n"
        f"An autosave from {when} holds them. Restore it?",
        buttons.Yes | buttons.No, buttons.Yes)
    return answer == buttons.Yes


def show_error(parent: QtWidgets.QWidget | None, title: str, text: str) -> None:
    QtWidgets.QMessageBox.critical(parent, title, text)


def ask_open_path(parent: QtWidgets.QWidget | None, directory: str = "") -> Path | None:
    path, _ = QtWidgets.QFileDialog.getOpenFileName(parent, "Open cell", directory, CELL_FILTER)
    return Path(path) if path else None


def ask_save_path(parent: QtWidgets.QWidget | None, title: str, suggested: str, filters: str
                  ) -> Path | None:
    path, _ = QtWidgets.QFileDialog.getSaveFileName(parent, title, suggested, filters)
    return Path(path) if path else None


def ask_group_name(parent: QtWidgets.QWidget | None, suggested: str) -> str | None:
    """The name of a group of nodes ("forget gate"), new or renamed, or None when the user cancels."""
    text, ok = QtWidgets.QInputDialog.getText(parent, "Group name", "Name of the group:",
                                              QtWidgets.QLineEdit.EchoMode.Normal, suggested)
    return text if ok else None
