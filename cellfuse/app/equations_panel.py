"""The equations panel: the cell as a paper prints it (graph_model.equations), drawn term by term with
matplotlib's mathtext and drawn again whenever an edit changes what the cell computes. Clicking a term
selects the nodes it stands for on the canvas; the terms of the selected nodes take the selection's
colour.

Each term's LaTeX is rendered once and kept (term_images): an edit draws the equations again from the
terms already rendered, and terms not seen yet are rendered a slice at a time between the editor's
events, the last drawing staying on show meanwhile (a cell of a thousand nodes has five hundred terms,
a few milliseconds each). Nothing is rendered while the panel is out of sight (a tab behind another).

Above the equations, a one-line entry takes a formula (graph_model.formula): Enter adds what it
computes as one undoable edit, or shows under the entry where and why it cannot.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import Cell, CellError, Equation, FormulaError, Term, equations
from . import theme
from .bench_charts import DARK_STYLE
from .term_images import TermImage, is_rendered, term_image

FONT_SIZE = 13.0  # points
LOGICAL_DPI = 100.0  # the terms' dots per inch on a screen of device pixel ratio 1
PX = LOGICAL_DPI / 72.0  # logical pixels a point
MARGIN = 10.0 * PX  # around the equations
# between two equations (a term's image holds the font's whole height and a pixel more each side: rows are
# as far apart as matplotlib's measures of the same terms put them)
ROW_GAP = 7.0 * PX
# Either side of an operator and of the equals sign: what mathtext puts around them inside a term
# (`f \odot c`), so that operators between terms and within them are spaced alike.
OPERATOR_GAP = 2.5 * PX
EQUALS_GAP = 3.5 * PX
SEPARATOR_GAP = 3.0 * PX  # after a comma
SLICE_S = 0.02  # rendering new terms at most this long before the editor handles its events again
BUSY_AFTER_S = 0.3  # rendering that takes longer is said under the entry

BACKGROUND = DARK_STYLE["figure.facecolor"]
TEXT_COLOR = DARK_STYLE["text.color"]
SELECTED_COLOR = "#{:02x}{:02x}{:02x}".format(*theme.SELECTED_COLOR)
HOVER_COLOR = "#ffffff"
UNUSED_COLOR = "#8d919a"  # the hint colour: a value that no update or output uses yet
EXAMPLE = "f = sigmoid(x @ W_f + h @ U_f + b_f)"


@dataclass
class DrawnTerm:
    """A term as drawn: its equation, its image and where the image is, in the view's logical pixels."""

    term: Term
    equation: Equation
    image: TermImage
    rect: QtCore.QRectF


class _EquationsView(QtWidgets.QWidget):
    """The drawn terms; the panel places them and says their colours. The wheel is left to the scroll
    area around."""

    def __init__(self, panel: EquationsPanel) -> None:
        super().__init__()
        self._panel = panel
        self.setMouseTracking(True)

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        painter = QtGui.QPainter(self)
        painter.fillRect(event.rect(), QtGui.QColor(BACKGROUND))
        exposed = QtCore.QRectF(event.rect())
        for item in self._panel.items:
            if item.rect.intersects(exposed):
                painter.drawImage(item.rect.topLeft(), item.image.tinted(self._panel.color_of(item)))
        painter.end()

    def mouseMoveEvent(self, event: QtGui.QMouseEvent) -> None:  # noqa: N802 (Qt's name)
        self._panel._hover(self._panel.term_at(event.position()))

    def leaveEvent(self, event: QtCore.QEvent) -> None:  # noqa: N802 (Qt's name)
        self._panel._hover(None)

    def mousePressEvent(self, event: QtGui.QMouseEvent) -> None:  # noqa: N802 (Qt's name)
        item = self._panel.term_at(event.position())
        if event.button() == QtCore.Qt.MouseButton.LeftButton and item is not None:
            self._panel.nodes_activated.emit(list(item.term.nodes))


