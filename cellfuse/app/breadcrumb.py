"""Where the canvas is, while a group is open: the cell's name, which goes back to the whole cell,
then the group's ("LSTM › forget gate"). It floats at the canvas's top left, and is hidden while the
canvas shows the whole cell."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

MARGIN = 10


class Breadcrumb(QtWidgets.QFrame):
    back_requested = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget) -> None:
        super().__init__(parent)
        self.setObjectName("Breadcrumb")
        self.setFrameShape(QtWidgets.QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        layout = QtWidgets.QHBoxLayout(self)
        layout.setContentsMargins(6, 2, 8, 2)
        layout.setSpacing(6)
        self.cell_button = QtWidgets.QToolButton()
        self.cell_button.setAutoRaise(True)
        self.cell_button.setCursor(QtCore.Qt.CursorShape.PointingHandCursor)
        self.cell_button.setToolTip("Back to the whole cell")
        self.cell_button.clicked.connect(self.back_requested)
        self.group_label = QtWidgets.QLabel()
        font = self.group_label.font()
        font.setBold(True)
        self.group_label.setFont(font)
        self.hint = QtWidgets.QLabel("Ctrl+Shift+G ungroups")
        self.hint.setProperty("role", "hint")
        layout.addWidget(self.cell_button)
        layout.addWidget(QtWidgets.QLabel("›"))
        layout.addWidget(self.group_label)
        layout.addSpacing(10)
        layout.addWidget(self.hint)
        self.hide()

    def show_path(self, cell_name: str, group: str | None) -> None:
        """Shows `cell_name › group`; hides the bar when `group` is None."""
        self.cell_button.setText(cell_name)
        self.group_label.setText(group or "")
        self.setVisible(group is not None)
        if group is not None:
            self.adjustSize()
            self.move(MARGIN, MARGIN)
            self.raise_()

    def path(self) -> list[str]:
        """What the bar shows, left to right (empty while hidden)."""
        return [self.cell_button.text(), self.group_label.text()] if not self.isHidden() else []
