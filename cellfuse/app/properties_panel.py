"""The properties of the selected node (or of the cell when nothing is selected).

The panel shows a snapshot of the cell and asks for changes through signals; the window hands them
to the cell adapter and tells the panel when one is refused. Numbers are edited as text with Qt's
validators (negative and scientific values included) and stored as numbers.
"""

from __future__ import annotations

import html

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import OPS, Cell, CellInfo, shape_str
from ..graph_model.validate import DIMS, port_name
from . import theme

ID_REGEX = QtCore.QRegularExpression(r"[A-Za-z_][A-Za-z0-9_]*")


def _form() -> QtWidgets.QFormLayout:
    form = QtWidgets.QFormLayout()
    form.setFieldGrowthPolicy(QtWidgets.QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    form.setLabelAlignment(QtCore.Qt.AlignmentFlag.AlignRight)
    form.setHorizontalSpacing(10)
    form.setVerticalSpacing(6)
    return form


def _links(ids: list[str]) -> str:
    if not ids:
        return '<span style="color:#8d919a">none</span>'
    return ", ".join(f'<a href="{html.escape(i)}" style="color:#7fb0ee">{html.escape(i)}</a>' for i in ids)


def number_text(value: float) -> str:
    """A float as the shortest text that reads back as the same float."""
    return repr(float(value))


class PropertiesPanel(QtWidgets.QWidget):
    rename_requested = QtCore.Signal(str, str)
    shape_requested = QtCore.Signal(str, list)
    value_requested = QtCore.Signal(str, float)
    cell_info_requested = QtCore.Signal(dict)
    node_activated = QtCore.Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self._node_id: str | None = None
        self._cell: Cell | None = None
        self.stack = QtWidgets.QStackedWidget()
        outer = QtWidgets.QVBoxLayout(self)
        outer.setContentsMargins(8, 8, 8, 8)
        outer.addWidget(self.stack)
        outer.addStretch(1)
        self._build_cell_page()
        self._build_node_page()
        self.multi_label = QtWidgets.QLabel()
        self.multi_label.setProperty("role", "hint")
        self.multi_label.setWordWrap(True)
        self.stack.addWidget(self.multi_label)

    # -- pages ----------------------------------------------------------------------------------------
    def _build_cell_page(self) -> None:
        page = QtWidgets.QWidget()
        box = QtWidgets.QVBoxLayout(page)
        box.setContentsMargins(0, 0, 0, 0)
        heading = QtWidgets.QLabel("Cell")
        heading.setProperty("role", "heading")
        box.addWidget(heading)
        form = _form()
        self.cell_name = QtWidgets.QLineEdit()
        self.cell_description = QtWidgets.QLineEdit()
        self.cell_input = QtWidgets.QLineEdit()
        self.cell_hidden = QtWidgets.QLineEdit()
        for edit in (self.cell_input, self.cell_hidden):
            edit.setValidator(QtGui.QIntValidator(1, 1 << 20, edit))
        form.addRow("Name", self.cell_name)
        form.addRow("Description", self.cell_description)
        form.addRow("Input size", self.cell_input)
        form.addRow("Hidden size", self.cell_hidden)
        box.addLayout(form)
        self.cell_summary = QtWidgets.QLabel()
        self.cell_summary.setProperty("role", "hint")
        self.cell_summary.setWordWrap(True)
        box.addWidget(self.cell_summary)
        hint = QtWidgets.QLabel("Select a node to edit it. The sizes are the cell's defaults; "
                                "the benchmark's sizes override them.")
        hint.setProperty("role", "hint")
        hint.setWordWrap(True)
        box.addWidget(hint)
        for edit in (self.cell_name, self.cell_description, self.cell_input, self.cell_hidden):
            edit.editingFinished.connect(self._commit_cell)
        self.stack.addWidget(page)
        self.cell_page = page

    def _build_node_page(self) -> None:
        page = QtWidgets.QWidget()
        box = QtWidgets.QVBoxLayout(page)
        box.setContentsMargins(0, 0, 0, 0)
        self.node_heading = QtWidgets.QLabel()
        self.node_heading.setProperty("role", "heading")
        box.addWidget(self.node_heading)
        form = _form()
        self.id_edit = QtWidgets.QLineEdit()
        self.id_edit.setValidator(QtGui.QRegularExpressionValidator(ID_REGEX, self.id_edit))
        self.id_edit.setToolTip("The node's id: letters, digits and _, not starting with a digit. "
                                "Every link to the node follows a rename.")
        self.op_label = QtWidgets.QLabel()
        self.op_label.setWordWrap(True)
        self.shape_label = QtWidgets.QLabel()
        form.addRow("Id", self.id_edit)
        form.addRow("Op", self.op_label)
        form.addRow("Shape", self.shape_label)

        self.dims_combo = QtWidgets.QComboBox()
        self.dims_combo.addItems(["1-D  [N]  (bias)", "2-D  [K, N]  (matmul)"])
        self.k_combo = QtWidgets.QComboBox()
        self.n_combo = QtWidgets.QComboBox()
        for combo in (self.k_combo, self.n_combo):
            combo.addItems(list(DIMS))
        self.weight_rows = [("Weight", self.dims_combo), ("K (rows)", self.k_combo),
                            ("N (columns)", self.n_combo)]
        for label, widget in self.weight_rows:
            form.addRow(label, widget)
        self.value_edit = QtWidgets.QLineEdit()
        validator = QtGui.QDoubleValidator(self.value_edit)
        validator.setLocale(QtCore.QLocale.c())
        validator.setNotation(QtGui.QDoubleValidator.Notation.ScientificNotation)
        self.value_edit.setValidator(validator)
        self.value_edit.setToolTip("Any finite number, e.g. -1.5 or 1e-3")
        form.addRow("Value", self.value_edit)

        self.inputs_label = QtWidgets.QLabel()
        self.inputs_label.setWordWrap(True)
        self.users_label = QtWidgets.QLabel()
        self.users_label.setWordWrap(True)
        for label in (self.inputs_label, self.users_label):
            label.setTextInteractionFlags(QtCore.Qt.TextInteractionFlag.LinksAccessibleByMouse)
            label.linkActivated.connect(self.node_activated)
        form.addRow("Inputs", self.inputs_label)
        form.addRow("Used by", self.users_label)
        box.addLayout(form)
        self._form = form

        self.problems_label = QtWidgets.QLabel()
        self.problems_label.setWordWrap(True)
        box.addWidget(self.problems_label)
        self.error_label = QtWidgets.QLabel()
        self.error_label.setProperty("role", "error")
        self.error_label.setWordWrap(True)
        box.addWidget(self.error_label)

        self.id_edit.editingFinished.connect(self._commit_id)
        self.value_edit.editingFinished.connect(self._commit_value)
        self.dims_combo.currentIndexChanged.connect(self._commit_shape)
        self.k_combo.currentIndexChanged.connect(self._commit_shape)
        self.n_combo.currentIndexChanged.connect(self._commit_shape)
        self.stack.addWidget(page)
        self.node_page = page

    # -- showing ----------------------------------------------------------------------------------------
    def show_cell(self, cell: Cell, info: CellInfo, selected: list[str]) -> None:
        """Shows the selection of `cell` (validated as `info`)."""
        self._cell = cell
        nodes = cell.by_id()
        selected = [s for s in selected if s in nodes]
        if len(selected) > 1:
            self._node_id = None
            self.multi_label.setText(f"{len(selected)} nodes selected: {', '.join(selected)}")
            self.stack.setCurrentWidget(self.multi_label)
            return
        if not selected:
            self._node_id = None
            self._show_cell_page(cell)
            return
        node = nodes[selected[0]]
        changed = node.id != self._node_id
        self._node_id = node.id
        if changed:
            self.error_label.clear()
        self.stack.setCurrentWidget(self.node_page)
        kind = theme.op_kind(node.op)
        rgb = theme.KIND_COLORS[kind]
        self.node_heading.setText(f'<span style="color:rgb{rgb}">■</span> {theme.KIND_LABELS[kind]} node')
        if changed or not self.id_edit.hasFocus():
            self.id_edit.setText(node.id)
        self.id_edit.setProperty("invalid", False)
        spec = OPS.get(node.op)
        self.op_label.setText(f"<b>{node.op}</b> — {html.escape(spec.doc) if spec else 'unknown op'}")
        self.shape_label.setText(shape_str(info.shapes.get(node.id)) if node.id in info.shapes else "?")

        is_weight = node.op == "weight"
        for _label, widget in self.weight_rows:
            self._form.setRowVisible(widget, is_weight)
        if is_weight:
            shape = list(node.shape or [])
            for w in (self.dims_combo, self.k_combo, self.n_combo):
                w.blockSignals(True)
            self.dims_combo.setCurrentIndex(1 if len(shape) == 2 else 0)
            if len(shape) == 2:
                self.k_combo.setCurrentText(shape[0] if shape[0] in DIMS else DIMS[0])
            if shape:
                self.n_combo.setCurrentText(shape[-1] if shape[-1] in DIMS else DIMS[1])
            self._form.setRowVisible(self.k_combo, len(shape) == 2)
            for w in (self.dims_combo, self.k_combo, self.n_combo):
                w.blockSignals(False)
        is_const = node.op == "const"
        self._form.setRowVisible(self.value_edit, is_const)
        if is_const and (changed or not self.value_edit.hasFocus()):
            self.value_edit.setText(number_text(node.value) if node.value is not None else "")

        names = spec.args if spec else ()
        unconnected = '<span style="color:#f07060">not connected</span>'
        args = [*node.args, *[""] * (len(names) - len(node.args))]
        rows = [f"{html.escape(port_name(node.op, i))}: {_links([a]) if a else unconnected}"
                for i, a in enumerate(args)]
        self._form.setRowVisible(self.inputs_label, bool(names))
        self.inputs_label.setText("<br/>".join(rows) or "none")
        users = cell.consumers().get(node.id, [])
        extra = []
        if cell.output == node.id:
            extra.append("the cell's output")
        extra += [f"the update of {html.escape(s)}" for s, v in cell.updates.items() if v == node.id]
        self.users_label.setText(", ".join(filter(None, [_links(users) if users or not extra else "",
                                                        *extra])))
        lines = [p for p in [*info.problems, *info.notes] if p.node == node.id]
        color = theme.SEVERITY_TEXT
        word = {"error": "error", "warning": "warning", "info": "note"}  # a note is no problem
        self.problems_label.setText("<br/>".join(
            f'<span style="color:{color[p.severity]}">{word[p.severity]}: {html.escape(p.message)}</span>'
            for p in lines))
        self.problems_label.setVisible(bool(lines))

    def _show_cell_page(self, cell: Cell) -> None:
        self.stack.setCurrentWidget(self.cell_page)
        for edit, text in ((self.cell_name, cell.name), (self.cell_description, cell.description),
                           (self.cell_input, str(cell.sizes.get("input", ""))),
                           (self.cell_hidden, str(cell.sizes.get("hidden", "")))):
            if not edit.hasFocus():
                edit.setText(text)
                edit.setCursorPosition(0)
        counts = {}
        for n in cell.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        nodes = f"{len(cell.nodes)} node{'' if len(cell.nodes) == 1 else 's'}"
        self.cell_summary.setText(
            f"{nodes}: {counts.get('state', 0)} state(s), {counts.get('weight', 0)} weight(s), "
            f"{counts.get('matmul', 0)} matmul(s)")

    def show_error(self, text: str) -> None:
        """Says why the last change was refused, and shows the node's values again."""
        self.error_label.setText(text)
        if self._node_id is not None and self._cell is not None and self._cell.has(self._node_id):
            node = self._cell.node(self._node_id)
            self.id_edit.setText(node.id)
            if node.value is not None:
                self.value_edit.setText(number_text(node.value))

    # -- committing ------------------------------------------------------------------------------------
    def _commit_id(self) -> None:
        new = self.id_edit.text().strip()
        if self._node_id is not None and new and new != self._node_id:
            self.error_label.clear()
            self.rename_requested.emit(self._node_id, new)

    def _commit_value(self) -> None:
        if self._node_id is None or not self.value_edit.hasAcceptableInput():
            return
        try:
            value = float(self.value_edit.text())
        except ValueError:
            self.show_error(f"'{self.value_edit.text()}' is not a number")
            return
        cell = self._cell
        if cell is not None and cell.has(self._node_id) and cell.node(self._node_id).value == value:
            return
        self.error_label.clear()
        self.value_requested.emit(self._node_id, value)

    def _commit_shape(self) -> None:
        if self._node_id is None:
            return
        two = self.dims_combo.currentIndex() == 1
        self._form.setRowVisible(self.k_combo, two)
        n = self.n_combo.currentText()
        shape = [self.k_combo.currentText(), n] if two else [n]
        cell = self._cell
        if cell is not None and cell.has(self._node_id) and cell.node(self._node_id).shape == shape:
            return
        self.error_label.clear()
        self.shape_requested.emit(self._node_id, shape)

    def _commit_cell(self) -> None:
        if self._cell is None:
            return
        info: dict = {"name": self.cell_name.text().strip() or self._cell.name,
                      "description": self.cell_description.text(), "sizes": {}}
        for key, edit in (("input", self.cell_input), ("hidden", self.cell_hidden)):
            if edit.hasAcceptableInput():
                info["sizes"][key] = int(edit.text())
        self.cell_info_requested.emit(info)
