"""The equations panel: the cell as a paper prints it (graph_model.equations), drawn with matplotlib's
mathtext and drawn again whenever an edit changes what the cell computes. Clicking a term selects the
nodes it stands for on the canvas; the terms of the selected nodes take the selection's colour.

Above the equations, a one-line entry takes a formula (graph_model.formula): Enter adds what it
computes as one undoable edit, or shows under the entry where and why it cannot.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from matplotlib.backend_bases import MouseEvent
from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.text import Text
from matplotlib.textpath import text_to_path
from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import Cell, CellError, Equation, FormulaError, Term, equations
from . import theme
from .bench_charts import DARK_STYLE

FONT_SIZE = 13.0  # points
MARGIN = 10.0  # points around the equations
ROW_GAP = 10.0  # points between two equations
# Points either side of an operator and of the equals sign: what mathtext puts around them inside a
# term (`f \odot c`), so that operators between terms and within them are spaced alike.
OPERATOR_GAP = 2.5
EQUALS_GAP = 3.5
SEPARATOR_GAP = 3.0  # points after a comma
POINTS_PER_INCH = 72.0
LOGICAL_DPI = 100.0  # the figure's dots per inch on a screen of device pixel ratio 1

BACKGROUND = DARK_STYLE["figure.facecolor"]
TEXT_COLOR = DARK_STYLE["text.color"]
SELECTED_COLOR = "#{:02x}{:02x}{:02x}".format(*theme.SELECTED_COLOR)
HOVER_COLOR = "#ffffff"
UNUSED_COLOR = "#8d919a"  # the hint colour: a value that no update or output uses yet
EXAMPLE = "f = sigmoid(x @ W_f + h @ U_f + b_f)"


@dataclass
class _Drawn:
    """A term as drawn: what its Text artist shows, and its size in points."""

    term: Term
    shown: str
    width: float
    ascent: float
    descent: float


def _measure(term: Term) -> _Drawn:
    """A term's LaTeX as mathtext; its plain text where mathtext cannot parse the LaTeX (an id that a
    broken cell file gave odd characters)."""
    shown, width, ascent, descent = _measured(term.tex, term.text)
    return _Drawn(term, shown, width, ascent, descent)


@functools.lru_cache(maxsize=4096)
def _measured(tex: str, text: str) -> tuple[str, float, float, float]:
    """What a term shows and its size: the same for the same LaTeX, so measured once (matplotlib keeps
    only 50 parses, and a cell of a hundred nodes has hundreds of terms, each measured again at every
    edit that changes what the cell computes)."""
    prop = FontProperties(size=FONT_SIZE)
    shown = f"${tex}$"
    try:
        w, h, d = text_to_path.get_text_width_height_descent(shown, prop, ismath=True)
    except ValueError:
        shown = text.replace("$", r"\$")
        w, h, d = text_to_path.get_text_width_height_descent(shown, prop, ismath=False)
    return shown, float(w), float(h - d), float(d)


class _EquationsCanvas(FigureCanvasQTAgg):
    def wheelEvent(self, event: QtGui.QWheelEvent) -> None:  # noqa: N802 (Qt's name)
        event.ignore()  # for the scroll area around the equations, which matplotlib's canvas would keep


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

        self.figure = Figure(dpi=LOGICAL_DPI, facecolor=BACKGROUND)
        self.view = _EquationsCanvas(self.figure)
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
        layout.addWidget(self.scroll, 1)

        self.entry.returnPressed.connect(self._enter)
        self.add_button.clicked.connect(self._enter)
        self.entry.textEdited.connect(lambda _text: self.clear_formula_error())
        self.view.mpl_connect("button_press_event", self._on_press)
        self.view.mpl_connect("motion_notify_event", self._on_motion)
        self.view.mpl_connect("figure_leave_event", lambda _e: self._hover(None))

        self.equations: list[Equation] = []
        self.items: list[tuple[Text, Term, Equation]] = []  # each drawn term, its artist and equation
        self._selected: set[str] = set()
        self._hovered: Term | None = None
        self._stale = False
        self.clear_formula_error()
        self.show_cell(Cell(name="untitled"))

    # == the equations ===============================================================================
    def show_cell(self, cell: Cell) -> None:
        """Shows the cell's equations: drawn now when the panel is on show, else when it is shown."""
        found = equations(cell)
        if found == self.equations and self.items:
            return
        self.equations = found
        self.message.setText("" if found else "No equations yet: connect a state's update or the cell "
                                              "output, or type a formula above.")
        self.message.setVisible(not found)
        self._stale = True
        if self.isVisible():
            self.draw_equations()

    def showEvent(self, event: QtGui.QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if self._stale:
            self.draw_equations()

    def draw_equations(self) -> None:
        """Lays the equations out in rows, their equals signs aligned, one Text artist a term."""
        self._stale = False
        self._hovered = None
        self.figure.clear()
        self.items = []
        rows = [[_measure(term) for term in eq.terms] for eq in self.equations]
        lhs_width = max((row[0].width for row in rows), default=0.0)
        placed: list[tuple[float, float, _Drawn, Equation]] = []  # x, baseline from the top, term
        top, width = MARGIN, 0.0
        for eq, row in zip(self.equations, rows, strict=True):
            x = MARGIN + lhs_width - row[0].width  # the left sides end where the widest does
            ascent = max(d.ascent for d in row)
            for d in row:
                gap = {"operator": OPERATOR_GAP, "equals": EQUALS_GAP}.get(d.term.kind, 0.0)
                if d.term.kind == "equals":
                    x = MARGIN + lhs_width
                placed.append((x + gap, top + ascent, d, eq))
                x += d.width + 2 * gap + (SEPARATOR_GAP if d.term.kind == "separator" else 0.0)
            top += ascent + max(d.descent for d in row) + ROW_GAP
            width = max(width, x)
        width += MARGIN if rows else 2 * MARGIN
        height = top - ROW_GAP + MARGIN if rows else 2 * MARGIN
        self.figure.set_size_inches(width / POINTS_PER_INCH, height / POINTS_PER_INCH)
        self.view.setFixedSize(math.ceil(width / POINTS_PER_INCH * LOGICAL_DPI),
                               math.ceil(height / POINTS_PER_INCH * LOGICAL_DPI))
        for x, baseline, d, eq in placed:
            artist = self.figure.text(x / POINTS_PER_INCH, (height - baseline) / POINTS_PER_INCH, d.shown,
                                      transform=self.figure.dpi_scale_trans, fontsize=FONT_SIZE,
                                      color=self._color(d.term, eq), ha="left", va="baseline")
            self.items.append((artist, d.term, eq))
        self.view.draw()

    def _color(self, term: Term, eq: Equation) -> str:
        if term is self._hovered:
            return HOVER_COLOR
        if term.nodes and set(term.nodes) <= self._selected:
            return SELECTED_COLOR
        return UNUSED_COLOR if eq.kind == "unused" else TEXT_COLOR

    def _recolor(self) -> None:
        for artist, term, eq in self.items:
            artist.set_color(self._color(term, eq))
        self.view.draw_idle()

    def show_selection(self, ids: list[str]) -> None:
        """Draws the terms whose nodes are all selected in the selection's colour."""
        selected = set(ids)
        if selected != self._selected:
            self._selected = selected
            if self.items:
                self._recolor()

    def term_at(self, event: MouseEvent) -> Term | None:
        for artist, term, _eq in self.items:
            if term.nodes and artist.contains(event)[0]:
                return term
        return None

    def _hover(self, term: Term | None) -> None:
        if term is self._hovered:
            return
        self._hovered = term
        if term is None:
            self.view.unsetCursor()
            self.view.setToolTip("")
        else:
            self.view.setCursor(QtCore.Qt.CursorShape.PointingHandCursor)
            self.view.setToolTip(f"{term.text.strip()}: {', '.join(term.nodes)} (click to select)")
        self._recolor()

    def _on_motion(self, event: MouseEvent) -> None:
        self._hover(self.term_at(event))

    def _on_press(self, event: MouseEvent) -> None:
        term = self.term_at(event)
        if term is not None:
            self.nodes_activated.emit(list(term.nodes))

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
