"""The benchmark panel, run for real on the numpy backend at tiny sizes."""

from __future__ import annotations

import json
import math

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from cellfuse.app.bench_charts import RUN_COLORS, draw_comparison, draw_themed
from cellfuse.app.bench_runs import BenchRun, implementations, median_ms, ratio_text
from cellfuse.codegen import SCHEDULES
from cellfuse.gpu_runtime.bench import BenchResult, BenchRow
from cellfuse.graph_model import Sizes

TIMEOUT_MS = 60_000
TINY = {"seq": 4, "batch": 2, "input": 8, "hidden": 8, "layers": 1}


def bars(figure) -> int:
    return sum(len(ax.patches) for ax in figure.axes)


def run(qtbot, window):
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS) as blocker:
        window.actions_.benchmark.trigger()  # F5
        assert window.worker is not None and window.worker.isRunning()
        assert window.bench_panel.cancel_button.isEnabled() and not window.bench_panel.run_button.isEnabled()
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    return blocker.args[0]


def test_numpy_benchmark_draws_a_chart_and_a_table(qtbot, window):
    panel = window.bench_panel
    panel.set_sizes(**TINY)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(2)
    assert window.actions_.benchmark.shortcut().toString() == "F5"
    result = run(qtbot, window)
    assert result is not None and result.result.backend == "numpy"
    assert bars(panel.figure) >= len(SCHEDULES)
    assert any("numpy backend" in t.get_text() for t in panel.figure.texts)  # says it is not a GPU
    rows = panel.table_text()
    names = [r[0] for r in rows]
    assert set(SCHEDULES) <= set(names) and "numpy reference" in names
    errors = {r[0]: r[5] for r in rows}
    assert all(float(errors[s]) < 1e-4 for s in SCHEDULES)  # each checked against the reference
    assert panel.history.count() == 1
    assert "numpy" in panel.status.text() or "CPU" in panel.status.text()
    assert panel.run_button.isEnabled() and not panel.cancel_button.isEnabled()
    if panel.backend_combo.findText("cuda") < 0:
        assert "No GPU" in panel.backend_note.text()


@pytest.mark.slow
def test_runs_are_kept_and_two_can_be_compared(qtbot, window):
    panel = window.bench_panel
    panel.set_sizes(**TINY)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    for check in panel.baseline_checks.values():
        check.setChecked(False)
    run(qtbot, window)
    panel.set_sizes(hidden=16)
    run(qtbot, window)
    assert panel.history.count() == 2
    assert "h16" in panel.history.item(1).text()
    panel.history.item(0).setSelected(True)
    panel.history.item(1).setSelected(True)
    assert panel.table.horizontalHeaderItem(1).text() == "#1 ms"
    assert panel.table.horizontalHeaderItem(3).text() == "#2 / #1"
    assert bars(panel.figure) >= 2 * len(SCHEDULES)
    panel.history.clearSelection()
    panel.history.item(0).setSelected(True)
    assert panel.table.horizontalHeaderItem(0).text() == "Implementation"


@pytest.mark.slow
def test_chart_and_results_export(qtbot, window, answers, tmp_path):
    panel = window.bench_panel
    panel.set_sizes(**TINY)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    run(qtbot, window)
    for name in ("chart.png", "chart.svg"):
        answers.save_path = tmp_path / name
        panel.export_chart_button.click()
        assert answers.save_path.stat().st_size > 1000
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    assert b"<svg" in (tmp_path / "chart.svg").read_bytes()[:400]
    answers.save_path = tmp_path / "results.json"
    panel.export_results_button.click()
    data = json.loads(answers.save_path.read_text())
    assert data["backend"] == "numpy" and {r["name"] for r in data["results"]} >= set(SCHEDULES)
    assert data["precision"] == "fp32"
    answers.save_path = tmp_path / "results.csv"
    panel.export_results_button.click()
    lines = answers.save_path.read_text().splitlines()
    assert lines[0].startswith("cell,device,precision,name") and len(lines) > len(SCHEDULES)


@pytest.mark.slow
def test_sweep(qtbot, window, tmp_path):
    panel = window.bench_panel
    panel.set_sizes(**TINY)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    for name, check in panel.schedule_checks.items():
        check.setChecked(name in ("naive", "hoisted"))
    panel.sweep_combo.setCurrentText("seq")
    panel.sweep_values.setText("2, 4")
    result = run(qtbot, window)
    assert result.sweep is not None and result.sweep.values == [2, 4]
    assert any(ax.lines for ax in panel.figure.axes)
    rows = panel.table_text()
    assert panel.table.horizontalHeaderItem(0).text() == "seq"
    assert {r[0] for r in rows} == {"2", "4"}
    assert window.export_results(tmp_path / "sweep.csv")
    assert (tmp_path / "sweep.csv").read_text().startswith("seq,cell,device")


