"""The benchmark panel: sizes, backend, schedules and baselines, the forward pass or training (forward +
backward); Run (F5) and Cancel with a progress bar. The window starts and stops the work; the panel only
shows it. Its results (chart, table, the runs since the window opened) are a view of their own, which the
window places where there is room."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from ..gpu_runtime.bench import TRAIN_BASELINES
from ..graph_model import Sizes
from .bench_results_view import BenchResultsView
from .bench_runs import BenchRun
from .recent_files import settings

SIZE_FIELDS = ("seq", "batch", "input", "hidden", "layers")
SIZE_LABELS = {"seq": "Sequence T", "batch": "Batch B", "input": "Input size", "hidden": "Hidden size",
               "layers": "Layers L"}
DEFAULT_SIZES = {"seq": 50, "batch": 32, "input": 256, "hidden": 256, "layers": 1}
SWEEP_NONE = "no sweep"
SIZE_ROWS = 3
TRAIN_KEY = "benchmark/train"  # the training switch, remembered when the editor closes
TRAIN_TEXT = "Training (forward + backward)"
# Settings in one click. "Quick CPU check": a short sequence and a few repeats on the CPU, a run of
# seconds that says whether every schedule is right and roughly how they rank; the default: the
# sizes and repeats the panel opens with.
PRESETS: dict[str, dict] = {
    "Quick CPU check": {"sizes": {"seq": 8, "batch": 8}, "repeats": 3, "backend": "numpy"},
    "Default": {"sizes": {"seq": DEFAULT_SIZES["seq"], "batch": DEFAULT_SIZES["batch"]}, "repeats": 20},
}
FORWARD_ONLY = ("Forward only: not run in training mode, which times forward + backward with autograd "
                f"and offers {', '.join(TRAIN_BASELINES)}")


class StatusLine(QtWidgets.QLabel):
    """One line of status, cut short with an ellipsis where the panel is narrower than it, the whole in
    its tooltip: a status that wrapped to three lines (the baselines not available here) took the
    height of the settings under it. `text()` is the whole."""

    def __init__(self, text: str = "") -> None:
        super().__init__()
        self._full = ""
        self.setSizePolicy(QtWidgets.QSizePolicy.Policy.Ignored, QtWidgets.QSizePolicy.Policy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:  # noqa: N802 (Qt's name)
        self._full = text
        self.setToolTip(text)
        self._elide()

    def text(self) -> str:
        return self._full

    def resizeEvent(self, event: QtGui.QResizeEvent) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        elide = QtCore.Qt.TextElideMode.ElideRight
        super().setText(self.fontMetrics().elidedText(self._full, elide, max(self.width(), 1)))


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
        """Every setting in one grid of three rows: the dock is wide and short (at 1366x768 it has room
        for about four rows beside the run bar). The schedules and baselines are ticked in drop-down
        lists, each a button that says what is ticked."""
        box = QtWidgets.QWidget()
        grid = QtWidgets.QGridLayout(box)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(8)
        grid.setVerticalSpacing(4)

        def add(row: int, pair: int, label: str, widget: QtWidgets.QWidget | QtWidgets.QLayout,
                span: int = 1) -> None:
            grid.addWidget(QtWidgets.QLabel(label), row, 2 * pair)
            if isinstance(widget, QtWidgets.QLayout):
                grid.addLayout(widget, row, 2 * pair + 1, 1, 2 * span - 1)
            else:
                grid.addWidget(widget, row, 2 * pair + 1, 1, 2 * span - 1)

        self.size_spins: dict[str, QtWidgets.QSpinBox] = {}
        for i, key in enumerate(SIZE_FIELDS):
            spin = QtWidgets.QSpinBox()
            spin.setRange(1, 1 << 16 if key != "layers" else 64)
            spin.setValue(DEFAULT_SIZES[key])
            spin.setAccelerated(True)
            spin.valueChanged.connect(self.sizes_changed)
            add(i % SIZE_ROWS, i // SIZE_ROWS, SIZE_LABELS[key], spin)
            self.size_spins[key] = spin

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
        self._withheld: set[str] = set()  # the baselines not offered in the mode chosen (forward only)
        self.schedules_button, self.schedule_checks = self._check_list("schedules", schedules)
        self.baselines_button, self.baseline_checks = self._check_list("baselines", baselines)
        add(0, 2, "Backend", self.backend_combo)
        add(1, 2, "Repeats", self.repeats_spin)
        add(2, 1, "Sweep", sweep, span=2)
        add(0, 3, "Schedules", self.schedules_button)
        add(1, 3, "Baselines", self.baselines_button)
        grid.setColumnStretch(grid.columnCount(), 1)
        grid.setRowStretch(SIZE_ROWS, 1)

        self.backend_note = QtWidgets.QLabel()
        self.backend_note.setProperty("role", "hint")
        if "cuda" not in backends:
            self.backend_note.setText("No GPU found: numpy backend (CPU)")
            self.backend_note.setToolTip("The numpy backend runs the same Plan on the CPU, checked "
                                         "against the reference; its times are not GPU times.")

        # A window smaller than any laptop's still reaches every setting.
        self.settings_scroll = QtWidgets.QScrollArea()
        self.settings_scroll.setWidget(box)
        self.settings_scroll.setWidgetResizable(True)
        self.settings_scroll.setMinimumHeight(60)
        self.settings_scroll.setFrameShape(QtWidgets.QFrame.Shape.NoFrame)

    def _check_list(self, what: str, names: list[str]
                    ) -> tuple[QtWidgets.QToolButton, dict[str, QtWidgets.QCheckBox]]:
        """A button whose drop-down list ticks `names` (all ticked at first), and the check boxes by name.
        Check boxes, not checkable menu items, so that the list stays open while several are ticked."""
        button = QtWidgets.QToolButton()
        button.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.InstantPopup)
        button.setToolButtonStyle(QtCore.Qt.ToolButtonStyle.ToolButtonTextOnly)
        # As wide as its longest text ("5 of 6") and the drop-down arrow beside it.
        button.setMinimumWidth(button.fontMetrics().horizontalAdvance(f"{len(names)} of {len(names)}") + 36)
        menu = QtWidgets.QMenu(button)
        checks: dict[str, QtWidgets.QCheckBox] = {}
        for name in names:
            check = QtWidgets.QCheckBox(name)
            check.setChecked(True)
            check.setContentsMargins(8, 2, 8, 2)
            action = QtWidgets.QWidgetAction(menu)
            action.setDefaultWidget(check)
            menu.addAction(action)
            checks[name] = check
        button.setMenu(menu)
        for check in checks.values():
            check.toggled.connect(lambda _on: self._show_ticked(what, button, checks))
        self._show_ticked(what, button, checks)
        return button, checks

    def _show_ticked(self, what: str, button: QtWidgets.QToolButton,
                     checks: dict[str, QtWidgets.QCheckBox]) -> None:
        """The button says what is ticked of what is offered: a box disabled in this mode counts in
        neither."""
        offered = [n for n in checks if n not in self._withheld]
        ticked = [n for n in offered if checks[n].isChecked()]
        if len(ticked) == len(offered):
            text = f"all {len(offered)}"
        elif not ticked:
            text = "none"
        else:
            text = f"{len(ticked)} of {len(offered)}"
        button.setText(text)
        button.setToolTip(f"The {what} to time: " + (", ".join(ticked) or "none")
                          + ". Click to choose.")

    def _train_toggled(self, on: bool) -> None:
        settings().setValue(TRAIN_KEY, on)
        self._offer_baselines()

    def _offer_baselines(self) -> None:
        """In training mode the forward-only baselines are disabled and say why; each keeps its tick for
        the forward mode."""
        train = self.train()
        self._withheld = {n for n in self.baseline_checks if train and n not in TRAIN_BASELINES}
        for name, check in self.baseline_checks.items():
            check.setEnabled(name not in self._withheld)
            check.setToolTip(FORWARD_ONLY if name in self._withheld else "")
        self._show_ticked("baselines", self.baselines_button, self.baseline_checks)

    def _build_run_bar(self) -> QtWidgets.QHBoxLayout:
        bar = QtWidgets.QHBoxLayout()
        self.run_button = QtWidgets.QPushButton("▶  Run benchmark  (F5)")
        self.run_button.setObjectName("primary")
        self.cancel_button = QtWidgets.QPushButton("Cancel")
        # Beside Run, whose work it changes; the settings' grid has no room left at 1280x720.
        self.train_check = QtWidgets.QCheckBox(TRAIN_TEXT)
        self.train_check.setToolTip("Time forward + backward: every schedule's gradients of x, the initial "
                                    "states and every parameter, checked against the float64 reference's "
                                    "before they are timed")
        self.train_check.setChecked(settings().value(TRAIN_KEY, False, type=bool))
        self.train_check.toggled.connect(self._train_toggled)
        self._offer_baselines()
        self.preset_button = QtWidgets.QToolButton()
        self.preset_button.setText("Presets")
        self.preset_button.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.InstantPopup)
        self.preset_button.setToolTip("Set the sizes, repeats and backend in one click")
        presets = QtWidgets.QMenu(self.preset_button)
        for name, preset in PRESETS.items():
            action = presets.addAction(f"{name}: {self._preset_text(preset)}")
            action.triggered.connect(lambda _checked=False, n=name: self.apply_preset(n))
        self.preset_button.setMenu(presets)
        self.progress = QtWidgets.QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setTextVisible(True)
        self.status = StatusLine("Not run yet.")
        self.status.setProperty("role", "hint")
        bar.addWidget(self.run_button)
        bar.addWidget(self.cancel_button)
        bar.addWidget(self.preset_button)
        bar.addWidget(self.train_check)
        bar.addWidget(self.progress, 1)
        self.run_button.clicked.connect(self.run_requested)
        self.cancel_button.clicked.connect(self.cancel_requested)
        return bar

    def needed_height(self) -> int:
        """The height that shows the run bar and every setting without scrolling."""
        layout = self.layout()
        margins = layout.contentsMargins()
        rows = [self.run_button.sizeHint().height(), self.status.sizeHint().height(),
                self.settings_scroll.widget().sizeHint().height() + 2 * self.settings_scroll.frameWidth()]
        return sum(rows) + 2 * layout.spacing() + margins.top() + margins.bottom()

    # -- settings ----------------------------------------------------------------------------------------
    @staticmethod
    def _preset_text(preset: dict) -> str:
        parts = [f"{SIZE_LABELS[k].split()[-1]}={v}" for k, v in preset["sizes"].items()]
        parts.append(f"{preset['repeats']} repeats")
        if "backend" in preset:
            parts.append(preset["backend"])
        return ", ".join(parts)

    def apply_preset(self, name: str) -> None:
        """Sets the sizes, repeats and backend of preset `name` (the others stay as they are)."""
        preset = PRESETS[name]
        self.set_sizes(**preset["sizes"])
        self.repeats_spin.setValue(preset["repeats"])
        backend = preset.get("backend")
        if backend is not None and self.backend_combo.findText(backend) >= 0:
            self.backend_combo.setCurrentText(backend)
        self.show_status(f"{name}: {self._preset_text(preset)}. Press Run (F5).")

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
        """The baselines ticked and offered in the mode chosen."""
        return [n for n, c in self.baseline_checks.items() if c.isChecked() and n not in self._withheld]

    def train(self) -> bool:
        """Whether to time training (forward + backward, gradients checked) instead of the forward pass."""
        return self.train_check.isChecked()

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
        self.train_check.setEnabled(not running)
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
