"""The benchmark panel's Precision choice: fp32, or bf16 and fp16 (16-bit storage, tensor cores into
float32; the command line's --precision), in training too; a run names its precision, and two runs of
different precisions are charted side by side, each named with its own."""

from __future__ import annotations

import datetime as dt

from bench_setup import one_quick_numpy_rung
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from PySide6 import QtCore

from cellfuse.app.bench_charts import draw_comparison, draw_themed
from cellfuse.app.bench_runs import BenchRun, comparison_rows
from cellfuse.codegen.precision import forward_tolerance, gradient_tolerance
from cellfuse.gpu_runtime.bench import BenchResult, BenchRow
from cellfuse.graph_model import Sizes

TIMEOUT_MS = 60_000
SMALL = {"seq": 3, "batch": 2, "input": 4, "hidden": 4, "layers": 1}


def run(qtbot, window) -> BenchRun:
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS) as blocker:
        window.actions_.benchmark.trigger()
        assert window.worker is not None
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    assert blocker.args[0] is not None, window.bench_panel.status.text()
    return blocker.args[0]


def test_the_choice_gives_the_benchmark_its_precision(qtbot, window):
    panel = window.bench_panel
    combo = panel.precision_combo
    assert [combo.itemText(i) for i in range(combo.count())] == ["fp32", "bf16", "fp16"]
    assert combo.currentText() == "fp32" and window.bench_config().precision == "fp32"  # as before
    assert combo.isVisibleTo(panel)
    tip = combo.toolTip()
    assert "16 bits" in tip and "tensor cores into float32" in tip and "the gradients in float32" in tip
    assert "float64 reference within the precision's bound" in tip
    assert f"bf16 {forward_tolerance('bf16'):.1e}" in tip
    # Under Repeats, in its column, beside Bidirectional: the grid grows no wider.
    repeats, bidirectional = panel.repeats_spin.geometry(), panel.bidirectional_check.geometry()
    assert combo.y() >= repeats.bottom() and combo.x() == repeats.x()
    assert combo.geometry().right() < bidirectional.x() and abs(combo.y() - bidirectional.y()) < 8

    # Reached with Tab and chosen with the arrow keys.
    assert combo.focusPolicy() & QtCore.Qt.FocusPolicy.TabFocus
    qtbot.keyClick(combo, QtCore.Qt.Key.Key_Down)
    assert panel.precision() == "bf16" and window.bench_config().precision == "bf16"
    qtbot.keyClick(combo, QtCore.Qt.Key.Key_Down)
    assert window.bench_config().precision == "fp16"
    assert not combo.property("invalid")

    # The presets run in float32, as the panel opens.
    (quick,) = [a for a in panel.preset_button.menu().actions() if a.text().startswith("Quick CPU")]
    assert quick.text().endswith("fp32")
    quick.trigger()
    assert window.bench_config().precision == "fp32"


def test_training_runs_in_16_bits_too_and_says_its_bound(qtbot, window):
    panel = window.bench_panel
    one_quick_numpy_rung(panel, SMALL)
    for name, check in panel.schedule_checks.items():
        check.setChecked(name == "graph")
    panel.train_check.setChecked(True)
    panel.precision_combo.setCurrentText("bf16")
    assert not panel.precision_combo.property("invalid")
    config = window.bench_config()
    assert config.train and config.precision == "bf16"
    bf16 = run(qtbot, window)
    graph = bf16.result.row("graph")
    assert bf16.train and bf16.result.precision == "bf16"
    # its gradients rounded, and within the bound of 16-bit gradients
    assert graph.ok and 1e-4 < graph.rel_error < gradient_tolerance("bf16")
    assert f"within {gradient_tolerance('bf16'):.1e} of each one's largest value" in bf16.precision_text()
    assert "forward only" not in panel.precision_combo.toolTip()
    assert f"bf16 {gradient_tolerance('bf16'):.1e}" in panel.precision_combo.toolTip()