@pytest.mark.slow
def test_cancel_stops_the_run_and_the_window_stays_responsive(qtbot, window):
    panel = window.bench_panel
    panel.set_sizes(seq=400, batch=16, input=64, hidden=64, layers=2)
    panel.backend_combo.setCurrentText("numpy")
    with qtbot.waitSignal(window.bench_finished, timeout=TIMEOUT_MS) as blocker:
        window.actions_.benchmark.trigger()
        # The GUI thread is free while the worker runs: edits still go through.
        node = window.adapter.add_node("relu")
        assert window.cell.has(node)
        assert window.actions_.cancel.isEnabled()
        panel.cancel_button.click()
    qtbot.waitUntil(lambda: window.worker is None, timeout=TIMEOUT_MS)
    run_ = blocker.args[0]
    if run_ is None:  # cancelled before anything was timed: no run, and the status says so
        assert "Cancelled before anything was timed" in panel.status.text()
    else:
        assert run_.result.cancelled and "cancelled" in panel.status.text()
    assert panel.run_button.isEnabled() and not window.actions_.cancel.isEnabled()


def test_an_invalid_cell_is_not_run(window):
    window.adapter.disconnect("h_new", "b")
    assert not window.run_benchmark()
    assert "Fix the 1 error" in window.bench_panel.status.text()
    assert window.worker is None


@pytest.mark.slow
def test_two_earlier_runs_are_drawn_side_by_side_with_their_ratio(qtbot, qapp, window, chart_problems):
    window.resize(1366, 768)
    window.arrange_docks()
    panel = window.bench_panel
    panel.set_sizes(**TINY)
    panel.backend_combo.setCurrentText("numpy")
    panel.repeats_spin.setValue(1)
    for sizes in ({}, {"hidden": 16}, {"seq": 8}):
        panel.set_sizes(**sizes)
        run(qtbot, window)
    first, _, second = panel.runs
    panel.history.clearSelection()
    panel.history.item(2).setSelected(True)
    panel.history.item(0).setSelected(True)
    qapp.processEvents()
    assert panel.selected_runs() == [first, second]

    fig = panel.figure
    ax_time, ax_ratio = [ax for ax in fig.axes if ax.axison]
    names = implementations(first, second)
    common = [n for n in names if median_ms(first, n) and median_ms(second, n)]
    assert set(SCHEDULES) <= set(common)
    # Both runs' bars on the one time axis, each implementation's pair side by side.
    for k, run_ in enumerate((first, second)):
        color = to_rgba(RUN_COLORS[k])
        for name in common:
            centre = names.index(name) + (k - 0.5) * 0.38
            bar = [p for p in ax_time.patches if p.get_facecolor() == color
                   and abs(p.get_y() + p.get_height() / 2 - centre) < 1e-9]
            assert len(bar) == 1 and bar[0].get_width() == median_ms(run_, name), (name, k)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [first.label(), second.label()]
    assert "#3 / #1" in legend.get_title().get_text()
    # The ratio, second / first, written by each implementation's bar.
    written = {round(t.get_position()[1]): t.get_text().strip() for t in ax_ratio.texts}
    for name in common:
        ratio = median_ms(second, name) / median_ms(first, name)
        assert written[names.index(name)] == ratio_text(ratio), name
        row = names.index(name)
        (bar,) = [p for p in ax_ratio.patches if abs(p.get_y() + p.get_height() / 2 - row) < 1e-9]
        assert bar.get_x() == 1.0 and math.isclose(1.0 + bar.get_width(), ratio), name  # a bar from 1
    assert ax_ratio.get_xlabel() == f"time of #{second.number} / time of #{first.number}"
    assert panel.table.horizontalHeaderItem(3).text() == "#3 / #1"
    assert not chart_problems(fig)


def single_run(number: int, times: dict[str, float | None]) -> BenchRun:
    rows = [BenchRow(name, "schedule" if name in SCHEDULES else "baseline", t is not None, t)
            for name, t in times.items()]
    return BenchRun(number, BenchResult("LSTM", "", Sizes(4, 2, 8, 8, 1), "numpy", "CPU", "", {}, rows))


def test_a_comparison_of_far_apart_times_keeps_every_label_inside(chart_problems):
    """Times three decades apart, ratios from 1/50 to 300, an implementation timed in one run only."""
    first = single_run(1, {"naive": 2.0, "hoisted": 500.0, "graph": 0.01, "pytorch eager": 1.0})
    second = single_run(2, {"naive": 600.0, "hoisted": 10.0, "graph": 0.012, "pytorch eager": None})
    fig = Figure(figsize=(7.5, 3.4), dpi=100)
    FigureCanvasAgg(fig)
    draw_themed(lambda f: draw_comparison(first, second, f), fig, dark=True)
    ax_time, ax_ratio = fig.axes
    assert ax_time.get_xscale() == "log" and ax_ratio.get_xscale() == "log"
    written = [t.get_text().strip() for t in ax_ratio.texts]
    assert written == ["300×", "0.02×", "1.20×", "not timed in both"]
    assert not chart_problems(fig)


