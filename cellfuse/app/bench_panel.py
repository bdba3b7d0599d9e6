"""The benchmark panel: sizes, backend, schedules and baselines; Run (F5) and Cancel with a progress
bar. The window starts and stops the work; the panel only shows it. Its results (chart, table, the
runs since the window opened) are a view of their own, which the window places where there is room."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from ..graph_model import Sizes
from .bench_results_view import BenchResultsView
from .bench_runs import BenchRun

SIZE_FIELDS = ("seq", "batch", "input", "hidden", "layers")
SIZE_LABELS = {"seq": "Sequence T", "batch": "Batch B", "input": "Input size", "hidden": "Hidden size",
               "layers": "Layers L"}
DEFAULT_SIZES = {"seq": 50, "batch": 32, "input": 256, "hidden": 256, "layers": 1}
SWEEP_NONE = "no sweep"
SIZE_ROWS = 3
CHECK_COLUMNS = 2  # schedules and baselines in two columns, so that the panel stays short


class BenchPanel(QtWidgets.QWidget):
    run_requested = QtCore.Signal()
    cancel_requested = QtCore.Signal()
    sizes_changed = QtCore.Signal()

    def __init__(self, schedules: list[str], baselines: list[str], backends: list[str],
                 parent: QtWidgets.QWidget | None = None) -> None:
        super().__init__(parent)
        self.results = BenchResultsView()
        # The results' widgets, by the names the window and tests use.
        self.runs = self.results.runs
        self.figure, self.table, self.history = self.results.figure, self.results.table, self.results.history
        self.export_chart_button = self.results.export_chart_button
        self.export_results_button = self.results.export_results_button
        self.export_chart_requested = self.results.export_chart_requested
        self.export_results_requested = self.results.export_results_requested
        self._build_settings(schedules, baselines, backends)
        layout = QtWidgets.QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(self._build_run_bar())
        notes = QtWidgets.QHBoxLayout()
        notes.addWidget(self.status, 1)
        notes.addWidget(self.backend_note)
        layout.addLayout(notes)
        layout.addWidget(self.settings_scroll, 1)
        self.set_running(False)

    # -- building --------------------------------------------------------------------------------------
    def _build_settings(self, schedules: list[str], baselines: list[str], backends: list[str]) -> None:
        box = QtWidgets.QWidget()
        col = QtWidgets.QHBoxLayout(box)  # the groups side by side: the dock is wide and short
        col.setContentsMargins(0, 0, 0, 0)

        sizes = QtWidgets.QGroupBox("Sizes")
        grid = QtWidgets.QGridLayout(sizes)
        self.size_spins: dict[str, QtWidgets.QSpinBox] = {}
        for i, key in enumerate(SIZE_FIELDS):
            spin = QtWidgets.QSpinBox()
            spin.setRange(1, 1 << 16 if key != "layers" else 64)
            spin.setValue(DEFAULT_SIZES[key])
            spin.setAccelerated(True)
            spin.valueChanged.connect(self.sizes_changed)
            row, pair = i % SIZE_ROWS, i // SIZE_ROWS  # in pairs of columns: the panel is short
            grid.addWidget(QtWidgets.QLabel(SIZE_LABELS[key]), row, 2 * pair)
            grid.addWidget(spin, row, 2 * pair + 1)
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
        self.sweep_combo = QtWidgets.QComboBox()
        self.sweep_combo.addItems([SWEEP_NONE, *SIZE_FIELDS])
        self.sweep_combo.setToolTip("Run once per value of one size, and chart time against it")
        self.sweep_values = QtWidgets.QLineEdit("16, 32, 64, 128")
        self.sweep_values.setValidator(QtGui.QRegularExpressionValidator(
            QtCore.QRegularExpression(r"[0-9 ,]*"), self.sweep_values))
        self.sweep_values.setToolTip("The values of the swept size, e.g. 16, 32, 64")
        sweep = QtWidgets.QHBoxLayout()
        sweep.addWidget(self.sweep_combo)
        sweep.addWidget(self.sweep_values, 1)
        run_form.addRow("Backend", self.backend_combo)
        run_form.addRow("Repeats", self.repeats_spin)
        run_form.addRow("Sweep", sweep)
        col.addWidget(run_box)
        self.backend_note = QtWidgets.QLabel()
        self.backend_note.setProperty("role", "hint")
        if "cuda" not in backends:
            self.backend_note.setText("No GPU found: numpy backend (CPU)")
            self.backend_note.setToolTip("The numpy backend runs the same Plan on the CPU, checked "
                                         "against the reference; its times are not GPU times.")

        self.schedule_checks = self._check_group(col, "Schedules", schedules)
        self.baseline_checks = self._check_group(col, "Baselines", baselines)
        col.addStretch(1)
        for group in box.findChildren(QtWidgets.QGroupBox):
            group.setSizePolicy(QtWidgets.QSizePolicy.Policy.Preferred, QtWidgets.QSizePolicy.Policy.Maximum)
            col.setAlignment(group, QtCore.Qt.AlignmentFlag.AlignTop)

        self.settings_scroll = QtWidgets.QScrollArea()
        self.settings_scroll.setWidget(box)
        self.settings_scroll.setWidgetResizable(True)
        self.settings_scroll.setMinimumHeight(60)
        self.settings_scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)

    @staticmethod
    def _check_group(row: QtWidgets.QHBoxLayout, title: str, names: list[str]
                     ) -> dict[str, QtWidgets.QCheckBox]:
        """A group of ticked check boxes in columns, added to `row`; returns them by name."""
        box = QtWidgets.QGroupBox(title)
        grid = QtWidgets.QGridLayout(box)
        checks: dict[str, QtWidgets.QCheckBox] = {}
        rows = -(-len(names) // CHECK_COLUMNS)
        for i, name in enumerate(names):
            check = QtWidgets.QCheckBox(name)
            check.setChecked(True)
            grid.addWidget(check, i % rows, i // rows)
            checks[name] = check
        row.addWidget(box)
        return checks

    def _build_run_bar(self) -> QtWidgets.QHBoxLayout:
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
        self.status.setWordWrap(True)
        bar.addWidget(self.run_button)
        bar.addWidget(self.cancel_button)
        bar.addWidget(self.progress, 1)
        self.run_button.clicked.connect(self.run_requested)
        self.cancel_button.clicked.connect(self.cancel_requested)
        return bar

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
        self.results.add_run(run)
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.progress.setFormat("done")

    def selected_runs(self) -> list[BenchRun]:
        return self.results.selected_runs()

    def shown_run(self) -> BenchRun | None:
        return self.results.shown_run()

    def show_run(self, run: BenchRun) -> None:
        self.results.show_run(run)

    def table_text(self) -> list[list[str]]:
        """The results table's cells, row by row (for tests and copy)."""
        return self.results.table_text()
