"""The palette: every op of the op table, grouped by kind, searchable; double-click, Enter or drag
onto the canvas to add one."""

from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from ..graph_model import OPS
from . import theme
from .canvas_graph import OP_MIME_TYPE
from .cell_adapter import OUTPUT_OP

OP_ROLE = QtCore.Qt.ItemDataRole.UserRole


def palette_entries() -> list[tuple[str, str, str]]:
    """(kind, op, description) for every op of the op table and the output sink."""
    entries = [(theme.op_kind(name), name, spec.doc) for name, spec in OPS.items()]
    entries.append(("output", OUTPUT_OP, "the cell's output: the layer's value at each step"))
    return entries


class _OpTree(QtWidgets.QTreeWidget):
    def mimeData(self, items):  # noqa: N802 (Qt's name)
        data = QtCore.QMimeData()
        ops = [i.data(0, OP_ROLE) for i in items if i.data(0, OP_ROLE)]
        if ops:
            data.setData(OP_MIME_TYPE, ops[0].encode())
            data.setText(ops[0])
        return data


class PalettePanel(QtWidgets.QWidget):
    op_activated = QtCore.Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.search = QtWidgets.QLineEdit()
        self.search.setPlaceholderText("Search ops…")
        self.search.setClearButtonEnabled(True)
        self.tree = _OpTree()
        self.tree.setHeaderHidden(True)
        self.tree.setRootIsDecorated(False)
        self.tree.setIndentation(8)
        self.tree.setDragEnabled(True)
        self.tree.setDragDropMode(QtWidgets.QAbstractItemView.DragDropMode.DragOnly)
        self.tree.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.SingleSelection)
        hint = QtWidgets.QLabel("Double-click or drag onto the canvas. Tab on the canvas searches too.")
        hint.setWordWrap(True)
        hint.setProperty("role", "hint")
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.no_match = QtWidgets.QLabel()
        self.no_match.setProperty("role", "hint")
        self.no_match.setWordWrap(True)
        self.no_match.hide()
        layout.addWidget(self.search)
        layout.addWidget(self.no_match)
        layout.addWidget(self.tree, 1)
        layout.addWidget(hint)

        self._groups: dict[str, QtWidgets.QTreeWidgetItem] = {}
        for kind, op, doc in palette_entries():
            group = self._groups.get(kind)
            if group is None:
                group = QtWidgets.QTreeWidgetItem(self.tree, [theme.KIND_LABELS[kind]])
                group.setFlags(QtCore.Qt.ItemFlag.ItemIsEnabled)
                font = group.font(0)
                font.setBold(True)
                group.setFont(0, font)
                group.setForeground(0, theme.qcolor(theme.KIND_COLORS[kind]))
                self._groups[kind] = group
            item = QtWidgets.QTreeWidgetItem(group, [op])
            item.setData(0, OP_ROLE, op)
            item.setIcon(0, theme.swatch_icon(theme.KIND_COLORS[kind]))
            item.setToolTip(0, f"<b>{op}</b><br/>{doc}")
            item.setFlags(QtCore.Qt.ItemFlag.ItemIsEnabled | QtCore.Qt.ItemFlag.ItemIsSelectable
                          | QtCore.Qt.ItemFlag.ItemIsDragEnabled)
        self.tree.expandAll()

        self.search.textChanged.connect(self._filter)
        self.search.returnPressed.connect(self._activate_first)
        self.tree.itemActivated.connect(self._on_item)

    def ops(self) -> list[str]:
        """The ops listed now (after the filter), in order."""
        return [item.data(0, OP_ROLE) for item in self._items() if not item.isHidden()]

    def _items(self) -> list[QtWidgets.QTreeWidgetItem]:
        return [g.child(i) for g in self._groups.values() for i in range(g.childCount())]

    def _filter(self, text: str) -> None:
        needle = text.strip().lower()
        for group in self._groups.values():
            shown = 0
            for i in range(group.childCount()):
                item = group.child(i)
                hit = not needle or needle in item.data(0, OP_ROLE) or needle in item.toolTip(0).lower()
                item.setHidden(not hit)
                shown += hit
            group.setHidden(shown == 0)
        visible = [i for i in self._items() if not i.isHidden()]
        self.no_match.setText(f"No op matches “{text.strip()}”." if not visible else "")
        self.no_match.setVisible(not visible)
        if visible:
            # The best match is current, so that Enter adds it: the exact name, then a prefix.
            def rank(item: QtWidgets.QTreeWidgetItem) -> int:
                op = item.data(0, OP_ROLE)
                return 0 if op == needle else 1 if op.startswith(needle) else 2 if needle in op else 3

            self.tree.setCurrentItem(min(visible, key=rank))

    def reset_search(self) -> None:
        """Shows every op again: a filter left on after adding a node hides the rest of the palette."""
        if self.search.text():
            self.search.clear()

    def current_op(self) -> str | None:
        item = self.tree.currentItem()
        return item.data(0, OP_ROLE) if item is not None and not item.isHidden() else None

    def _activate_first(self) -> None:
        current = self.tree.currentItem()
        if current is not None and not current.isHidden() and current.data(0, OP_ROLE):
            self.op_activated.emit(current.data(0, OP_ROLE))
        elif self.ops():
            self.op_activated.emit(self.ops()[0])

    def _on_item(self, item: QtWidgets.QTreeWidgetItem, _column: int = 0) -> None:
        op = item.data(0, OP_ROLE)
        if op:
            self.op_activated.emit(op)
