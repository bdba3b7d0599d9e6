"""The CUDA view: the generated source of the chosen schedule, highlighted and read-only. Selecting
a node scrolls to the kernel (or GEMM) that computes it and marks the node's own line in it.

A new source replaces only the lines that differ from those on show: an edit changes a few lines of the
thousands a large cell's source has, and each line set anew is laid out and highlighted again (the
view also stays where it was scrolled to).
"""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from .cuda_highlighter import CudaHighlighter

MARK_COLOR = QtGui.QColor(255, 214, 90, 70)  # the node's own line
KERNEL_MARK_COLOR = QtGui.QColor(120, 160, 230, 40)  # the first line of its kernel


class CudaView(QtWidgets.QWidget):
    export_requested = QtCore.Signal()

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.title = QtWidgets.QLabel("No source yet.")
        self.title.setProperty("role", "hint")
        self.stale = QtWidgets.QLabel()
        self.stale.setProperty("role", "error")
        self.stale.setWordWrap(True)
        self.stale.setVisible(False)
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
        self.editor.setUndoRedoEnabled(False)  # the text is replaced piecewise (see _show_text)
        self.editor.setLineWrapMode(QtWidgets.QPlainTextEdit.LineWrapMode.NoWrap)
        font = QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont)
        font.setPointSizeF(max(9.0, font.pointSizeF()))
        self.editor.setFont(font)
        self.editor.setStyleSheet("QPlainTextEdit { background: #1e1f24; color: #d6d9e0; }")
        self.highlighter = CudaHighlighter(self.editor.document())
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(top)
        layout.addWidget(self.stale)
        layout.addWidget(self.editor, 1)
        self._kernel_of_node: dict[str, str] = {}
        self._kernel_line: dict[str, int] = {}
        self._source = ""
        self._shown = ""  # the text on show: the source, under the out-of-date note where there is one
        self._banner_lines = 0  # lines above the source: the out-of-date note
        self.has_source = False
        self.export_button.clicked.connect(self.export_requested)

    def show_source(self, text: str, kernel_of_node: dict[str, str], kernel_line: dict[str, int],
                    title: str) -> None:
        self._source = text
        self._banner_lines = 0
        self._show_text(text)
        self._kernel_of_node = dict(kernel_of_node)
        self._kernel_line = dict(kernel_line)
        self.title.setText(title)
        self.export_button.setEnabled(True)
        self.has_source = True
        self.stale.setVisible(False)

    @property
    def out_of_date(self) -> bool:
        return not self.stale.isHidden()

    def mark_out_of_date(self, reason: str) -> None:
        """Keeps the last generated source on show, marked, while the cell cannot be compiled."""
        if not self.has_source:
            self.show_message(reason)
            return
        self.stale.setText(f"Out of date: the CUDA of the last valid cell. {reason}")
        self.stale.setVisible(True)
        self.export_button.setEnabled(False)  # an export compiles the cell as it is now
        # The reason heads the source too, so that a copy of the text says what it is.
        banner = f"// {reason}\n// Out of date: the CUDA of the last valid cell, kept for reading.\n\n"
        self._banner_lines = banner.count("\n")
        self._show_text(banner + self._source)

    def show_message(self, text: str) -> None:
        self._show_text(f"// {text}")
        self.has_source = False
        self._banner_lines = 0
        self.stale.setVisible(False)
        self._kernel_of_node, self._kernel_line = {}, {}
        self.title.setText(text)
        self.location.clear()
        self.export_button.setEnabled(False)

    def text(self) -> str:
        return self._shown

    def _show_text(self, text: str) -> None:
        """Shows `text`, setting anew only the lines from the first that differs from those on show to
        the last that does."""
        old, new = self._shown.split("\n"), text.split("\n")
        if old == new:
            return
        same = min(len(old), len(new))
        first = next((i for i in range(same) if old[i] != new[i]), same)
        tail = next((k for k in range(same - first) if old[-1 - k] != new[-1 - k]), same - first)
        document = self.editor.document()
        cursor = QtGui.QTextCursor(document)
        end = document.characterCount() - 1  # the text's end, which has no line break after it
        if first == len(old):  # lines added after the last
            start, middle = end, "".join("\n" + line for line in new[first:])
        elif tail:  # up to the first line of the unchanged end
            start, end = (document.findBlockByNumber(i).position() for i in (first, len(old) - tail))
            middle = "".join(line + "\n" for line in new[first:len(new) - tail])
        else:  # to the end
            start, middle = document.findBlockByNumber(first).position(), "\n".join(new[first:])
            if first == len(new):
                start -= 1  # the last lines go: the line break before them too
        cursor.setPosition(start)
        cursor.setPosition(end, QtGui.QTextCursor.MoveMode.KeepAnchor)
        cursor.insertText(middle)
        self._shown = text

    def kernel_of(self, node_id: str) -> str | None:
        return self._kernel_of_node.get(node_id)

    def node_line(self, node_id: str) -> int | None:
        """The 1-based line of the source where the kernel computes `node_id` (`const float v_<id> = ...`),
        or None where the node has no line of its own (a GEMM, a source)."""
        kernel = self._kernel_of_node.get(node_id)
        start = self._kernel_line.get(kernel) if kernel else None
        if start is None:
            return None
        needle = f"const float v_{node_id} ="
        lines = self._source.splitlines()
        for number in range(start, len(lines) + 1):
            text = lines[number - 1]
            if needle in text:
                return number
            if number > start and text.startswith("}"):  # the kernel's end
                return None
        return None

    def scroll_to_node(self, node_id: str) -> int | None:
        """Scrolls to the kernel that computes `node_id` and marks the node's own line in it (the kernel's
        first line where the node has none); the cursor goes to the marked line, so that a copy or a
        search starts there. Returns the marked line, 1-based, or None."""
        kernel = self._kernel_of_node.get(node_id)
        line = self._kernel_line.get(kernel) if kernel else None
        if line is None:
            self.location.setText(f"'{node_id}' is computed by no kernel (a source or dropped node)")
            self.editor.setExtraSelections([])
            return None
        own = self.node_line(node_id) or line
        document = self.editor.document()
        cursor = QtGui.QTextCursor(document.findBlockByLineNumber(own - 1 + self._banner_lines))
        self.editor.setTextCursor(cursor)
        # The kernel's first line near the top of the view when the node's line fits below it, else
        # the node's line in the middle.
        bar = self.editor.verticalScrollBar()
        rows = max(1, self.editor.viewport().height() // max(1, self.editor.fontMetrics().height()))
        top = line - 3 if own - (line - 3) < rows - 2 else own - rows // 2
        bar.setValue(min(bar.maximum(), max(0, top - 1 + self._banner_lines)))
        marks = []
        for number, color in ((line, KERNEL_MARK_COLOR), (own, MARK_COLOR)):
            mark = QtWidgets.QTextEdit.ExtraSelection()
            mark.format.setBackground(color)
            mark.format.setProperty(QtGui.QTextFormat.Property.FullWidthSelection, True)
            mark.cursor = QtGui.QTextCursor(document.findBlockByLineNumber(number - 1 + self._banner_lines))
            marks.append(mark)
        self.editor.setExtraSelections(marks)
        where = f"line {own}" if own != line else f"line {line}"
        self.location.setText(f"'{node_id}' → {kernel}, {where}")
        return own

    def current_line(self) -> int:
        return self.editor.textCursor().blockNumber() + 1
