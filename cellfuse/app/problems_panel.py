"""The problems panel: every error and warning of the cell, each naming its node; clicking one
selects and centres that node on the canvas."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import Problem
from . import theme

NODE_ROLE = QtCore.Qt.ItemDataRole.UserRole


def _dot(rgb: theme.RGB) -> QtGui.QIcon:
    pix = QtGui.QPixmap(12, 12)
    pix.fill(QtGui.QColor(0, 0, 0, 0))
    p = QtGui.QPainter(pix)
    p.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
    p.setBrush(theme.qcolor(rgb))
    p.setPen(QtCore.Qt.PenStyle.NoPen)
    p.drawEllipse(1, 1, 10, 10)
    p.end()
    return QtGui.QIcon(pix)


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
        self._icons = {"error": _dot(theme.ERROR_COLOR), "warning": _dot(theme.WARNING_COLOR)}
        self.tree.itemClicked.connect(self._on_item)
        self.tree.itemActivated.connect(self._on_item)
        self.show_problems([])

    def show_problems(self, problems: list[Problem]) -> None:
        self.tree.clear()
        errors = sum(p.severity == "error" for p in problems)
        warnings = len(problems) - errors
        if not problems:
            self.summary.setText('<span style="color:#6fcf97">✔ No problems: the cell is valid.</span>')
        else:
            parts = []
            if errors:
                parts.append(f'<span style="color:#f07060">{errors} error{"s" if errors != 1 else ""}</span>')
            if warnings:
                parts.append(f'<span style="color:#f0c040">{warnings} warning'
                             f'{"s" if warnings != 1 else ""}</span>')
            self.summary.setText(", ".join(parts) + " — click one to find its node.")
        ordered = sorted(problems, key=lambda p: p.severity != "error")
        for p in ordered:
            item = QtWidgets.QTreeWidgetItem([p.node or "(cell)", p.message])
            item.setIcon(0, self._icons[p.severity])
            item.setData(0, NODE_ROLE, p.node)
            item.setToolTip(1, str(p))
            self.tree.addTopLevelItem(item)

    def problem_count(self) -> int:
        return self.tree.topLevelItemCount()

    def _on_item(self, item: QtWidgets.QTreeWidgetItem, _column: int = 0) -> None:
        node = item.data(0, NODE_ROLE)
        if node:
            self.node_activated.emit(node)
