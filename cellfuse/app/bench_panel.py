"""The benchmark panel: sizes, backend, schedules and baselines; Run (F5) and Cancel with a progress
bar; the chart and the table of the run shown, and every run since the window opened, so that two can
be compared. The window starts and stops the work; the panel only shows it."""

from __future__ import annotations

from matplotlib.backends.backend_qtagg import FigureCanvasQTAgg
from matplotlib.figure import Figure
from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import Sizes
from . import bench_charts
from .bench_runs import COLUMNS, BenchRun, comparison_rows, result_rows

SIZE_FIELDS = ("seq", "batch", "input", "hidden", "layers")
SIZE_LABELS = {"seq": "Sequence T", "batch": "Batch B", "input": "Input size", "hidden": "Hidden size",
               "layers": "Layers L"}
DEFAULT_SIZES = {"seq": 50, "batch": 32, "input": 256, "hidden": 256, "layers": 1}
SWEEP_NONE = "no sweep"


class BenchPanel(QtWidgets.QWidget):
    run_requested = QtCore.Signal()
    cancel_requested = QtCore.Signal()
    sizes_changed = QtCore.Signal()
    export_chart_requested = QtCore.Signal()
    export_results_requested = QtCore.Signal()

    def __init__(self, schedules: list[str], baselines: list[str], backends: list[str],
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.runs: list[BenchRun] = []
        self._build_settings(schedules, baselines, backends)
        self._build_results()
        split = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        split.addWidget(self.settings_scroll)
        split.addWidget(self.results)
        split.setStretchFactor(1, 1)
        split.setSizes([290, 900])
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(split)
        self.set_running(False)

    # -- building --------------------------------------------------------------------------------------
    def _build_settings(self, schedules: list[str], baselines: list[str], backends: list[str]) -> None:
        box = QtWidgets.QWidget()
        col = QtWidgets.QVBoxLayout(box)
        col.setContentsMargins(4, 4, 4, 4)

        sizes = QtWidgets.QGroupBox("Sizes")
        form = QtWidgets.QFormLayout(sizes)
        self.size_spins: dict[str, QtWidgets.QSpinBox] = {}
        for key in SIZE_FIELDS:
            spin = QtWidgets.QSpinBox()
            spin.setRange(1, 1 << 16 if key != "layers" else 64)
            spin.setValue(DEFAULT_SIZES[key])
            spin.setAccelerated(True)
            spin.valueChanged.connect(self.sizes_changed)
            form.addRow(SIZE_LABELS[key], spin)
            self.size_spins[key] = spin
        col.addWidget(sizes)

        run_box = QtWidgets.QGroupBox("Run")
        run_form = QtWidgets.QFormLayout(run_box)
        self.backend_combo = QtWidgets.QComboBox()
        self.backend_combo.addItems(backends)
        self.backend_combo.setCurrentText("cuda" if "cuda" in backends else "numpy")
        self.repeats_spin = QtWidgets.QSpinBox()
        self.repeats_spin.setRange(1, 1000)
        self.repeats_spin.setValue(20)
        run_form.addRow("Backend", self.backend_combo)
        run_form.addRow("Repeats", self.repeats_spin)
        self.backend_note = QtWidgets.QLabel()
        self.backend_note.setWordWrap(True)
        self.backend_note.setProperty("role", "hint")
        if "cuda" not in backends:
            self.backend_note.setText("No GPU found: the benchmark runs the numpy backend "
                                      "(CPU times of the same Plan, checked against the reference).")
        run_form.addRow(self.backend_note)
        col.addWidget(run_box)

        sched_box = QtWidgets.QGroupBox("Schedules")
        sched_col = QtWidgets.QVBoxLayout(sched_box)
        self.schedule_checks: dict[str, QtWidgets.QCheckBox] = {}
        for name in schedules:
            check = QtWidgets.QCheckBox(name)
            check.setChecked(True)
            sched_col.addWidget(check)
            self.schedule_checks[name] = check
        col.addWidget(sched_box)

        base_box = QtWidgets.QGroupBox("Baselines")
        base_col = QtWidgets.QVBoxLayout(base_box)
        self.baseline_checks: dict[str, QtWidgets.QCheckBox] = {}
        for name in baselines:
            check = QtWidgets.QCheckBox(name)
            check.setChecked(True)
            base_col.addWidget(check)
            self.baseline_checks[name] = check
        col.addWidget(base_box)

        sweep_box = QtWidgets.QGroupBox("Sweep")
        sweep_form = QtWidgets.QFormLayout(sweep_box)
        self.sweep_combo = QtWidgets.QComboBox()
        self.sweep_combo.addItems([SWEEP_NONE, *SIZE_FIELDS])
        self.sweep_values = QtWidgets.QLineEdit("16, 32, 64, 128")
        self.sweep_values.setValidator(QtGui.QRegularExpressionValidator(
            QtCore.QRegularExpression(r"[0-9 ,]*"), self.sweep_values))
        sweep_form.addRow("Size", self.sweep_combo)
        sweep_form.addRow("Values", self.sweep_values)
        col.addWidget(sweep_box)
        col.addStretch(1)

        self.settings_scroll = QtWidgets.QScrollArea()
        self.settings_scroll.setWidget(box)
        self.settings_scroll.setWidgetResizable(True)
        self.settings_scroll.setMinimumWidth(250)
        self.settings_scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)

    def _build_results(self) -> None:
        self.results = QtWidgets.QWidget()
        col = QtWidgets.QVBoxLayout(self.results)
        col.setContentsMargins(4, 0, 0, 0)

        bar = QtWidgets.QHBoxLayout()
        self.run_button = QtWidgets.QPushButton("▶  Run benchmark  (F5)")
        self.run_button.setObjectName("primary")
        self.cancel_button = QtWidgets.QPushButton("Cancel")
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setTextVisible(True)
        self.status = QtWidgets.QLabel("Not run yet.")
        self.status.setProperty("role", "hint")
        bar.addWidget(self.run_button)
        bar.addWidget(self.cancel_button)
        bar.addWidget(self.progress, 1)
        col.addLayout(bar)
        col.addWidget(self.status)

        self.figure = Figure(figsize=(7.5, 3.4), dpi=100, facecolor="#f7f7f9")
        self.canvas = FigureCanvasQTAgg(self.figure)
        self.canvas.setMinimumHeight(90)
        self.table = QtWidgets.QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QtWidgets.QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.history = QtWidgets.QListWidget()
        self.history.setSelectionMode(QtWidgets.QAbstractItemView.SelectionMode.ExtendedSelection)
        for widget in (self.table, self.history):
            widget.setMinimumHeight(40)
        self.history.setToolTip("Runs since the window opened. Select two (Ctrl+click) to compare them.")

        exports = QtWidgets.QHBoxLayout()
        self.export_chart_button = QtWidgets.QPushButton("Save chart…")
        self.export_results_button = QtWidgets.QPushButton("Save results…")
        hint = QtWidgets.QLabel("Runs (select two to compare)")
        hint.setProperty("role", "hint")
        exports.addWidget(hint, 1)
        exports.addWidget(self.export_chart_button)
        exports.addWidget(self.export_results_button)

        history_box = QtWidgets.QWidget()
        hcol = QtWidgets.QVBoxLayout(history_box)
        hcol.setContentsMargins(0, 0, 0, 0)
        hcol.addLayout(exports)
        hcol.addWidget(self.history, 1)

        lower = QtWidgets.QSplitter(QtCore.Qt.Orientation.Horizontal)
        lower.addWidget(self.table)
        lower.addWidget(history_box)
        lower.setStretchFactor(0, 3)
        lower.setStretchFactor(1, 2)
        upper = QtWidgets.QSplitter(QtCore.Qt.Orientation.Vertical)
        upper.addWidget(self.canvas)
        upper.addWidget(lower)
        upper.setStretchFactor(0, 3)
        upper.setStretchFactor(1, 2)
        col.addWidget(upper, 1)

        self.run_button.clicked.connect(self.run_requested)
        self.cancel_button.clicked.connect(self.cancel_requested)
        self.export_chart_button.clicked.connect(self.export_chart_requested)
        self.export_results_button.clicked.connect(self.export_results_requested)
        self.history.itemSelectionChanged.connect(self._show_selected)
        self._draw_placeholder()

    # -- settings ----------------------------------------------------------------------------------------
    def sizes(self) -> Sizes:
        return Sizes(**{k: self.size_spins[k].value() for k in SIZE_FIELDS})

    def set_sizes(self, **sizes: int) -> None:
        for k, v in sizes.items():
            if k in self.size_spins:
                self.size_spins[k].setValue(int(v))

    def backend(self) -> str:
        return self.backend_combo.currentText()

    def schedules(self) -> list[str]:
        return [n for n, c in self.schedule_checks.items() if c.isChecked()]

    def baselines(self) -> list[str]:
        return [n for n, c in self.baseline_checks.items() if c.isChecked()]

    def repeats(self) -> int:
        return self.repeats_spin.value()

    def sweep(self) -> tuple[str, list[int]] | None:
        """The swept size and its values, or None; raises ValueError for values that are not sizes."""
        param = self.sweep_combo.currentText()
        if param == SWEEP_NONE:
            return None
        values = [int(v) for v in self.sweep_values.text().replace(",", " ").split()]
        if not values or any(v < 1 for v in values):
            raise ValueError("give the sweep one or more positive sizes, e.g. 16, 32, 64")
        return param, values

    # -- running --------------------------------------------------------------------------------------
    def set_running(self, running: bool) -> None:
        self.run_button.setEnabled(not running)
        self.cancel_button.setEnabled(running)
        self.settings_scroll.widget().setEnabled(not running)
        if running:
            self.progress.setRange(0, 0)

    def show_progress(self, done: int, total: int, message: str) -> None:
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(min(done, total))
        self.progress.setFormat(f"{done}/{total}")
        self.status.setText(message)

    def show_status(self, text: str) -> None:
        self.status.setText(text)

    def add_run(self, run: BenchRun) -> None:
        """Lists a finished run and shows it."""
        self.runs.append(run)
        item = QtWidgets.QListWidgetItem(run.label())
        item.setData(QtCore.Qt.ItemDataRole.UserRole, run.number)
        self.history.addItem(item)
        self.history.clearSelection()
        item.setSelected(True)
        self.history.setCurrentItem(item)
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.progress.setFormat("done")

    def selected_runs(self) -> list[BenchRun]:
        numbers = [i.data(QtCore.Qt.ItemDataRole.UserRole) for i in self.history.selectedItems()]
        return [r for r in self.runs if r.number in numbers]

    def shown_run(self) -> BenchRun | None:
        runs = self.selected_runs()
        return runs[-1] if runs else (self.runs[-1] if self.runs else None)

    # -- showing ------------------------------------------------------------------------------------------
    def _draw_placeholder(self) -> None:
        self.figure.clear()
        ax = self.figure.subplots()
        ax.axis("off")
        ax.text(0.5, 0.5, "Press Run (F5) to check and time every schedule of the cell.",
                ha="center", va="center", color="#555", fontsize=10, transform=ax.transAxes)
        self.canvas.draw_idle()

    def _show_selected(self) -> None:
        runs = self.selected_runs()
        if len(runs) >= 2:
            a, b = runs[-2], runs[-1]
            if a.sweep is None and b.sweep is None:
                bench_charts.draw_comparison(a, b, self.figure)
                self._fill_table(*comparison_rows(a, b))
                self.canvas.draw_idle()
                return
        if runs:
            self.show_run(runs[-1])

    def show_run(self, run: BenchRun) -> None:
        bench_charts.draw_run(run, self.figure)
        self.canvas.draw_idle()
        if run.sweep is not None:
            rows = []
            for value, res in zip(run.sweep.values, run.sweep.results, strict=False):
                rows += [([str(value), *cells], ok) for cells, ok in result_rows(res)]
            self._fill_table([run.sweep.param, *COLUMNS], rows)
        else:
            self._fill_table(COLUMNS, result_rows(run.result))

    def _fill_table(self, columns: list[str], rows: list[tuple[list[str], bool]]) -> None:
        self.table.clear()
        self.table.setColumnCount(len(columns))
        self.table.setHorizontalHeaderLabels(columns)
        self.table.setRowCount(len(rows))
        bad = QtGui.QColor(240, 112, 96)
        for i, (cells, ok) in enumerate(rows):
            for j, text in enumerate(cells):
                item = QtWidgets.QTableWidgetItem(text)
                if j > 0 and text and text[0].isdigit():
                    item.setTextAlignment(QtCore.Qt.AlignmentFlag.AlignRight
                                          | QtCore.Qt.AlignmentFlag.AlignVCenter)
                if not ok:
                    item.setForeground(bad)
                item.setToolTip(text)
                self.table.setItem(i, j, item)
        self.table.resizeColumnsToContents()

    def table_text(self) -> list[list[str]]:
        """The table's cells, row by row (for tests and copy)."""
        return [[self.table.item(i, j).text() if self.table.item(i, j) else ""
                 for j in range(self.table.columnCount())] for i in range(self.table.rowCount())]