class EquationsPanel(QtWidgets.QWidget):
    nodes_activated = QtCore.Signal(list)  # the ids of the nodes of a clicked term
    formula_entered = QtCore.Signal(str)

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        mono = QtGui.QFontDatabase.systemFont(QtGui.QFontDatabase.SystemFont.FixedFont)
        self.entry = QtWidgets.QLineEdit()
        self.entry.setFont(mono)
        self.entry.setPlaceholderText(f"{EXAMPLE}    (Enter adds it)")
        self.entry.setToolTip("A formula adds the nodes it computes, as one undoable edit. Names the cell "
                              "lacks become weights (right of @, or beside a [batch, D] value) or states "
                              "(left of @). h' = ... sets the update of state h, y = ... the output.")
        self.add_button = QtWidgets.QPushButton("Add")
        self.add_button.setToolTip("Add what the formula computes (Enter)")
        self.pointer = QtWidgets.QLabel()
        self.pointer.setFont(mono)
        self.pointer.setProperty("role", "error")
        self.pointer.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.error = QtWidgets.QLabel()
        self.error.setProperty("role", "error")
        self.error.setWordWrap(True)
        self.error.setTextFormat(QtCore.Qt.TextFormat.PlainText)
        self.message = QtWidgets.QLabel()
        self.message.setProperty("role", "hint")
        self.message.setWordWrap(True)

        self.busy = QtWidgets.QLabel("Updating the equations…")
        self.busy.setProperty("role", "hint")
        self.busy.setVisible(False)

        self.view = _EquationsView(self)
        self.scroll = QtWidgets.QScrollArea()
        self.scroll.setWidget(self.view)
        self.scroll.setWidgetResizable(False)
        self.scroll.setStyleSheet(f"QScrollArea {{ background: {BACKGROUND}; border: none; }}")

        entry_row = QtWidgets.QHBoxLayout()
        label = QtWidgets.QLabel("Formula")
        label.setProperty("role", "hint")
        entry_row.addWidget(label)
        entry_row.addWidget(self.entry, 1)
        entry_row.addWidget(self.add_button)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addLayout(entry_row)
        layout.addWidget(self.pointer)
        layout.addWidget(self.error)
        layout.addWidget(self.message)
        layout.addWidget(self.busy)
        layout.addWidget(self.scroll, 1)

        self.entry.returnPressed.connect(self._enter)
        self.add_button.clicked.connect(self._enter)
        self.entry.textEdited.connect(lambda _text: self.clear_formula_error())

        self.equations: list[Equation] = []
        self.items: list[DrawnTerm] = []  # the terms on show, of the equations drawn last
        self._selected: set[str] = set()
        self._hovered: Term | None = None
        self._stale = False  # the equations changed since they were drawn
        self._todo: list[tuple[str, str]] = []  # (LaTeX, text) of the terms still to render
        self._started = 0.0  # when the rendering of the terms now to do began
        self._slices = QtCore.QTimer(self)
        self._slices.setSingleShot(True)
        self._slices.setInterval(0)
        self._slices.timeout.connect(self._render_some)
        self.clear_formula_error()
        self.show_cell(Cell(name="untitled"))

    # == the equations ===============================================================================
    def show_cell(self, cell: Cell) -> None:
        """Shows the cell's equations: drawn now when the panel is on show, else when it is shown."""
        found = equations(cell)
        if found == self.equations and not self._stale and not self._todo and self.items:
            return
        self.equations = found
        self.message.setText("" if found else "No equations yet: connect a state's update or the cell "
                                              "output, or type a formula above.")
        self.message.setVisible(not found)
        self._stale = True
        if not self.visibleRegion().isEmpty():
            self._start()

    @property
    def drawing(self) -> bool:
        """Whether terms are being rendered (between the editor's events) for the equations to draw."""
        return bool(self._todo)

    def up_to_date(self) -> bool:
        """Whether the equations on show are the cell's."""
        return not self._stale and not self._todo

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        # Painted means on show: a dock behind another's tab is "visible" to Qt, but never painted.
        super().paintEvent(event)
        if self._stale:
            QtCore.QTimer.singleShot(0, self._start_if_stale)

    def _start_if_stale(self) -> None:
        if self._stale:
            self._start()

    def _start(self) -> None:
        """Renders the terms the equations need that are not rendered yet, a slice now and the rest
        between the editor's events; the equations are drawn once all are."""
        self._stale = False
        ratio = self.view.devicePixelRatioF()
        needed = dict.fromkeys((t.tex, t.text) for eq in self.equations for t in eq.terms)
        self._todo = [(tex, text) for tex, text in needed
                      if not is_rendered(tex, text, FONT_SIZE, LOGICAL_DPI, ratio)]
        self._started = time.perf_counter()
        self._render_some()

    def _render_some(self) -> None:
        ratio = self.view.devicePixelRatioF()
        end = time.perf_counter() + SLICE_S
        while self._todo and time.perf_counter() < end:
            tex, text = self._todo.pop()
            term_image(tex, text, FONT_SIZE, LOGICAL_DPI, ratio)
        if self._todo:
            if time.perf_counter() - self._started > BUSY_AFTER_S and not self.busy.isVisible():
                self.busy.setVisible(True)
            self._slices.start()
            return
        self.busy.setVisible(False)
        self.draw_equations()

    def draw_equations(self) -> None:
        """Lays the equations out in rows, their equals signs aligned, from the terms' images (rendered
        now where they are not yet)."""
        self._hovered = None
        ratio = self.view.devicePixelRatioF()

        def on_pixel(v: float) -> float:  # a device pixel's edge: an image drawn between would blur
            return round(v * ratio) / ratio

        rows = [[term_image(t.tex, t.text, FONT_SIZE, LOGICAL_DPI, ratio) for t in eq.terms]
                for eq in self.equations]
        lhs_width = max((row[0].width for row in rows), default=0.0)
        items: list[DrawnTerm] = []
        top, width = MARGIN, 0.0
        for eq, row in zip(self.equations, rows, strict=True):
            x = MARGIN + lhs_width - row[0].width  # the left sides end where the widest does
            ascent = max(image.ascent for image in row)
            for term, image in zip(eq.terms, row, strict=True):
                gap = {"operator": OPERATOR_GAP, "equals": EQUALS_GAP}.get(term.kind, 0.0)
                if term.kind == "equals":
                    x = MARGIN + lhs_width
                size = QtCore.QSizeF(image.mask.size()) / ratio
                corner = QtCore.QPointF(on_pixel(x + gap), on_pixel(top + ascent - image.ascent))
                items.append(DrawnTerm(term, eq, image, QtCore.QRectF(corner, size)))
                x += image.width + 2 * gap + (SEPARATOR_GAP if term.kind == "separator" else 0.0)
            top += ascent + max(image.descent for image in row) + ROW_GAP
            width = max(width, x)
        width += MARGIN if rows else 2 * MARGIN
        height = top - ROW_GAP + MARGIN if rows else 2 * MARGIN
        self.items = items
        self.view.setFixedSize(math.ceil(width), math.ceil(height))
        self.view.update()

    def color_of(self, item: DrawnTerm) -> str:
        if item.term is self._hovered:
            return HOVER_COLOR
        if item.term.nodes and set(item.term.nodes) <= self._selected:
            return SELECTED_COLOR
        return UNUSED_COLOR if item.equation.kind == "unused" else TEXT_COLOR

    def show_selection(self, ids: list[str]) -> None:
        """Draws the terms whose nodes are all selected in the selection's colour."""
        selected = set(ids)
        if selected != self._selected:
            self._selected = selected
            self.view.update()

    def term_at(self, pos: QtCore.QPointF) -> DrawnTerm | None:
        """The drawn term under `pos` (in the view's pixels) that stands for nodes."""
        for item in self.items:
            if item.term.nodes and item.rect.contains(pos):
                return item
        return None

    def _hover(self, item: DrawnTerm | None) -> None:
        term = item.term if item is not None else None
        if term is self._hovered:
            return
        self._hovered = term
        if term is None:
            self.view.unsetCursor()
            self.view.setToolTip("")
        else:
            self.view.setCursor(QtCore.Qt.CursorShape.PointingHandCursor)
            self.view.setToolTip(f"{term.text.strip()}: {', '.join(term.nodes)} (click to select)")
        self.view.update()

    # == the formula entry ===========================================================================
    def _enter(self) -> None:
        if self.entry.text().strip():
            self.formula_entered.emit(self.entry.text())

    def focus_entry(self) -> None:
        self.entry.setFocus(QtCore.Qt.FocusReason.ShortcutFocusReason)
        self.entry.selectAll()

    def show_formula_error(self, error: CellError) -> None:
        """Says why the formula was not added; for an error in the formula itself, where: the entry's
        cursor goes to the column, and the formula is shown again with a caret under it."""
        if isinstance(error, FormulaError):
            self.pointer.setText(error.pointed())
            self.pointer.setVisible(True)
            self.error.setText(f"Column {error.column + 1}: {error.reason}")
            self.entry.setCursorPosition(error.column)
        else:
            self.pointer.setVisible(False)
            self.error.setText(str(error))
        self.error.setVisible(True)
        self.entry.setFocus(QtCore.Qt.FocusReason.OtherFocusReason)

    def clear_formula_error(self) -> None:
        self.pointer.setVisible(False)
        self.error.setVisible(False)

    def formula_added(self) -> None:
        """Empties the entry for the next formula."""
        self.entry.clear()
        self.clear_formula_error()
