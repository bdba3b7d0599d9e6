"""Find a node by its name (Ctrl+F): a search field at the top of the canvas that completes the cell's
node ids as they are typed (any part of the name, in any case); Enter or a pick goes to the node, selected
and in the middle of the canvas (in its group, opened, where one holds it); Esc closes the field."""

from __future__ import annotations

from collections.abc import Callable

from PySide6 import QtCore, QtGui, QtWidgets

WIDTH = 320
TOP = 36  # below the path shown at the canvas's top left


def best_match(text: str, names: list[str]) -> str | None:
    """The name `text` stands for: itself, else the first that starts with it, else the first that holds
    it, in any case; None for none."""
    wanted = text.strip().lower()
    if not wanted:
        return None
    lowered = [(n.lower(), n) for n in names]
    for test in (lambda n: n == wanted, lambda n: n.startswith(wanted), lambda n: wanted in n):
        found = next((name for low, name in lowered if test(low)), None)
        if found is not None:
            return found
    return None


class NodeFinder(QtWidgets.QFrame):
    """The search field, a child of the canvas. The editor tells it what to do (see menus): `names()`
    gives the names to search, `go(name)` goes to one, `before()` shows the canvas as the field opens."""

    def __init__(self, canvas: QtWidgets.QWidget) -> None:
        super().__init__(canvas)
        self.setObjectName("nodeFinder")
        self.setFrameShape(QtWidgets.QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        self.names: Callable[[], list[str]] = list
        self.go: Callable[[str], None] = lambda _name: None
        self.before: Callable[[], None] = lambda: None
        self.edit = QtWidgets.QLineEdit()
        self.edit.setPlaceholderText("Find a node by name…")
        self.edit.setClearButtonEnabled(True)
        self.message = QtWidgets.QLabel()
        self.message.setProperty("role", "hint")
        self.message.setVisible(False)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.setSpacing(2)
        layout.addWidget(self.edit)
        layout.addWidget(self.message)
        self.model = QtCore.QStringListModel(self)
        self.completer = QtWidgets.QCompleter(self.model, self)
        self.completer.setCaseSensitivity(QtCore.Qt.CaseSensitivity.CaseInsensitive)
        self.completer.setFilterMode(QtCore.Qt.MatchFlag.MatchContains)
        self.edit.setCompleter(self.completer)
        self.completer.activated.connect(self.go_to)
        self.edit.returnPressed.connect(lambda: self.go_to(self.edit.text()))
        self.edit.textEdited.connect(lambda _t: self.message.setVisible(False))
        QtGui.QShortcut(QtGui.QKeySequence(QtCore.Qt.Key.Key_Escape), self, self.hide,
                        context=QtCore.Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.setFixedWidth(WIDTH)
        self.hide()

    def open(self) -> None:
        """Shows the field over the canvas, its text selected, with the names the cell has now."""
        self.before()
        self.model.setStringList(sorted(self.names(), key=str.lower))
        self.message.setVisible(False)
        parent = self.parentWidget()
        self.adjustSize()
        self.move(max(0, (parent.width() - self.width()) // 2), TOP)
        self.show()
        self.raise_()
        self.edit.setFocus()
        self.edit.selectAll()

    def go_to(self, text: str) -> bool:
        """Goes to the node `text` names (see best_match); says so where none does. True when it went."""
        name = best_match(text, self.names())
        if name is None:
            self.message.setText(f"No node's name holds '{text.strip()}'" if text.strip() else "Type a name")
            self.message.setVisible(True)
            self.adjustSize()
            return False
        self.hide()
        self.go(name)
        return True
