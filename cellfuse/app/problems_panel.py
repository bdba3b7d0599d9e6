"""The problems panel: every error and warning of the cell, then its notes (information: a condition
the cell runs under, such as an input size that must equal the hidden size), each naming its node;
clicking one selects and centres that node on the canvas. A note is no problem: the summary still
says the cell is valid."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import Problem
from . import theme

NODE_ROLE = QtCore.Qt.ItemDataRole.UserRole
SEVERITY_ROLE = QtCore.Qt.ItemDataRole.UserRole + 1


SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
SEVERITY_WORDS = {"error": "Error", "warning": "Warning", "info": "Information"}


def _dot(rgb: theme.RGB, glyph: str) -> QtGui.QIcon:
    """A round badge of the severity's colour with its glyph, as the nodes on the canvas show it."""
    pix = QtGui.QPixmap(14, 14)
    pix.fill(QtGui.QColor(0, 0, 0, 0))
    p = QtGui.QPainter(pix)
    p.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    p.setBrush(theme.qcolor(rgb))
    p.setPen(QtCore.Qt.PenStyle.NoPen)
    p.drawEllipse(1, 1, 12, 12)
    font = p.font()
    font.setPixelSize(10)
    font.setBold(True)
    p.setFont(font)
    p.setPen(QtGui.QColor(20, 20, 22))
    p.drawText(QtCore.QRectF(1, 1, 12, 12), QtCore.Qt.AlignmentFlag.AlignCenter, glyph)
    p.end()
    return QtGui.QIcon(pix)


def _count(n: int, word: str, rgb: theme.RGB) -> str:
    return f'<span style="color:{theme.qcolor(rgb).name()}">{n} {word}{"s" if n != 1 else ""}</span>'


class ProblemsPanel(QtWidgets.QWidget):
    node_activated = QtCore.Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.summary = QtWidgets.QLabel()
        self.tree = QtWidgets.QTreeWidget()
        self.tree.setColumnCount(2)
        self.tree.setHeaderLabels(["Node", "Problem"])
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.header().setStretchLastSection(True)
        self.tree.setColumnWidth(0, 130)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.summary)
        layout.addWidget(self.tree, 1)
        self._icons = {"error": _dot(theme.ERROR_COLOR, "!"), "warning": _dot(theme.WARNING_COLOR, "!"),
                       "info": _dot(theme.INFO_COLOR, "i")}
        self._problems = 0
        self.tree.itemClicked.connect(self._on_item)
        self.tree.itemActivated.connect(self._on_item)
        self.show_problems([], [])

    def show_problems(self, problems: list[Problem], notes: list[Problem]) -> None:
        """Lists the cell's errors and warnings (`problems`), then its info-level `notes`."""
        self.tree.clear()
        errors = sum(p.severity == "error" for p in problems)
        warnings = len(problems) - errors
        parts = []
        if errors:
            parts.append(_count(errors, "error", theme.ERROR_COLOR))
        if warnings:
            parts.append(_count(warnings, "warning", theme.WARNING_COLOR))
        if notes:
            parts.append(_count(len(notes), "note", theme.INFO_COLOR))
        if not problems:
            valid = '<span style="color:#6fcf97">✔ No problems: the cell is valid.</span>'
            self.summary.setText(valid + (f" {parts[0]} below." if notes else ""))
        else:
            self.summary.setText(", ".join(parts) + " — click one to find its node.")
        self._problems = len(problems)
        for p in sorted([*problems, *notes], key=lambda p: SEVERITY_ORDER[p.severity]):
            item = QtWidgets.QTreeWidgetItem([p.node or "(cell)", p.message])
            item.setIcon(0, self._icons[p.severity])
            item.setData(0, NODE_ROLE, p.node)
            item.setData(0, SEVERITY_ROLE, p.severity)
            item.setToolTip(0, SEVERITY_WORDS[p.severity])
            item.setToolTip(1, str(p))
            if p.severity == "info":
                item.setForeground(1, theme.qcolor(theme.INFO_COLOR))
            self.tree.addTopLevelItem(item)

    def problem_count(self) -> int:
        """The errors and warnings listed (the notes are not problems)."""
        return self._problems

    def severities(self) -> list[str]:
        """The severity of each row, top to bottom."""
        tree = self.tree
        return [tree.topLevelItem(i).data(0, SEVERITY_ROLE) for i in range(tree.topLevelItemCount())]

    def _on_item(self, item: QtWidgets.QTreeWidgetItem, _column: int = 0) -> None:
        node = item.data(0, NODE_ROLE)
        if node:
            self.node_activated.emit(node)
