"""The benchmark's results: the chart and the table of the run shown, and the list of every run since
the window opened, so that two of the same mode (forward, or training; each batch row to its own length,
or all T steps), in one precision or two (fp32 beside bf16, say), can be compared. The window shows it as
a tab beside the canvas, where a chart has the room to be read; the benchmark panel only starts runs."""

from __future__ import annotations

from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
from matplotlib.figure import Figure
from PySide6 import QtCore, QtGui, QtWidgets

from . import bench_charts
from .bench_runs import (
    COLUMNS,
    BenchRun,
    TableRow,
    comparison_refusal,
    comparison_rows,
    result_columns,
    result_rows,
)

CHART_MIN_HEIGHT = 220  # below this the chart's labels no longer fit beside its bars
TABLE_MIN_HEIGHT = 110
HISTORY_WIDTH = 200
BAD_COLOR = QtGui.QColor(240, 112, 96)
NOT_RUN_COLOR = QtGui.QColor(141, 145, 154)


class BenchResultsView(QtWidgets.QWidget):
    export_chart_requested = QtCore.Signal()
    export_results_requested = QtCore.Signal()
    notice = QtCore.Signal(str)  # for the status bar: why the runs selected are not compared

    def __init__(self, parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.runs: list[BenchRun] = []
        self._draw = self._draw_placeholder  # what the chart shows now, to draw it again for a file

        self.figure = Figure(figsize=(7.5, 3.4), dpi=100)
        self.canvas = FigureCanvasQTAgg(self.figure)
        self.canvas.setMinimumHeight(CHART_MIN_HEIGHT)
        self.table = QtWidgets.QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.setMinimumHeight(TABLE_MIN_HEIGHT)
        rows = self.table.verticalHeader()
        rows.setDefaultSectionSize(self.table.fontMetrics().height() + 8)
        self.history = QtWidgets.QListWidget()
        self.history.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.ExtendedSelection)
        self.history.setMinimumSize(160, 3 * self.history.fontMetrics().height())
        self.history.setToolTip("Runs since the window opened. Select two of one mode, forward or training, "
                                "both with sequence lengths or both without (Ctrl+click), to compare them.")

        self.export_chart_button = QtWidgets.QPushButton("Save chart…")
        self.export_chart_button.setToolTip("Save the chart shown as PNG or SVG, on a light background")
        self.export_results_button = QtWidgets.QPushButton("Save results…")
        self.export_results_button.setToolTip("Save the numbers of the run shown as JSON or CSV")
        # Under the list of runs, not in a row above the chart: the chart keeps that height.
        exports = QtWidgets.QHBoxLayout()
        exports.addWidget(self.export_chart_button)
        exports.addWidget(self.export_results_button)
        hint = QtWidgets.QLabel("Runs: select two to compare")
        hint.setProperty("role", "hint")
        history_box = QtWidgets.QWidget()
        hcol = QtWidgets.QVBoxLayout(history_box)
        hcol.setContentsMargins(0, 0, 0, 0)
        hcol.addWidget(hint)
        hcol.addWidget(self.history, 1)
        hcol.addLayout(exports)

        # Over the table, for a run whose batch rows each ran to a length of their own: what was drawn.
        self.lengths_note = QtWidgets.QLabel()
        self.lengths_note.setProperty("role", "hint")
        self.lengths_note.setWordWrap(True)
        self.lengths_note.hide()
        table_box = QtWidgets.QWidget()
        tcol = QtWidgets.QVBoxLayout(table_box)
        tcol.setContentsMargins(0, 0, 0, 0)
        tcol.setSpacing(2)
        tcol.addWidget(self.lengths_note)
        tcol.addWidget(self.table, 1)

        lower = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        lower.addWidget(table_box)
        lower.addWidget(history_box)
        lower.setStretchFactor(0, 4)
        lower.setStretchFactor(1, 1)
        lower.setSizes([800, HISTORY_WIDTH])
        lower.setChildrenCollapsible(False)
        upper = QtWidgets.QSplitter(QtCore.Qt.Orientation.Vertical)
        upper.addWidget(self.canvas)
        upper.addWidget(lower)
        # Most of the height for the chart: at 1280x720 it was under 240 pixels high; the table scrolls.
        upper.setStretchFactor(0, 5)
        upper.setStretchFactor(1, 2)
        upper.setSizes([500, 200])
        upper.setChildrenCollapsible(False)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(upper, 1)

        self.export_chart_button.clicked.connect(self.export_chart_requested)
        self.export_results_button.clicked.connect(self.export_results_requested)
        self.history.itemSelectionChanged.connect(self._show_selected)
        self._show_chart(self._draw_placeholder)

    def add_run(self, run: BenchRun) -> None:
        """Lists a finished run and shows it."""
        self.runs.append(run)
        item = QtWidgets.QListWidgetItem(run.label())
        item.setData(QtCore.Qt.ItemDataRole.UserRole, run.number)
        tip = f"{run.label()}\nTimes {run.measures()}."
        for text in (run.precision_text(), run.directions_text(), run.lengths_text()):
            if text:
                tip += f"\n{text[0].upper()}{text[1:]}."
        item.setToolTip(tip)
        self.history.addItem(item)
        self.history.clearSelection()
        item.setSelected(True)
        self.history.setCurrentItem(item)

    def selected_runs(self) -> list[BenchRun]:
        numbers = [i.data(QtCore.Qt.ItemDataRole.UserRole) for i in self.history.selectedItems()]
        return [r for r in self.runs if r.number in numbers]

    def shown_run(self) -> BenchRun | None:
        runs = self.selected_runs()
        return runs[-1] if runs else (self.runs[-1] if self.runs else None)

    def save_chart(self, path: str) -> None:
        """The chart shown, drawn light for a file."""
        bench_charts.save_light(self._draw, path)

    # -- showing ------------------------------------------------------------------------------------------
    def _show_chart(self, draw) -> None:
        self._draw = draw
        bench_charts.draw_themed(draw, self.figure, dark=True)
        self.canvas.draw_idle()

    @staticmethod
    def _draw_placeholder(fig: Figure) -> None:
        bench_charts.draw_message("Press Run (F5) to check and time every schedule of the cell.", fig)

    def _show_selected(self) -> None:
        """One run selected: it; two: their comparison, or, where they cannot be compared, why, in the
        chart's place and in the status bar (a Ctrl+click that changed nothing on show said nothing)."""
        runs = self.selected_runs()
        if len(runs) >= 2:
            a, b = runs[-2], runs[-1]
            if why := comparison_refusal(a, b):
                self._show_chart(lambda fig: bench_charts.draw_message(why, fig))
                self._fill_table(["Comparison"], [([why], False)])
                self._show_lengths([])
                self.notice.emit(why)
                return
            self._show_lengths([a, b])
            self._show_chart(lambda fig: bench_charts.draw_comparison(a, b, fig))
            self._fill_table(*comparison_rows(a, b))
            if len(runs) > 2:
                self.notice.emit(f"{len(runs)} runs selected: comparing the last two, #{a.number} and "
                                 f"#{b.number}")
            return
        if runs:
            self.show_run(runs[-1])

    def _show_lengths(self, runs: list[BenchRun]) -> None:
        """The note over the table: for each run shown whose rows ran to their own lengths, which."""
        texts = [(run, run.lengths_text()) for run in runs]
        texts = [(run, text) for run, text in texts if text]
        if len(runs) == 1 and texts:
            text = texts[0][1]
            note = f"{text[0].upper()}{text[1:]}."
        else:
            note = " ".join(f"Run #{run.number}: {text}." for run, text in texts)
        self.lengths_note.setText(note)
        self.lengths_note.setToolTip(note)
        self.lengths_note.setVisible(bool(note))

    def show_run(self, run: BenchRun) -> None:
        self._show_lengths([run])
        self._show_chart(lambda fig: bench_charts.draw_run(run, fig))
        if run.sweep is not None:
            rows = []
            for value, res in zip(run.sweep.values, run.sweep.results, strict=False):
                rows += [([str(value), *cells], ok) for cells, ok in result_rows(res)]
            self._fill_table([run.sweep.param, *result_columns(run.train)], rows)
        else:
            self._fill_table(result_columns(run.train), result_rows(run.result, run.unavailable))

    def _fill_table(self, columns: list[str], rows: list[TableRow]) -> None:
        self.table.clear()
        self.table.setColumnCount(len(columns))
        self.table.setHorizontalHeaderLabels(columns)
        self.table.setRowCount(len(rows))
        for i, (cells, ok) in enumerate(rows):
            for j, text in enumerate(cells):
                item = QtWidgets.QTableWidgetItem(text)
                if j > 0 and text and text[0].isdigit():
                    item.setTextAlignment(QtCore.Qt.AlignmentFlag.AlignRight
                                          | QtCore.Qt.AlignmentFlag.AlignVCenter)
                if ok is None:
                    item.setForeground(NOT_RUN_COLOR)
                elif not ok:
                    item.setForeground(BAD_COLOR)
                item.setToolTip(text)
                self.table.setItem(i, j, item)
        self.table.resizeColumnsToContents()

    def table_text(self) -> list[list[str]]:
        """The table's cells, row by row (for tests and copy)."""
        return [[self.table.item(i, j).text() if self.table.item(i, j) else ""
                 for j in range(self.table.columnCount())] for i in range(self.table.rowCount())]
