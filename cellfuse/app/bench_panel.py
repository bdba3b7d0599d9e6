"""The benchmark panel: sizes, backend, schedules and baselines, the sequence lengths (all T steps, or each
batch row to its own), one direction or both, the precision (fp32, bf16, fp16), the forward pass or training
(forward + backward); Run (F5) and Cancel with a progress bar. The window starts and stops the work; the
panel only shows it. Its results (chart, table, the runs since the window opened) are a view of their own,
which the window places where there is room."""

from __future__ import annotations

from PySide6 import QtCore, QtGui, QtWidgets

from ..codegen.precision import PRECISIONS, forward_tolerance, gradient_tolerance
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
# sizes and repeats the panel opens with. Both run every row all T steps in one direction, in float32, as
# the panel opens.
PRESETS: dict[str, dict] = {
    "Quick CPU check": {"sizes": {"seq": 8, "batch": 8}, "repeats": 3, "backend": "numpy", "lengths": None,
                        "bidirectional": False, "precision": "fp32"},
    "Default": {"sizes": {"seq": DEFAULT_SIZES["seq"], "batch": DEFAULT_SIZES["batch"]}, "repeats": 20,
                "lengths": None, "bidirectional": False, "precision": "fp32"},
}
# The sequence lengths: every batch row runs all T steps, or each row to a length of its own drawn uniformly
# from LOW to HIGH (BenchConfig.lengths, the command line's --lengths uniform:LOW-HIGH).
LENGTHS_ALL = "all T steps"
LENGTHS_UNIFORM = "uniform"
LENGTHS_TIP = ("Each batch row runs all T steps, or, with uniform, to a length of its own drawn from LOW to "
               "HIGH (both included, from 1 to at most T): the cell is rewritten to stop each row there")
# Both directions of the layer side by side (BenchConfig.bidirectional, the command line's --bidirectional).
BIDIRECTIONAL_TEXT = "Bidirectional"
BIDIRECTIONAL_TIP = ("Both directions of one layer side by side, each with weights of its own (the reverse "
                     "one over each row reversed in time); one layer only")
