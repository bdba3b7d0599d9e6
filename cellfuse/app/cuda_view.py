"""The CUDA view: the generated source of the chosen schedule, highlighted and read-only. Selecting
a node scrolls to the kernel (or GEMM) that computes it and marks its line."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from .cuda_highlighter import CudaHighlighter

MARK_COLOR = QtGui.QColor(255, 214, 90, 60)


class CudaView(QtWidgets.QWidget):
    export_requested = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QtWidgets.QLabel("No source yet.")
        self.title.setProperty("role", "hint")
        self.location = QtWidgets.QLabel()
        self.location.setProperty("role", "hint")
        self.export_button = QtWidgets.QPushButton("Export .cu…")
        self.export_button.setEnabled(False)
        top = QtWidgets.QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(self.location)
        top.addWidget(self.export_button)
        self.editor = QtWidgets.QPlainTextEdit()
        self.editor.setReadOnly(True)
        self.editor.setLineWrapMode(QtWidgets.QPlainTextEdit.LineWrapMode.NoWrap)
        font = QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont)
        font.setPointSizeF(max(9.0, font.pointSizeF()))
        self.editor.setFont(font)
        self.editor.setStyleSheet("QPlainTextEdit { background: #1e1f24; color: #d6d9e0; }")
        self.highlighter = CudaHighlighter(self.editor.document())
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(top)
        layout.addWidget(self.editor, 1)
        self._kernel_of_node: dict[str, str] = {}
        self._kernel_line: dict[str, int] = {}
        self.export_button.clicked.connect(self.export_requested)

    def show_source(self, text: str, kernel_of_node: dict[str, str], kernel_line: dict[str, int],
                    title: str) -> None:
        if text != self.editor.toPlainText():
            self.editor.setPlainText(text)
        self._kernel_of_node = dict(kernel_of_node)
        self._kernel_line = dict(kernel_line)
        self.title.setText(title)
        self.export_button.setEnabled(True)

    def show_message(self, text: str) -> None:
        self.editor.setPlainText(f"// {text}")
        self._kernel_of_node, self._kernel_line = {}, {}
        self.title.setText(text)
        self.location.clear()
        self.export_button.setEnabled(False)

    def text(self) -> str:
        return self.editor.toPlainText()

    def kernel_of(self, node_id: str) -> str | None:
        return self._kernel_of_node.get(node_id)

    def scroll_to_node(self, node_id: str) -> int | None:
        """Scrolls to the kernel that computes `node_id`; returns its 1-based line, or None."""
        kernel = self._kernel_of_node.get(node_id)
        line = self._kernel_line.get(kernel) if kernel else None
        if line is None:
            self.location.setText(f"'{node_id}' is computed by no kernel (a source or dropped node)")
            self.editor.setExtraSelections([])
            return None
        block = self.editor.document().findBlockByLineNumber(line - 1)
        cursor = QtGui.QTextCursor(block)
        self.editor.setTextCursor(cursor)
        # Put the kernel's first line near the top of the view.
        bar = self.editor.verticalScrollBar()
        bar.setValue(min(bar.maximum(), max(0, line - 3)))
        mark = QtWidgets.QTextEdit.ExtraSelection()
        mark.format.setBackground(MARK_COLOR)
        mark.format.setProperty(QtGui.QTextFormat.Property.FullWidthSelection, True)
        mark.cursor = cursor
        self.editor.setExtraSelections([mark])
        self.location.setText(f"'{node_id}' → {kernel}, line {line}")
        return line

    def current_line(self) -> int:
        return self.editor.textCursor().blockNumber() + 1