def test_a_bf16_run_says_so_and_is_charted_beside_an_fp32_run(qtbot, qapp, window, chart_problems):
    panel = window.bench_panel
    one_quick_numpy_rung(panel, SMALL)
    for name, check in panel.schedule_checks.items():
        check.setChecked(name == "graph")
    panel.precision_combo.setCurrentText("bf16")
    bf16 = run(qtbot, window)
    assert bf16.result.precision == "bf16" and bf16.precision == "bf16"
    assert bf16.to_json()["precision"] == "bf16"
    graph = bf16.result.row("graph")
    assert graph.ok and 0.0 < graph.rel_error < forward_tolerance("bf16")  # rounded, and within the bound
    assert [cells[0] for cells in panel.table_text()] == ["graph"]

    item = panel.history.item(0)
    assert " · numpy · bf16 · T3 B2 in4 h4 L1 · " in item.text()
    assert "In bf16: stored in 16 bits and multiplied on tensor cores into float32" in item.toolTip()
    status = panel.status.text()
    assert "in bf16: stored in 16 bits" in status
    assert ", in bf16" in panel.figure._suptitle.get_text()

    # The same cell and sizes in fp32; then both side by side, each named with its precision.
    panel.precision_combo.setCurrentText("fp32")
    fp32 = run(qtbot, window)
    assert fp32.result.precision == "fp32" and "fp32" not in panel.history.item(1).text()
    panel.history.item(0).setSelected(True)  # a Ctrl+click: beside the bf16 run
    qapp.processEvents()
    assert panel.selected_runs() == [bf16, fp32]
    fig = panel.figure
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts == [bf16.label(precision=True), fp32.label(precision=True)]
    assert " · bf16 · " in texts[0] and " · fp32 · " in texts[1]
    assert legend.get_title().get_text().startswith("Run #1 in bf16 and run #2 in fp32")
    columns = [panel.table.horizontalHeaderItem(j).text() for j in range(panel.table.columnCount())]
    assert columns == ["Implementation", "#1 ms, bf16", "#2 ms, fp32", "#2 / #1"]
    ((name, _, _, ratio),) = panel.table_text()
    assert name == "graph" and ratio.endswith("×")  # timed in both
    panel.results.canvas.draw()
    assert not chart_problems(fig)


def fake_run(number: int, precision: str) -> BenchRun:
    rows = [BenchRow("graph", "schedule", True, 10.0, 9.9, 10.1),
            BenchRow("tensor", "schedule", True, 4.0, 3.9, 4.1)]
    result = BenchResult("LSTM", "", Sizes(**SMALL), "numpy", "CPU", "", {}, rows, precision=precision)
    return BenchRun(number, result, started=dt.datetime(2024, 5, 1, 12, 0, 0))


def test_runs_of_one_precision_are_named_as_before_and_of_two_each_by_its_own(chart_problems):
    one, other = fake_run(1, "fp32"), fake_run(2, "fp16")
    assert one.label() == "#1 LSTM · numpy · T3 B2 in4 h4 L1 · 12:00:00" and one.precision_text() == ""
    assert other.label() == "#2 LSTM · numpy · fp16 · T3 B2 in4 h4 L1 · 12:00:00"
    assert one.label(precision=True) == "#1 LSTM · numpy · fp32 · T3 B2 in4 h4 L1 · 12:00:00"
    assert f"{forward_tolerance('fp16'):.1e}" in other.precision_text()

    fig = Figure(figsize=(7.5, 3.4), dpi=100)
    FigureCanvasAgg(fig)
    draw_themed(lambda f: draw_comparison(one, other, f), fig, dark=True)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [one.label(precision=True), other.label()]
    assert legend.get_title().get_text().startswith("Run #1 in fp32 and run #2 in fp16: median time")
    assert not chart_problems(fig)
    columns, rows = comparison_rows(one, other)
    assert columns[1:3] == ["#1 ms, fp32", "#2 ms, fp16"]
    assert [cells for cells, _ in rows] == [["graph", "10", "10", "1.00×"], ["tensor", "4", "4", "1.00×"]]

    # Two runs of one precision: named as before, without it.
    again = fake_run(3, "fp16")
    draw_themed(lambda f: draw_comparison(other, again, f), fig, dark=True)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [other.label(), again.label()]
    assert legend.get_title().get_text().startswith("Run #2 and run #3: median time")
    assert comparison_rows(other, again)[0][1:3] == ["#2 ms", "#3 ms"]


def test_a_schedule_left_out_in_a_precision_is_listed_as_a_schedule(window):
    """A rung that runs in float32 only so far is left out of a 16-bit run with the reason, listed with
    the schedules and said in the status, apart from the baselines that are not here."""
    panel = window.bench_panel
    run_ = fake_run(1, "bf16")
    why = "the 'persistent' rung multiplies on CUDA cores in float32"
    run_.result.left_out = {"persistent": why, "cudnn": "not available: no GPU/PyTorch on the numpy backend"}
    window._run_number = 0
    window._bench_succeeded(run_.result)
    rows = {cells[0]: cells for cells in panel.table_text()}
    assert rows["persistent"][1] == "schedule" and rows["persistent"][-1] == why
    assert rows["cudnn"][1] == "baseline"
    status = panel.status.text()
    assert "not available here: cudnn" in status and "not run in bf16: persistent" in status