ONE_DIRECTION = "one direction"
# What every plan is made in and every baseline runs in (BenchConfig.precision, the command line's
# --precision), forward and in training.
PRECISION_TEXT = "Precision"
PRECISION_TIP = ("fp32 runs in float32. bf16 and fp16 store x, the weights, the outputs and the states in 16 "
                 "bits and multiply on tensor cores into float32, the gradients in float32; each result is "
                 "checked against the float64 reference within the precision's bound "
                 f"({', '.join(f'{p} {forward_tolerance(p):.1e}' for p in PRECISIONS if p != 'fp32')} of "
                 "the largest value forward, "
                 f"{', '.join(f'{p} {gradient_tolerance(p):.1e}' for p in PRECISIONS if p != 'fp32')} of "
                 "each gradient's in training)")
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
        """Every setting in one grid of three rows, and in a fourth the precision under the repeats and the
        directions' box under the lengths: the dock is wide and short (at 1366x768 it has room for about
        four rows beside the run bar). The schedules and baselines are ticked in drop-down lists, each a
        button that says what is ticked."""
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
        add(2, 3, "Lengths", self._build_lengths())
        # Under the lengths, in a row of its own: beside them it made the grid wider than the dock at
        # 1280x720. Across the label's column too: its text is its label.
        grid.addWidget(self._build_bidirectional(), SIZE_ROWS, 2 * 3, 1, 2)
        # In the same row, under the backend and repeats: the grid grows no wider and no taller.
        add(SIZE_ROWS, 2, PRECISION_TEXT, self._build_precision())
        grid.setColumnStretch(grid.columnCount(), 1)
        grid.setRowStretch(grid.rowCount(), 1)

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

    def _build_lengths(self) -> QtWidgets.QToolButton:
        """The sequence lengths, a button like the schedules' and baselines' (the grid has no width left at
        1280x720) whose drop-down offers all T steps or uniform from LOW to HIGH. Checked as they change:
        a range that does not fit the sequence marks the button and its boxes, and the status says why."""
        button = QtWidgets.QToolButton()
        button.setPopupMode(QtWidgets.QToolButton.ToolButtonPopupMode.InstantPopup)
        button.setToolButtonStyle(QtCore.Qt.ToolButtonStyle.ToolButtonTextOnly)
        button.setMinimumWidth(button.fontMetrics().horizontalAdvance("10–100") + 36)
        self.lengths_button = button
        form = QtWidgets.QWidget()
        col = QtWidgets.QVBoxLayout(form)
        col.setContentsMargins(8, 6, 8, 6)
        heading = QtWidgets.QLabel("Sequence lengths")
        heading.setProperty("role", "heading")
        heading.setToolTip(LENGTHS_TIP)
        self.lengths_all = QtWidgets.QRadioButton(LENGTHS_ALL)
        self.lengths_all.setToolTip("Every batch row runs the whole sequence")
        self.lengths_uniform = QtWidgets.QRadioButton(f"{LENGTHS_UNIFORM} from")
        self.lengths_uniform.setToolTip("Each batch row runs to a length of its own, drawn uniformly from "
                                        "LOW to HIGH (both included) with the seed")
        self.lengths_all.setChecked(True)
        self.lengths_low, self.lengths_high = QtWidgets.QSpinBox(), QtWidgets.QSpinBox()
        for spin, value, what in ((self.lengths_low, 1, "LOW: the shortest"),
                                  (self.lengths_high, DEFAULT_SIZES["seq"], "HIGH: the longest")):
            spin.setRange(1, 1 << 16)
            spin.setValue(value)
            spin.setAccelerated(True)
            spin.setEnabled(False)
            spin.setProperty("hint", f"{what} length a row runs to, in steps, from 1 to T")
            spin.setToolTip(spin.property("hint"))
            spin.valueChanged.connect(self._check_lengths)
        self.lengths_error = QtWidgets.QLabel()
        self.lengths_error.setProperty("role", "error")
        self.lengths_error.setWordWrap(True)
        self.lengths_error.setMaximumWidth(320)
        self.lengths_error.hide()
        uniform = QtWidgets.QHBoxLayout()
        uniform.setSpacing(4)
        uniform.addWidget(self.lengths_uniform)
        uniform.addWidget(self.lengths_low)
        uniform.addWidget(QtWidgets.QLabel("to"))
        uniform.addWidget(self.lengths_high)
        col.addWidget(heading)
        col.addWidget(self.lengths_all)
        col.addLayout(uniform)
        col.addWidget(self.lengths_error)
        menu = QtWidgets.QMenu(button)
        action = QtWidgets.QWidgetAction(menu)
        action.setDefaultWidget(form)
        menu.addAction(action)
        button.setMenu(menu)
        self._lengths_refused = False
        self.lengths_uniform.toggled.connect(self._lengths_mode_changed)
        self.size_spins["seq"].valueChanged.connect(self._check_lengths)
        self.sweep_combo.currentTextChanged.connect(self._check_lengths)
        self.sweep_values.textChanged.connect(self._check_lengths)
        self._check_lengths()
        return button

    def _lengths_mode_changed(self, uniform: bool) -> None:
        for spin in (self.lengths_low, self.lengths_high):
            spin.setEnabled(uniform)
        if uniform:  # a range that fits the sequence as it is now, where the one kept does not
            seq = self._longest_length()
            if self.lengths_high.value() > seq:
                self.lengths_high.setValue(seq)
            if self.lengths_low.value() > self.lengths_high.value():
                self.lengths_low.setValue(self.lengths_high.value())
        self._check_lengths()

    def _check_lengths(self) -> None:
        """The button says the lengths chosen; while the range cannot run, it and the range's boxes are
        marked, and the status line and the drop-down say why; once it can again, the status says so."""
        why = self.lengths_problem()
        bounds = self.lengths_range()
        button = self.lengths_button
        button.setText("all T" if bounds is None else f"{bounds[0]}–{bounds[1]}")
        chosen = self.lengths_text() or "every batch row runs all T steps"
        button.setToolTip(why or f"Sequence lengths: {chosen}. Click to choose.")
        for widget in (button, self.lengths_low, self.lengths_high):
            widget.setProperty("invalid", why is not None)
            widget.style().unpolish(widget)
            widget.style().polish(widget)
        for spin in (self.lengths_low, self.lengths_high):
            spin.setToolTip(why or spin.property("hint"))
        self.lengths_error.setText(why or "")
        self.lengths_error.setVisible(why is not None)
        if why is not None:
            self.show_status(why)
        elif self._lengths_refused:
            text = self.lengths_text()
            self.show_status(f"Sequence lengths: {text}." if text else "Sequence lengths: all T steps.")
        self._lengths_refused = why is not None

    def _build_bidirectional(self) -> QtWidgets.QCheckBox:
        """Both directions of the layer, checked as the layers change, as the lengths are: with more than
        one layer (the spin box's, or in a sweep of layers its largest) the box is marked and the status and
        its tooltip say why; the window refuses to run it."""
        check = QtWidgets.QCheckBox(BIDIRECTIONAL_TEXT)
        check.setToolTip(BIDIRECTIONAL_TIP)
        self.bidirectional_check = check
        self._bidirectional_refused = False
        check.toggled.connect(self._check_bidirectional)
        self.size_spins["layers"].valueChanged.connect(self._check_bidirectional)
        self.sweep_combo.currentTextChanged.connect(self._check_bidirectional)
        self.sweep_values.textChanged.connect(self._check_bidirectional)
        return check

    def _check_bidirectional(self) -> None:
        """The box marked while it cannot run, the status and its tooltip saying why; once it can again,
        the status says so."""
        why = self.bidirectional_problem()
        check = self.bidirectional_check
        check.setToolTip(why or BIDIRECTIONAL_TIP)
        check.setProperty("invalid", why is not None)
        check.style().unpolish(check)
        check.style().polish(check)
        if why is not None:
            self.show_status(why)
        elif self._bidirectional_refused:
            self.show_status("Both directions of the layer, side by side." if self.bidirectional()
                             else "One direction of the layer.")
        self._bidirectional_refused = why is not None

    def _build_precision(self) -> QtWidgets.QComboBox:
        """The precision, fp32 first (as the panel opens), forward and in training alike."""
        combo = QtWidgets.QComboBox()
        combo.addItems(list(PRECISIONS))
        combo.setCurrentText("fp32")
        combo.setToolTip(PRECISION_TIP)
        combo.setAccessibleName(PRECISION_TEXT)
        self.precision_combo = combo
        return combo

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

    def _longest_length(self) -> int:
        """The longest length a row may run to: T, or in a sweep of T its shortest value."""
        seq = self.sizes().seq
        try:
            sweep = self.sweep()
        except ValueError:
            return seq
        if sweep is not None and sweep[0] == "seq":
            return min(sweep[1])
        return seq

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
        if "lengths" in preset and preset["lengths"] is None:
            parts.append(LENGTHS_ALL)
        if preset.get("bidirectional") is False:
            parts.append(ONE_DIRECTION)
        if "precision" in preset:
            parts.append(preset["precision"])
        return ", ".join(parts)

    def apply_preset(self, name: str) -> None:
        """Sets the sizes, repeats, backend, sequence lengths, directions and precision of preset `name` (the
        others stay as they are)."""
        preset = PRESETS[name]
        if "lengths" in preset:  # first: a range kept would not fit a shorter sequence
            self.set_lengths(preset["lengths"])
        if "bidirectional" in preset:
            self.bidirectional_check.setChecked(preset["bidirectional"])
        if "precision" in preset:
            self.precision_combo.setCurrentText(preset["precision"])
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

    def lengths_range(self) -> tuple[int, int] | None:
        """(LOW, HIGH) where each row runs to a length of its own, None where every row runs all T steps."""
        if not self.lengths_uniform.isChecked():
            return None
        return self.lengths_low.value(), self.lengths_high.value()

    def set_lengths(self, lengths: tuple[int, int] | None) -> None:
        """All T steps (None), or each row to its own length from LOW to HIGH."""
        if lengths is not None:
            self.lengths_low.setValue(lengths[0])
            self.lengths_high.setValue(lengths[1])
        (self.lengths_all if lengths is None else self.lengths_uniform).setChecked(True)
        self._check_lengths()

    def lengths(self) -> str | None:
        """BenchConfig.lengths: "uniform:LOW-HIGH", or None for all T steps."""
        bounds = self.lengths_range()
        return None if bounds is None else f"uniform:{bounds[0]}-{bounds[1]}"

    def lengths_text(self) -> str:
        """'each row runs 2 to 6 of T=6 steps', or '' for all T steps."""
        bounds = self.lengths_range()
        if bounds is None:
            return ""
        return f"each row runs {bounds[0]} to {bounds[1]} of T={self._longest_length()} steps"

    def lengths_problem(self) -> str | None:
        """Why the range of lengths cannot run, or None (also for all T steps): LOW no more than HIGH,
        HIGH no more than the sequence's length (in a sweep of T, its shortest)."""
        bounds = self.lengths_range()
        if bounds is None:
            return None
        low, high = bounds
        if low > high:
            return f"Sequence lengths {low}–{high}: LOW is more than HIGH; make LOW at most HIGH."
        seq = self._longest_length()
        if high > seq:
            where = (f"the shortest sequence of the sweep, T={seq}" if seq != self.sizes().seq
                     else f"the sequence, T={seq}")
            return (f"Sequence lengths {low}–{high}: HIGH is longer than {where}; a row runs at most T "
                    f"steps, make HIGH at most {seq}.")
        return None

    def bidirectional(self) -> bool:
        """BenchConfig.bidirectional: both directions of the layer side by side."""
        return self.bidirectional_check.isChecked()

    def bidirectional_problem(self) -> str | None:
        """Why both directions cannot run, or None (also for one direction): the bench runs both directions
        of one layer only (a stack of bidirectional layers runs through cellfuse.nn)."""
        if not self.bidirectional():
            return None
        try:
            sweep = self.sweep()
        except ValueError:  # said when Run is pressed; the spin box's layers meanwhile
            sweep = None
        if sweep is not None and sweep[0] == "layers":
            layers = max(sweep[1])
            of, fix = f"the sweep's L={layers}", "sweep another size (or only L=1)"
        else:
            layers = self.sizes().layers
            of, fix = str(layers), "make Layers L 1"
        if layers == 1:
            return None
        return (f"Bidirectional runs one layer, not {of}: {fix}, or untick Bidirectional. A stack of "
                "bidirectional layers runs through cellfuse.nn (CellRNN(..., bidirectional=True)).")

    def precision(self) -> str:
        """BenchConfig.precision: fp32, bf16 or fp16."""
        return self.precision_combo.currentText()

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