def test_cancel_benchmark_is_offered_only_while_one_runs_and_a_run_cancelled_early_adds_nothing(window):
    from cellfuse.gpu_runtime.bench import BenchResult

    assert not window.actions_.cancel.isEnabled()
    before = len(window.bench_panel.runs)
    empty = BenchResult.__new__(BenchResult)
    empty.rows, empty.cancelled = [], True
    window._bench_succeeded(empty)
    assert len(window.bench_panel.runs) == before
    assert "Cancelled before anything was timed" in window.bench_panel.status.text()


def spread_run(number: int, times: dict[str, tuple[float, float, float]], train: bool = False) -> BenchRun:
    """A run whose rows have (median, min, max) times."""
    rows = [BenchRow(name, "schedule" if name in SCHEDULES else "baseline", True, med, lo, hi)
            for name, (med, lo, hi) in times.items()]
    return BenchRun(number, BenchResult("LSTM", "", Sizes(4, 2, 8, 8, 1), "numpy", "CPU", "", {}, rows,
                                        train=train))


def test_a_comparison_writes_each_value_clear_of_every_bar(chart_problems):
    # Many implementations on a short chart, the second run's bars longer: each value used to be written
    # at the end of its own bar, over its neighbour's.
    names = [*SCHEDULES, "numpy reference", "pytorch eager"]
    first = single_run(1, {n: 1.0 + i for i, n in enumerate(names)})
    second = single_run(2, {n: 3.0 + 2 * i for i, n in enumerate(names)})
    fig = Figure(figsize=(7.5, 3.4), dpi=100)
    FigureCanvasAgg(fig)
    draw_themed(lambda f: draw_comparison(first, second, f), fig, dark=True)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax_time = fig.axes[0]
    bars_px = [p.get_window_extent(renderer) for p in ax_time.patches]
    for text in ax_time.texts:
        box = text.get_window_extent(renderer)
        # a value may start where a bar ends (a pixel's rounding), not over it
        hit = [bar for bar in bars_px if box.x0 < bar.x1 - 1.0 and bar.x0 < box.x1 and box.y0 < bar.y1
               and bar.y0 < box.y1]
        assert not hit, text.get_text()
    assert not chart_problems(fig)


def test_noisy_times_are_flagged_beside_their_speedup_and_ratio(chart_problems):
    from cellfuse.app.bench_charts import draw_run
    from cellfuse.app.bench_runs import comparison_rows, result_rows

    steady = {"naive": (10.0, 9.8, 10.3), "hoisted": (2.0, 1.9, 2.1)}
    rough = {"naive": (10.0, 9.8, 10.3), "hoisted": (8.0, 4.0, 13.0)}  # 4 to 13: the spread of a busy CPU
    fig = Figure(figsize=(7.5, 3.4), dpi=100)
    FigureCanvasAgg(fig)
    draw_themed(lambda f: draw_run(spread_run(1, rough), f), fig, dark=True)
    written = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("x" in w and "(noisy)" in w for w in written)  # beside hoisted's speedup
    assert sum("(noisy)" in w for w in written) == 1  # naive's times are steady
    assert not chart_problems(fig)
    notes = {cells[0]: cells[-1] for cells, _ok in result_rows(spread_run(1, rough).result)}
    assert notes["hoisted"].startswith("noisy: 4–13 ms") and notes["naive"] == ""
    _columns, rows = comparison_rows(spread_run(1, steady), spread_run(2, rough))
    assert {cells[0]: cells[-1] for cells, _ok in rows} == {"naive": "1.00×", "hoisted": "4.00× (noisy)"}


def test_runs_that_cannot_be_compared_say_why_in_the_status_bar(window):
    panel = window.bench_panel
    times = {"naive": (10.0, 9.8, 10.3)}
    for run_ in (spread_run(1, times), spread_run(2, times, train=True)):
        panel.add_run(run_)
    panel.history.item(0).setSelected(True)  # a Ctrl+click: the forward run beside the training one
    assert "do not compare" in window.statusBar().currentMessage()
    assert "do not compare" in panel.table_text()[0][0]


def test_the_quick_cpu_preset_sets_a_short_sequence_and_few_repeats(window):
    panel = window.bench_panel
    (quick,) = [a for a in panel.preset_button.menu().actions() if a.text().startswith("Quick CPU")]
    quick.trigger()
    assert panel.sizes().seq <= 10 and panel.repeats() <= 3 and panel.backend() == "numpy"
    assert "Quick CPU" in panel.status.text()
